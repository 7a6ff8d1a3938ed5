-- Every setting declares what its value must be, so set_setting can refuse a bad value with a
-- clear error instead of a worker failing later on a cast: kind, and for some kinds a range.
--   interval  min_value / max_value: bounds, inclusive (an interval each)
--   integer   min_value / max_value: bounds, inclusive
--   number    min_value / max_value: bounds, inclusive (NaN and infinity are refused)
--   boolean   no bounds
--   text      min_value / max_value: length in characters
--   name      letters, digits, '.', '_', '-', starting with a letter or digit;
--             min_value / max_value: length in characters
--   domain    a domain name (LDH labels, the domain rule of mailroom._is_valid_address)
--   url       an http:// or https:// URL without user info, query or fragment;
--             max_value: length in characters
-- A setting without a kind cannot be changed by set_setting (MR004): a migration that adds a
-- setting fills kind (and its bounds) in the same INSERT.

ALTER TABLE mailroom.settings
ADD COLUMN kind text,
ADD COLUMN min_value text,
ADD COLUMN max_value text,
ADD CONSTRAINT settings_kind_check CHECK (
    kind IN ('interval', 'integer', 'number', 'boolean', 'text', 'name', 'domain', 'url')
),
ADD CONSTRAINT settings_bounds_need_kind CHECK (
    kind IS NOT null OR (min_value IS null AND max_value IS null)
);

COMMENT ON COLUMN mailroom.settings.kind IS
'What the value must be: interval, integer, number, boolean, text, name, domain or url (checked by set_setting).';
COMMENT ON COLUMN mailroom.settings.min_value IS
'Lower bound, inclusive: an interval or a number for those kinds, a length in characters for text and name.';
COMMENT ON COLUMN mailroom.settings.max_value IS
'Upper bound, inclusive: an interval or a number for those kinds, a length in characters for text, name and url.';

UPDATE mailroom.settings AS s
SET kind = v.kind, min_value = v.min_value, max_value = v.max_value
FROM (
    VALUES
    ('tokens.ttl', 'interval', '1 minute', '30 days'),
    ('tokens.channel', 'name', '1', '63'),
    ('tokens.max_code_attempts', 'integer', '1', '20'),
    ('recovery.min_interval', 'interval', '0 seconds', '1 day'),
    ('recovery.daily_cap', 'integer', '1', '1000'),
    ('inbox.domain', 'domain', null, null),
    ('inbox.expire_batch', 'integer', '1', '100000'),
    ('inbox.purge_batch', 'integer', '1', '100000'),
    ('outbound.max_attempts', 'integer', '1', '100'),
    ('outbound.backoff_base', 'interval', '1 second', '1 day'),
    ('outbound.backoff_exponent', 'number', '0', '4'),
    ('outbound.backoff_max', 'interval', '1 second', '30 days'),
    ('outbound.lease', 'interval', '5 seconds', '1 day'),
    ('outbound.max_recipients', 'integer', '1', '1000'),
    ('outbound.max_message_bytes', 'integer', '1', '1073741823'),
    ('outbound.error_log_max_chars', 'integer', '80', '1048576'),
    ('collector.link_base_url', 'url', null, '2000'),
    ('collector.sender', 'name', '1', '64')
) AS v (name, kind, min_value, max_value)
WHERE s.name = v.name;
