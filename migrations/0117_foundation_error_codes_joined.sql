-- The codes that branches developed beside issue 22 raise (the keyring, the HTTP face, sealed relay
-- passwords), as rows of the vocabulary; MR120's meaning follows the keyring.
INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR121', 'accounts', 'not_found', 'no signing key with that id', null, null),
('MR122', 'accounts', 'conflict', 'the active signing key cannot be retired: rotate first', null, null),
('MR123', 'accounts', 'gone', 'a retired signing key''s bytes are gone', null, null),
('MR240', 'inboxes', 'denied', 'credentials required: the inbox''s session token or an API key', null, null),
('MR241', 'inboxes', 'denied', 'unknown or revoked API key', null, null),
('MR242', 'inboxes', 'denied', 'the plan needs an API key (anonymous inboxes get the anonymous plan)', null, null),
('MR243', 'inboxes', 'limit', 'too many mailboxes created in the rate window', null, null),
('MR245', 'inboxes', 'usage', 'a catch-all domain must be a domain name', null, null),
('MR246', 'inboxes', 'usage', 'the search query has no word to search for', null, null),
('MR247', 'inboxes', 'usage', 'an API key digest must be 32 bytes (sha256 of the key)', null, null),
('MR248', 'inboxes', 'not_found', 'no API key with that id', null, null),
('MR250', 'inboxes', 'not_found', 'the message has no attachment with that index', null, null),
('MR319', 'outbound', 'usage', 'an SMTP login over cleartext is allowed only to a relay on this machine', null, null),
('MR324', 'outbound', 'usage', 'not a public key pgcrypto can encrypt to', null, null),
('MR325', 'outbound', 'usage', 'a relay password and its sealed form given together, or sealed for another key', null, null)
ON CONFLICT (code) DO NOTHING;

UPDATE mailroom.error_codes
SET meaning = 'the keyring has no active signing key, or a key given is missing or shorter than 32 bytes'
WHERE code = 'MR120';
