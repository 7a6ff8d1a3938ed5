-- One-click unsubscribe (sql/36_outbound_unsubscribe.sql): bulk mail's List-Unsubscribe per recipient,
-- unsubscribe() for the HTTP face, once per recipient.
BEGIN;
SELECT plan(12);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: the claim and the dequeue take rows made by then, the
-- test's alone (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
CREATE TEMP TABLE installed AS SELECT id FROM mailroom.suppressions;  -- the installation's own, left aside
SELECT mailroom.upsert_sender('news', 'news@mailroom.test', '127.0.0.1', 2525);
CREATE TEMP TABLE m AS
SELECT
    mailroom.enqueue_bulk_message('news', ARRAY['u1@example.com', 'u2@example.com'], 'News', 'b') AS bulk,
    mailroom.enqueue_message('news', ARRAY['p@example.com'], 'Receipt', 'b') AS plain;

SELECT is((SELECT bulk FROM mailroom.outbound_messages WHERE id = (SELECT bulk FROM m)), true, 'enqueue_bulk_message marks bulk');
SELECT is((SELECT bulk FROM mailroom.outbound_messages WHERE id = (SELECT plain FROM m)), false, 'enqueue_message does not');

CREATE TEMP TABLE c0 AS SELECT id, list_unsubscribe FROM mailroom.claim_messages(10, 'w0');
SELECT is(
    (SELECT list_unsubscribe FROM c0 WHERE id = (SELECT bulk FROM m)), NULL,
    'neither a base URL nor a bounce domain: no List-Unsubscribe'
);
SELECT mailroom.release_messages(array_agg(id), array_agg(claim_token)) FROM mailroom.outbound_messages
WHERE status = 'processing' AND created_at <= mailroom.clock();

SELECT mailroom.set_setting('outbound.unsubscribe_base_url', 'http://insecure.test');
SELECT mailroom.set_setting('outbound.bounce_domain', 'bounces.mailroom.test');
CREATE TEMP TABLE c1 AS SELECT id, list_unsubscribe FROM mailroom.claim_messages(10, 'w1');
SELECT matches(
    (SELECT list_unsubscribe[1] FROM c1 WHERE id = (SELECT bulk FROM m)),
    '^<mailto:unsubscribe\+[0-9]+-1-[0-9a-f]{16}@bounces\.mailroom\.test>$',
    'an http (not https) base URL is not used: mailto only'
);
SELECT mailroom.release_messages(array_agg(id), array_agg(claim_token)) FROM mailroom.outbound_messages
WHERE status = 'processing' AND created_at <= mailroom.clock();

SELECT mailroom.set_setting('outbound.unsubscribe_base_url', 'https://mail.mailroom.test/');
CREATE TEMP TABLE c2 AS SELECT id, list_unsubscribe FROM mailroom.claim_messages(10, 'w2');
SELECT matches(
    (SELECT list_unsubscribe[2] FROM c2 WHERE id = (SELECT bulk FROM m)),
    '^<https://mail\.mailroom\.test/unsubscribe/[0-9]+-2-[0-9a-f]{16}>, <mailto:unsubscribe\+[0-9]+-2-[0-9a-f]{16}@bounces\.mailroom\.test>$',
    'https link and mailto, per recipient'
);
SELECT is((SELECT list_unsubscribe FROM c2 WHERE id = (SELECT plain FROM m)), NULL, 'mail not marked bulk: none');

CREATE TEMP TABLE t AS
SELECT substring(list_unsubscribe[2] FROM '/unsubscribe/([^>]+)>') AS u2 FROM c2 WHERE id = (SELECT bulk FROM m);
SELECT throws_ok(
    format('SELECT mailroom.unsubscribe(%L, %L)', (SELECT u2 FROM t), 'Yes'), 'MR384', NULL, 'not One-Click: MR384'
);
SELECT throws_ok(
    format('SELECT mailroom.unsubscribe(%L, %L)', replace((SELECT u2 FROM t), '-2-', '-1-'), 'One-Click'), 'MR380', NULL,
    'another recipient''s position under this signature: MR380'
);
SELECT is(mailroom.unsubscribe((SELECT u2 FROM t), 'One-Click'), true, 'the first unsubscribe suppresses');
SELECT results_eq(
    'SELECT address, reason FROM mailroom.suppressions WHERE id NOT IN (SELECT id FROM installed)',
    $$VALUES ('u2@example.com', 'unsubscribe')$$, 'exactly its recipient, reason unsubscribe'
);
SELECT mailroom.unsuppress('u2@example.com');
SELECT is(mailroom.unsubscribe(upper((SELECT u2 FROM t)), 'One-Click'), false, 'again (any case): nothing');
SELECT is((SELECT count(*)::int FROM mailroom.suppressions WHERE id NOT IN (SELECT id FROM installed)), 0,
    'the admin''s removal stands');

SELECT * FROM finish();
ROLLBACK;
