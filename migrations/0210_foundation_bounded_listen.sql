-- Bounded caller-supplied work (issue 34, item 5): mailroom.await_writers waits at most a minute
-- (MR015; a NULL timeout waited without bound) and mailroom.listen takes 1 to 16 channels (MR016;
-- any array size before). sql/08_notify.sql raises them.
INSERT INTO mailroom.error_codes (code, area, kind, meaning, smtp_reply, verdict) VALUES
('MR015', 'foundation', 'usage', 'await_writers: the timeout must be between 0 and 1 minute', null, null),
('MR016', 'foundation', 'usage', 'listen: between 1 and 16 channels', null, null)
ON CONFLICT (code) DO NOTHING;
