-- Issue 27, item 5: attachments on outbound mail.
--
-- A message's attachments travel in its own row (an array of a composite type), so everything
-- that keeps, moves or removes a message (partition drop, purge, the queue verbs, erasure, Citus'
-- shards) takes them along. The sender builds multipart/mixed around the body
-- (driver/mailroom/outbound/message.py). They count against outbound.max_message_bytes.
CREATE TYPE mailroom.outbound_attachment AS (
    name text,
    content_type text,
    content bytea
);

COMMENT ON TYPE mailroom.outbound_attachment IS
'One attachment of an outbound message: file name (no path), MIME content type (type/subtype), bytes.';

ALTER TABLE mailroom.outbound_messages
ADD COLUMN attachments mailroom.outbound_attachment[];

COMMENT ON COLUMN mailroom.outbound_messages.attachments IS
'Attachments, in order (enqueue_message_with_attachments); NULL for a message without any.';

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR385', 'outbound', 'usage', 'attachments must be a JSON array of at most 20 objects with a safe name, a type/subtype and base64 content', null, null)
ON CONFLICT (code) DO NOTHING;

-- _enqueue_message gains p_attachments: the old form goes (an internal function, re-created with
-- its callers by sql/ in this transaction). claim_messages gains the attachments column: its
-- result changes, so it is dropped and re-created by sql/33 (the keyed form on top of it).
DROP FUNCTION IF EXISTS mailroom._enqueue_message(
    text, text, text[], text, text, text, text[], text[], jsonb, text, timestamptz, bigint, integer
);
DROP FUNCTION IF EXISTS mailroom.claim_messages(integer, text, bytea, interval);
DROP FUNCTION IF EXISTS mailroom.claim_messages(integer, text, interval);
DROP FUNCTION IF EXISTS mailroom._claim(timestamptz, integer, text, interval, boolean);
