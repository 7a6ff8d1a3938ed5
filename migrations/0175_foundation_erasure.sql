-- Erasure (issue 27, item 6): mailroom.erase_address (sql/07_erasure.sql) removes or anonymizes one
-- address everywhere and keeps only its keyed hash ('erased:<hex>', HMAC-SHA256 under the redaction
-- pepper of migration 0030) in mailroom.suppressions, so the address stays suppressed. No table
-- changes: the hash is a value of suppressions.address that no address can equal (no '@').
INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR006', 'foundation', 'usage', 'the address to erase is not a valid email address', null, null),
(
    'MR007', 'foundation', 'conflict',
    'the address to erase is in the configuration (a sender, a setting or a template): change that first',
    null, null
),
('MR009', 'foundation', 'usage', 'internal: the rollback of an erasure''s dry run (never reaches a caller)', null, null)
ON CONFLICT (code) DO NOTHING;
