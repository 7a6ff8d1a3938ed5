-- The Reply-To header of an inbound message, parsed as From is (mailroom.inboxes.mime, bounded and
-- cleaned), stored with it and answered by the HTTP API (docs/http.md): the recipe of CONTRIBUTING,
-- "An inbound field exposed over HTTP".
ALTER TABLE mailroom.messages ADD COLUMN IF NOT EXISTS reply_to text;
