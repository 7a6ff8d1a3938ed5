-- The registry's NOTIFY rule is one function since issue 46: _listened_channels (who may hear, for
-- any number of channels, in one statement) and _notify_each (sql/08_notify.sql). Their one-channel
-- forms of the previous release have no caller left (deliver_message and delete_mailbox call
-- _notify_each): they go, so the rule is not written twice.
DROP FUNCTION IF EXISTS mailroom_internal._notify(text, text);
DROP FUNCTION IF EXISTS mailroom_internal._listened(text);
