-- The seed's NOTIFY contract (issue 33): tokens.channel (token_insert) always notifies, registered
-- or not, so a plain `LISTEN token_insert` hears every statement that inserts tokens
-- (sql/11_tokens.sql). The registry (mailroom.listen, sql/08_notify.sql) and notify.always now
-- cover deliver_message's channels only: mailroom_inbox and mailroom_delivery. No value changes:
-- an install that had notify.always = false gets the token channel back without a setting, one
-- that had it true keeps notifying the delivery channels until its operator turns it off.
UPDATE mailroom.settings
SET
    description = 'NOTIFY mailroom_inbox and mailroom_delivery (deliver_message) even while no session has '
    || 'registered with mailroom.listen (for listeners of an older release or of your own that do not '
    || 'register). Every other channel, tokens.channel included, always notifies.'
WHERE name = 'notify.always';

UPDATE mailroom.settings
SET
    description = 'NOTIFY channel raised once per statement that inserts tokens, always (no registration); '
    || 'payload = number of tokens.'
WHERE name = 'tokens.channel';
