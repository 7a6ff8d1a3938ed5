-- The sink's inboxes are read by a session token the sink listing hands out (only where the HTTP face
-- serves it: --sink on a loopback bind, or --sink-public): HMAC-SHA256 of the address under this key,
-- so a token is never stored, only its digest, as for every anonymous inbox. Read only inside
-- SECURITY DEFINER functions (like mailroom.redaction_pepper): no function returns it.
CREATE TABLE mailroom.sink_key (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    key bytea NOT NULL CHECK (octet_length(key) = 32)
);

COMMENT ON TABLE mailroom.sink_key IS
'The key of the sink inboxes'' session tokens (HMAC of the address); returned by no function.';

INSERT INTO mailroom.sink_key (singleton, key)
VALUES (true, gen_random_bytes(32))
ON CONFLICT (singleton) DO NOTHING;

REVOKE ALL ON mailroom.sink_key FROM public;

INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict, http_status) VALUES
(
    'MR295', 'inboxes', 'denied',
    'a sink inbox takes no injected fault: fault injection needs an inbox of an API key (or a session token of its own)',
    null, null, 403
)
ON CONFLICT (code) DO NOTHING;
