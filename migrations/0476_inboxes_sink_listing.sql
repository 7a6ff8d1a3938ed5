-- The sink's open listing (issue 44 item 1): http_list_mailboxes takes p_sink (the HTTP face's --sink on
-- a loopback bind, or with --sink-public), a defaulted argument at the end, so the previous release's
-- calls resolve to the new form; sql/29_http.sql re-creates it.
DROP FUNCTION IF EXISTS mailroom.http_list_mailboxes(bytea, integer, integer);
