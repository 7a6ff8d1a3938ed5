-- Moving from the original mailroom (issue 33, item 8): mailroom.import_seed_accounts
-- (sql/16_import.sql) refuses a batch it cannot read with MR130.
INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR130', 'accounts', 'usage', 'a seed import batch is malformed (not arrays, a missing field, an unknown status or action, a dispatched token without its digests)', null, null)
ON CONFLICT (code) DO NOTHING;

-- one import at a time (sql/16_import.sql): a row lock only mailroom's functions can take
INSERT INTO mailroom.job_locks (name, description) VALUES
(
    'import_seed_accounts',
    'mailroom.import_seed_accounts(): batches of imports run one at a time (a second waits)'
)
ON CONFLICT (name) DO NOTHING;
