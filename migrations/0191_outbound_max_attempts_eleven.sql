-- The seed's retry rule (issue 33): "retry up to 10 times", i.e. the first attempt and up to 10
-- retries, 11 attempts in all. outbound.max_attempts counts attempts in all (a transient outcome
-- of attempt number outbound.max_attempts fails the message: _gives_up, sql/34_outbound_finalize.sql),
-- and its default was 10 (one retry short). The default becomes 11. Settings keep no provenance,
-- so a value still at the old default 10 is taken for the default and moved to 11; any other value
-- is an operator's choice and stays (docs/upgrading.md: how to keep 10).
UPDATE mailroom.settings
SET value = '11'
WHERE name = 'outbound.max_attempts' AND value = '10';

UPDATE mailroom.settings
SET
    description = 'Attempts in all before a transiently failing message is failed: the first attempt and '
    || 'up to max_attempts - 1 retries (default 11: the seed''s "retry up to 10 times").'
WHERE name = 'outbound.max_attempts';
