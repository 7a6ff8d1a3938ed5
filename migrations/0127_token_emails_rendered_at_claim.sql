-- Issue 21, item 3: no usable link at rest. A token email (enqueue_token_emails) is queued with
-- its token's id and no body; claim_messages renders it, with a freshly minted link and code, at
-- each delivery attempt and returns it to the claiming sender only. Retries, reaped claims and
-- `mailroom outbound retry` therefore each carry a fresh link; nothing in the queue opens an account.

ALTER TABLE mailroom.outbound_messages ADD COLUMN token_id bigint;

COMMENT ON COLUMN mailroom.outbound_messages.token_id IS
'The token of an activation / recovery email (enqueue_token_emails): its bodies are NULL at rest and rendered, '
'with a fresh link, by claim_messages at each delivery attempt.';

-- Token emails queued by the previous release hold rendered bodies with a link and a code:
-- link them to their token and drop the bodies (a queued one is rendered again at its next claim;
-- a sent or failed one keeps no link).
UPDATE mailroom.outbound_messages AS m
SET token_id = substr(m.idempotency_key, 7)::bigint, text_body = null, html_body = null
WHERE m.idempotency_scope = 'mailroom' AND m.idempotency_key ~ '^token:[0-9]{1,18}$';

-- the internal enqueue takes the token id (sql/32_outbound_enqueue.sql)
DROP FUNCTION IF EXISTS mailroom._enqueue_message(
    text, text, text[], text, text, text, text[], text[], jsonb, text, timestamptz
);
