-- Issue 44, item 9: send over HTTP (POST /api/v1/send; sql/32_outbound_send.sql, docs/http.md "Send").
-- An API key sends only through the senders granted to it (`mailroom apikey grant-sender KEY_ID
-- SENDER`): one row here per key and sender; a key without a row sends nothing (MR374). Each send
-- takes one from the key's send.rate_per_key, goes only to addresses of send.allowed_recipients
-- (empty, the default: none; the rate and allow-list mechanism of sql/09_rates.sql, as release) and
-- writes one line of mailroom.audit_log (action send).
CREATE TABLE mailroom.api_key_senders (
    key_id bigint NOT NULL REFERENCES mailroom.api_keys (id) ON DELETE CASCADE,
    sender_id bigint NOT NULL REFERENCES mailroom.senders (id) ON DELETE CASCADE,
    granted_at timestamptz NOT NULL,
    PRIMARY KEY (key_id, sender_id)
);

CREATE INDEX api_key_senders_sender_id_idx ON mailroom.api_key_senders (sender_id);

COMMENT ON TABLE mailroom.api_key_senders IS
'Which outbound senders an API key may send through over HTTP (POST /api/v1/send); no row: the key sends nothing (MR374).';

REVOKE ALL ON mailroom.api_key_senders FROM public;

INSERT INTO mailroom.settings (name, value, description, kind, min_value, max_value)
VALUES
(
    'send.rate_per_key', '60/h',
    'messages an API key may send over HTTP (POST /api/v1/send): "N/min" or "N/h"; over it MR020 (HTTP 429)',
    'rate', null, '1000000'
),
(
    'send.allowed_recipients', '',
    'comma-separated address globs a message sent over HTTP may go to ("*@example.com, qa-*@corp.example"; * is any run of characters); empty: none (MR021)',
    'globs', null, '2000'
),
(
    'send.max_recipients', '10',
    'recipients (To, Cc and Bcc together) of one message sent over HTTP; over it MR377 (HTTP 400)',
    'integer', '1', '1000'
)
ON CONFLICT (name) DO NOTHING;

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
('MR374', 'outbound', 'denied', 'this API key may not send through that sender (no grant: mailroom apikey grant-sender)', null, null, 403),
('MR375', 'outbound', 'usage', 'a send request that is not of the accepted shape (the message names the field)', null, null, 400),
('MR376', 'outbound', 'usage', 'a header value of a send request holds a line break or a control character', null, null, 400),
('MR377', 'outbound', 'usage', 'more recipients than send.max_recipients', null, null, 400),
('MR378', 'outbound', 'not_found', 'no live API key with that id', null, null, 404)
ON CONFLICT (code) DO NOTHING;
