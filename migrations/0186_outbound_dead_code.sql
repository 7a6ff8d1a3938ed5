-- Issue 36, item 4: dead code goes. Neither is called by any function of this release (the claim
-- and the bounce checks use the per-recipient forms, the queue verbs the four-argument log line);
-- the previous release's functions that called them are all replaced by the same migrate.
DROP FUNCTION IF EXISTS mailroom._verp_message_id(text);
DROP FUNCTION IF EXISTS mailroom._operator_log(text, timestamptz, text);
