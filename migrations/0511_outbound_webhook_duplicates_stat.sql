-- Webhooks (issue 44, item 8; docs/webhooks.md): outbound_stats() gains a last column,
-- webhook_possible_duplicates (the count outbound_counters keeps of deliveries made again after a lost
-- answer). A result's columns change only by a new function (CREATE OR REPLACE cannot): the view that
-- reads it and the function go here, and sql/35_outbound_admin.sql makes both again in this migrate's
-- transaction, so no caller finds them missing; a caller naming the old columns still gets them.
DROP VIEW IF EXISTS mailroom.outbound_stats;
DROP FUNCTION IF EXISTS mailroom.outbound_stats();
