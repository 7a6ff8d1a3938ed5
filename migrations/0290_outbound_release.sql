-- Issue 35, item 4: release a captured message. An inbox's message, its stored bytes as received
-- with a Resent- block prepended (RFC 5322 section 3.6.6), goes on to a chosen address through one
-- of mailroom's senders and the outbound queue (sql/32_outbound_release.sql), so it is retried,
-- logged and suppressed like any other mail. The queued row keeps those bytes in raw_message: the
-- sender sends them as they are (no message is built from the row's subject and bodies, which are
-- the original's, kept for the operator's view and for a sender of the previous release).
ALTER TABLE mailroom.outbound_messages
ADD COLUMN raw_message bytea;

COMMENT ON COLUMN mailroom.outbound_messages.raw_message IS
'A released message (release_message): the bytes the sender sends as they are (Resent- block and the message as received); NULL: built from the row.';

-- off until the operator names the senders that may release; anonymous inboxes (anyone who can
-- reach the HTTP face made them) are not among the owner types by default
INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value)
VALUES
(
    'release.senders', '',
    'comma-separated senders (mailroom outbound senders) a captured message may be released through; empty: release is off',
    'text', '0', '2000'
),
(
    'release.owner_types', 'api,mcp',
    'comma-separated owner types of the inboxes whose messages may be released (api, mcp, anonymous, app, …)',
    'text', '0', '200'
)
ON CONFLICT (name) DO NOTHING;

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR395', 'outbound', 'denied', 'release is off: the setting release.senders names no sender', null, null),
('MR396', 'outbound', 'denied', 'this sender may not release messages (not in release.senders)', null, null),
('MR397', 'outbound', 'denied', 'messages of this inbox''s owner type may not be released (release.owner_types)', null, null)
ON CONFLICT (code) DO NOTHING;

-- claim_messages gains the raw_message column (its result changes): dropped here, re-created by
-- sql/33 in this transaction (the keyed form on top of it), as migration 0176 did for attachments
DROP FUNCTION IF EXISTS mailroom.claim_messages(integer, text, interval);
DROP FUNCTION IF EXISTS mailroom._claim(timestamptz, integer, text, interval, boolean);

-- issue 36: one owner rule for the HTTP and MCP faces (sql/29_http.sql _http_who); the MCP copy goes
DROP FUNCTION IF EXISTS mailroom._mcp_owner_type(text);

-- a released message too large for the queue is the HTTP face's 413, as a body too large
UPDATE mailroom.error_codes SET http_status = 413
WHERE code = 'MR306' AND http_status IS null;
