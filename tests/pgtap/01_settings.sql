-- set_setting checks every value against its setting's kind and bounds (MR003), and refuses a
-- setting that declares no kind (MR004).
BEGIN;
SELECT plan(61);

CREATE FUNCTION pg_temp.refused(p_name text, p_value text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mailroom.set_setting(p_name, p_value);
    RETURN 'accepted';
EXCEPTION
    WHEN OTHERS THEN
        RETURN SQLSTATE;
END;
$$;

CREATE FUNCTION pg_temp.passes(s mailroom.settings) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mailroom_internal._check_setting_value(s.name, s.kind, s.min_value, s.max_value, s.value);
    RETURN true;
EXCEPTION
    WHEN OTHERS THEN
        RETURN false;
END;
$$;

-- every setting declares a kind, its bounds parse, and its current value passes its own rule
SELECT is(
    (SELECT coalesce(string_agg(name, ', ' ORDER BY name), '') FROM mailroom.settings WHERE kind IS NULL),
    '', 'every setting declares its kind (a migration adding a setting fills kind and bounds)'
);
SELECT is(
    (
        SELECT coalesce(string_agg(s.name, ', ' ORDER BY s.name), '')
        FROM mailroom.settings AS s
        WHERE s.kind IS NOT NULL
            AND NOT pg_temp.passes(s)
    ),
    '', 'every default passes its own rule'
);
SELECT is(
    (
        SELECT count(*)::int FROM mailroom.settings AS s
        WHERE (s.kind = 'interval' AND (s.min_value::interval > s.max_value::interval))
            OR (s.kind = 'integer' AND (s.min_value::bigint > s.max_value::bigint))
            OR (s.kind = 'number' AND (s.min_value::numeric > s.max_value::numeric))
            OR (s.kind IN ('text', 'name', 'url') AND (s.min_value::integer > s.max_value::integer))
    ),
    0, 'every range parses for its kind and is not empty'
);
SELECT results_eq(
    $$ SELECT name, kind, min_value, max_value FROM mailroom.settings
       WHERE name IN ('tokens.ttl', 'tokens.max_code_attempts', 'recovery.daily_cap', 'outbound.max_attempts',
                      'outbound.backoff_base', 'inbox.expire_batch', 'collector.link_base_url')
       ORDER BY name $$,
    $$ VALUES
       ('collector.link_base_url', 'url', NULL, '2000'),
       ('inbox.expire_batch', 'integer', '1', '100000'),
       ('outbound.backoff_base', 'interval', '1 second', '1 day'),
       ('outbound.max_attempts', 'integer', '1', '100'),
       ('recovery.daily_cap', 'integer', '1', '1000'),
       ('tokens.max_code_attempts', 'integer', '1', '20'),
       ('tokens.ttl', 'interval', '1 minute', '30 days') $$,
    'the ranges of the main settings'
);
SELECT throws_ok(
    $$INSERT INTO mailroom.settings (name, value, kind) VALUES ('test.odd', 'x', 'colour')$$,
    '23514', NULL, 'a kind outside the list is refused by the table'
);

-- interval
SELECT throws_ok(
    $$SELECT mailroom.set_setting('tokens.ttl', '-5 minutes')$$, 'MR003',
    'setting tokens.ttl must be an interval between 1 minute and 30 days, got ''-5 minutes''',
    'a negative TTL is refused'
);
SELECT is(pg_temp.refused('tokens.ttl', '59 seconds'), 'MR003', 'interval: below the minimum');
SELECT is(pg_temp.refused('tokens.ttl', '30 days 1 second'), 'MR003', 'interval: above the maximum');
SELECT is(pg_temp.refused('tokens.ttl', 'soon'), 'MR003', 'interval: not an interval');
SELECT is(pg_temp.refused('tokens.ttl', '1 minute'), 'accepted', 'interval: the minimum itself');
SELECT is(pg_temp.refused('tokens.ttl', '30 days'), 'accepted', 'interval: the maximum itself');
SELECT is(pg_temp.refused('outbound.backoff_base', '0 seconds'), 'MR003', 'outbound.backoff_base: at least 1 second');
SELECT is(pg_temp.refused('recovery.min_interval', '0 seconds'), 'accepted', 'recovery.min_interval may be 0');

-- integer
SELECT throws_ok(
    $$SELECT mailroom.set_setting('outbound.max_attempts', '1O')$$, 'MR003',
    'setting outbound.max_attempts must be an integer between 1 and 100, got ''1O''',
    'integer: 1O (letter O) is refused'
);
SELECT is(pg_temp.refused('outbound.max_attempts', '101'), 'MR003', 'integer: above the maximum');
SELECT is(pg_temp.refused('outbound.max_attempts', '0'), 'MR003', 'integer: below the minimum');
SELECT is(pg_temp.refused('outbound.max_attempts', '2.5'), 'MR003', 'integer: a fraction');
SELECT is(pg_temp.refused('outbound.max_attempts', '99999999999999999999'), 'MR003', 'integer: out of any range');
SELECT is(pg_temp.refused('tokens.max_code_attempts', '21'), 'MR003', 'tokens.max_code_attempts: 1 to 20');
SELECT is(pg_temp.refused('recovery.daily_cap', '1001'), 'MR003', 'recovery.daily_cap: 1 to 1000');
SELECT is(pg_temp.refused('inbox.expire_batch', 'not-a-number'), 'MR003', 'inbox.expire_batch: a number');
SELECT is(pg_temp.refused('inbox.expire_batch', '100000'), 'accepted', 'integer: the maximum itself');
SELECT is(mailroom.setting('inbox.expire_batch'), '100000', 'an accepted value is stored');

-- number
SELECT is(pg_temp.refused('outbound.backoff_exponent', '1.5'), 'accepted', 'number: a fraction within range');
SELECT is(pg_temp.refused('outbound.backoff_exponent', 'NaN'), 'MR003', 'number: NaN');
SELECT is(pg_temp.refused('outbound.backoff_exponent', 'Infinity'), 'MR003', 'number: infinity');
SELECT is(pg_temp.refused('outbound.backoff_exponent', '4.01'), 'MR003', 'number: above the maximum');
SELECT is(pg_temp.refused('outbound.backoff_exponent', 'two'), 'MR003', 'number: not a number');

-- boolean, text (test settings of those kinds)
INSERT INTO mailroom.settings (name, value, kind, min_value, max_value) VALUES
('test.flag', 'false', 'boolean', NULL, NULL),
('test.note', 'hi', 'text', '1', '10');
SELECT is(pg_temp.refused('test.flag', 'yes'), 'accepted', 'boolean: yes');
SELECT throws_ok(
    $$SELECT mailroom.set_setting('test.flag', 'maybe')$$, 'MR003',
    'setting test.flag must be a boolean (true or false), got ''maybe''', 'boolean: maybe is refused'
);
SELECT is(pg_temp.refused('test.note', 'ten chars!'), 'accepted', 'text: within the length bounds');
SELECT throws_ok(
    $$SELECT mailroom.set_setting('test.note', 'eleven char')$$, 'MR003',
    'setting test.note must be text of 1 to 10 characters', 'text: too long (the value is not quoted back)'
);
SELECT is(pg_temp.refused('test.note', ''), 'MR003', 'text: too short');

-- name
SELECT throws_ok(
    $$SELECT mailroom.set_setting('collector.sender', ' ')$$, 'MR003',
    'setting collector.sender must be a name of 1 to 64 characters (letters, digits, ".", "_" or "-", '
    || 'starting with a letter or digit)',
    'name: a blank sender name is refused'
);
SELECT is(pg_temp.refused('collector.sender', 'relay-1.eu_west'), 'accepted', 'name: letters, digits, . _ -');
SELECT is(pg_temp.refused('collector.sender', '-relay'), 'MR003', 'name: must start with a letter or digit');
SELECT is(pg_temp.refused('collector.sender', repeat('x', 65)), 'MR003', 'name: at most 64 characters');
SELECT is(pg_temp.refused('tokens.channel', repeat('c', 64)), 'MR003', 'tokens.channel: at most 63 (a NOTIFY channel)');

-- domain
SELECT is(pg_temp.refused('inbox.domain', 'Inbox.Example.ORG'), 'accepted', 'domain: mixed case is fine');
SELECT throws_ok(
    $$SELECT mailroom.set_setting('inbox.domain', 'bad domain')$$, 'MR003',
    'setting inbox.domain must be a domain name (dot-separated labels of letters, digits and "-", '
    || 'at most 253 characters)',
    'domain: a space is refused'
);
SELECT is(pg_temp.refused('inbox.domain', 'a..b'), 'MR003', 'domain: an empty label');
SELECT is(pg_temp.refused('inbox.domain', ''), 'MR003', 'domain: empty');

-- url
SELECT throws_ok(
    $$SELECT mailroom.set_setting('collector.link_base_url', 'javascript:alert(1)')$$, 'MR003',
    'setting collector.link_base_url must be an http:// or https:// URL without user info, query or fragment, '
    || 'at most 2000 characters',
    'url: another scheme is refused'
);
SELECT is(pg_temp.refused('collector.link_base_url', 'https://user:secret@example.test'), 'MR003',
    'url: user info is refused');
SELECT is(pg_temp.refused('collector.link_base_url', 'https://example.test/a?x=1'), 'MR003', 'url: a query is refused');
SELECT is(pg_temp.refused('collector.link_base_url', 'https://example.test/' || repeat('a', 2000)), 'MR003',
    'url: at most 2000 characters');
SELECT is(
    pg_temp.refused('collector.link_base_url', 'http://localhost:8080')
    || pg_temp.refused('collector.link_base_url', 'https://[::1]:8443/app/')
    || pg_temp.refused('collector.link_base_url', 'https://app.example.test/mail/'),
    'acceptedacceptedaccepted', 'url: a host with port, an IPv6 literal, a path'
);

-- no kind, unknown, NULL
INSERT INTO mailroom.settings (name, value) VALUES ('test.undeclared', 'x');
SELECT throws_ok(
    $$SELECT mailroom.set_setting('test.undeclared', 'y')$$, 'MR004',
    'setting test.undeclared declares no kind, so it cannot be checked or changed',
    'a setting without a kind cannot be changed'
);
SELECT is(mailroom.setting('test.undeclared'), 'x', 'and keeps its value');
SELECT throws_ok($$SELECT mailroom.set_setting('test.missing', '1')$$, 'MR001', NULL, 'unknown setting: MR001');
SELECT throws_ok(
    $$SELECT mailroom.set_setting('tokens.ttl', NULL)$$, '22004', 'setting tokens.ttl cannot be NULL', 'NULL: 22004'
);
SELECT is(mailroom.setting('tokens.ttl'), '30 days', 'refused values left the setting as it was');

SELECT is(mailroom.interval_setting('tokens.ttl'), interval '30 days', 'interval_setting: the value as an interval');
SELECT mailroom.set_setting('outbound.lease', '5 minutes');  -- pinned: an installation may have changed it
SELECT is(mailroom.interval_setting('outbound.lease'), interval '5 minutes', 'interval_setting of another setting');
SELECT throws_ok($$SELECT mailroom.interval_setting('test.missing')$$, 'MR001', NULL, 'interval_setting: unknown: MR001');

-- list_settings: every setting with its kind and bounds, for every role that may read one
SELECT is(
    (SELECT row(value, kind, min_value, max_value)::text FROM mailroom.list_settings() WHERE name = 'outbound.lease'),
    '("5 minutes",interval,"5 seconds","1 day")', 'list_settings: value, kind and bounds'
);
SELECT is((SELECT count(*) FROM mailroom.list_settings()), (SELECT count(*) FROM mailroom.settings),
    'list_settings lists every setting');
SELECT throws_ok($$SELECT mailroom.setting('test.missing')$$, 'MR001', NULL, 'unknown setting: MR001 ...');
SELECT is(
    (SELECT count(*)::integer FROM unnest(ARRAY['mailroom_app', 'mailroom_collector', 'mailroom_sender', 'mailroom_inbound',
        'mailroom_monitor', 'mailroom_admin']) AS r (role)
     WHERE has_function_privilege(r.role, 'mailroom.setting(text)', 'EXECUTE')
        AND NOT has_function_privilege(r.role, 'mailroom.list_settings()', 'EXECUTE')),
    0, '... whose hint, SELECT name FROM mailroom.list_settings(), every role that may call setting() may run'
);

-- several settings in one read (finalize_messages: one statement on Citus, not five)
SELECT is(
    mailroom_internal._settings(ARRAY['outbound.max_attempts', 'outbound.lease', 'outbound.max_attempts']),
    ARRAY[mailroom.setting('outbound.max_attempts'), mailroom.setting('outbound.lease'), mailroom.setting('outbound.max_attempts')],
    '_settings: the values of the names given, in their order'
);
SELECT throws_ok(
    $$SELECT mailroom_internal._settings(ARRAY['outbound.lease', 'no.such.setting'])$$,
    'MR001', 'unknown setting ''no.such.setting''',
    '_settings: an unknown name raises setting()''s MR001'
);

SELECT * FROM finish();
ROLLBACK;
