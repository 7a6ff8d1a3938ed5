-- One rate and allow-list mechanism (sql/09_rates.sql): _take_rate counts one-minute windows ("N/min":
-- the current minute; "N/h": the last 60), MR020 over the limit with the seconds to wait; the rate
-- and globs kinds of settings; _recipient_allowed's globs ("*" only, case-insensitive, empty allows
-- none) and MR021; the audit line. What maintain_partitions deletes of them: tests/pgtap_fresh/09_rates_maintenance.sql.
BEGIN;
SELECT plan(25);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:10+00';
CREATE FUNCTION pg_temp.err(p_sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_state text;
    v_message text;
    v_detail text;
BEGIN
    EXECUTE p_sql;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT, v_detail = PG_EXCEPTION_DETAIL;
    RETURN v_state || ' ' || coalesce(v_detail, '') || ' ' || v_message;
END;
$$;

-- the kinds
SELECT is(
    (SELECT string_agg(name || '=' || value || ':' || kind, ' ' ORDER BY name) FROM mailroom.settings
     WHERE name IN ('release.rate_per_key', 'release.rate_per_inbox', 'checks.rate_per_key', 'checks.rate_per_inbox',
                    'release.allowed_recipients')),
    'checks.rate_per_inbox=20/min:rate checks.rate_per_key=60/min:rate release.allowed_recipients=:globs '
    || 'release.rate_per_inbox=10/h:rate release.rate_per_key=30/h:rate',
    'the rate settings and the allow-list, with their kinds and defaults'
);
SELECT lives_ok($$SELECT mailroom.set_setting('release.rate_per_key', '5/min')$$, 'N/min is a rate');
SELECT lives_ok($$SELECT mailroom.set_setting('release.rate_per_key', '0/h')$$, 'so is N/h, 0 included');
SELECT throws_ok($$SELECT mailroom.set_setting('release.rate_per_key', '5/day')$$, 'MR003', NULL, 'another unit: MR003');
SELECT throws_ok($$SELECT mailroom.set_setting('release.rate_per_key', '-1/h')$$, 'MR003', NULL, 'a negative count: MR003');
SELECT throws_ok($$SELECT mailroom.set_setting('release.rate_per_key', '2000000/h')$$, 'MR003', NULL, 'over the bound: MR003');
SELECT lives_ok($$SELECT mailroom.set_setting('release.allowed_recipients', '*@example.com, qa-*@Corp.example,')$$,
    'address globs, white space and an empty item allowed');
SELECT throws_ok($$SELECT mailroom.set_setting('release.allowed_recipients', 'a b@example.com')$$, 'MR003', NULL,
    'white space inside a glob: MR003');
SELECT throws_ok($$SELECT mailroom.set_setting('release.allowed_recipients', '*a*b*c*d*e*f*g*h*i')$$, 'MR003', NULL,
    'nine "*" in a glob: MR003');

-- the allow-list
SELECT is(mailroom_internal._recipient_allowed('release.allowed_recipients', 'Dest@EXAMPLE.com'), true,
    '*@example.com: any address there, case-insensitive');
SELECT is(mailroom_internal._recipient_allowed('release.allowed_recipients', 'qa-7@corp.example'), true,
    'qa-*@corp.example: the prefix');
SELECT is(mailroom_internal._recipient_allowed('release.allowed_recipients', 'dev@corp.example'), false,
    'another local part of that domain: no');
SELECT is(mailroom_internal._recipient_allowed('release.allowed_recipients', 'x@sub.example.com'), false,
    'a subdomain is another domain');
SELECT mailroom.set_setting('release.allowed_recipients', 'a_b%@x.example');
SELECT is(
    (SELECT array_agg(mailroom_internal._recipient_allowed('release.allowed_recipients', u.a) ORDER BY u.n)
     FROM unnest(ARRAY['a_b%@x.example', 'aXb%@x.example', 'a_bc@x.example']) WITH ORDINALITY AS u (a, n)),
    ARRAY[true, false, false], '_ and % are literal characters, not LIKE wildcards'
);
SELECT mailroom.set_setting('release.allowed_recipients', '');
SELECT is(mailroom_internal._recipient_allowed('release.allowed_recipients', 'a@example.com'), false, 'empty: none');
SELECT is(pg_temp.err($$SELECT mailroom_internal._require_recipient_allowed('release.allowed_recipients', 'a@example.com')$$),
    'MR021  this recipient is not allowed: it matches none of release.allowed_recipients (empty: none is allowed)',
    'MR021, naming the setting, not the address');

-- the rate: N/min counts the current minute
SELECT mailroom.set_setting('checks.rate_per_key', '2/min');
SELECT lives_ok($$SELECT mailroom_internal._take_rate('t.key', 'k1', 'checks.rate_per_key')$$, 'one');
SELECT lives_ok($$SELECT mailroom_internal._take_rate('t.key', 'k1', 'checks.rate_per_key')$$, 'two');
SELECT is(pg_temp.err($$SELECT mailroom_internal._take_rate('t.key', 'k1', 'checks.rate_per_key')$$),
    'MR020 50 rate limit reached: checks.rate_per_key allows 2/min; try again in 50 seconds',
    'the third within the minute: MR020, the seconds to the next minute');
SELECT lives_ok($$SELECT mailroom_internal._take_rate('t.key', 'k2', 'checks.rate_per_key')$$, 'another subject counts apart');
SELECT is((SELECT sum(hits)::int FROM mailroom.rate_windows WHERE scope = 't.key' AND subject = 'k1'), 2,
    'the refused one is not counted');

-- N/h counts the last 60 one-minute windows: room comes back as the oldest pass
SELECT mailroom.set_setting('checks.rate_per_inbox', '3/h');
SELECT mailroom_internal._take_rate('t.inbox', '7', 'checks.rate_per_inbox');
SET LOCAL mailroom.clock = '2030-01-01 00:20:00+00';
SELECT mailroom_internal._take_rate('t.inbox', '7', 'checks.rate_per_inbox');
SELECT mailroom_internal._take_rate('t.inbox', '7', 'checks.rate_per_inbox');
SET LOCAL mailroom.clock = '2030-01-01 00:40:00+00';
SELECT is(pg_temp.err($$SELECT mailroom_internal._take_rate('t.inbox', '7', 'checks.rate_per_inbox')$$),
    'MR020 1200 rate limit reached: checks.rate_per_inbox allows 3/h; try again in 1200 seconds',
    'three in the hour: refused until the first one''s minute is an hour old');
SET LOCAL mailroom.clock = '2030-01-01 01:00:00+00';
SELECT lives_ok($$SELECT mailroom_internal._take_rate('t.inbox', '7', 'checks.rate_per_inbox')$$,
    'an hour after the first: one more');
SELECT is(pg_temp.err($$SELECT mailroom_internal._take_rate('t.inbox', '7', 'checks.rate_per_inbox')$$),
    'MR020 1200 rate limit reached: checks.rate_per_inbox allows 3/h; try again in 1200 seconds',
    'and then the two of 00:20 hold it until 01:20');

-- the audit line (what maintenance deletes of it, and of the windows, is
-- tests/pgtap_fresh/09_rates_maintenance.sql: maintain_partitions creates partitions, DDL whose locks
-- a live worker would wait for until this file's ROLLBACK)
SELECT mailroom_internal._audit('release', 42, 'api', 'team-1', 1, 2, 3, 1);
SELECT is(
    (SELECT format('%s %s %s:%s %s %s %s %s', a.at = '2030-01-01 01:00:00+00'::timestamptz, a.action, a.owner_type,
                   a.owner_id, a.key_id, a.mailbox_id, a.message_id, a.recipients)
     FROM mailroom.audit_log AS a WHERE a.at = mailroom.clock() AND a.owner_id = 'team-1'),
    't release api:team-1 42 1 2 1',
    'one audit line: when, what, whose, the ids and how many recipients'
);

SELECT * FROM finish();
ROLLBACK;
