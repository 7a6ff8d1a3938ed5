-- Idempotency keys live in a scope: 'app' for the application's messages (enqueue_message),
-- 'mailroom' for the messages mailroom writes itself (activation / recovery emails, key
-- 'token:<id>'). A key is unique within its scope only, so an application message that happens
-- to use the key 'token:<id>' can no longer stand in for (and suppress) that token's email.
ALTER TABLE mailroom.outbound_messages
ADD COLUMN idempotency_scope text NOT NULL DEFAULT 'app'
CONSTRAINT outbound_messages_idempotency_scope_check CHECK (idempotency_scope IN ('app', 'mailroom'));

COMMENT ON COLUMN mailroom.outbound_messages.idempotency_scope IS
'Namespace of idempotency_key: app (enqueue_message) or mailroom (mailroom''s own emails).';

-- Rows already written by enqueue_token_emails: key token:<digits>, sent by the collector's
-- sending identity, one To recipient, no Cc, Bcc or extra headers.
UPDATE mailroom.outbound_messages AS m
SET idempotency_scope = 'mailroom'
FROM mailroom.senders AS s
WHERE
    m.sender_id = s.id
    AND s.name = (
        SELECT t.value FROM mailroom.settings AS t
        WHERE t.name = 'collector.sender'
    )
    AND m.idempotency_key ~ '^token:[0-9]+$'
    AND cardinality(m.to_addrs) = 1
    AND cardinality(m.cc_addrs) = 0
    AND cardinality(m.bcc_addrs) = 0
    AND m.headers = '{}';

DROP INDEX mailroom.outbound_messages_idempotency_key_idx;

CREATE UNIQUE INDEX outbound_messages_idempotency_key_idx
ON mailroom.outbound_messages (idempotency_scope, idempotency_key)
WHERE idempotency_key IS NOT null;

-- show_outbound_message also returns idempotency_scope: a result type cannot change with
-- CREATE OR REPLACE, so the old version goes here and sql/35_outbound_admin.sql creates the new.
DROP FUNCTION IF EXISTS mailroom.show_outbound_message(bigint);
