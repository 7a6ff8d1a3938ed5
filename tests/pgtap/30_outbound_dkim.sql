-- DKIM keys (sql/30_outbound_dkim.sql): the public half per From domain, the TXT record, what claim returns.
BEGIN;
SELECT plan(10);
\ir fixtures/default_settings.sql

-- the clock before any installation existed: the claim and the dequeue take rows made by then, the
-- test's alone (docs/operations.md, "Verifying an installation")
SET LOCAL mailroom.clock = '2000-01-01 00:00Z';
SELECT mailroom.upsert_sender('news', 'News@Mailroom.test', '127.0.0.1', 2525);
SELECT mailroom.upsert_sender('other', 'x@elsewhere.test', '127.0.0.1', 2525);

SELECT results_eq(
    $$SELECT domain, selector, dns_name, dns_value FROM mailroom.set_dkim_key('news', 'S2030', 'MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDOr5au5iO3vF4V4msbFugkeVGUzy7S+JT4OMR00wBW/WSEJ9FowgJTZUrAsA7FGgqmHII8EbHdzCgzgg56gHUnOvP83F5wyQFh1TDIEvDOOCS2i8GxvvQbGX19VdTA7hL/UzpORIK0DA9XVJFoq78Dd/fQTXtLyw5Qh4TDZ18WpwIDAQAB')$$,
    $$VALUES ('mailroom.test', 's2030', 's2030._domainkey.mailroom.test', 'v=DKIM1; k=rsa; p=MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDOr5au5iO3vF4V4msbFugkeVGUzy7S+JT4OMR00wBW/WSEJ9FowgJTZUrAsA7FGgqmHII8EbHdzCgzgg56gHUnOvP83F5wyQFh1TDIEvDOOCS2i8GxvvQbGX19VdTA7hL/UzpORIK0DA9XVJFoq78Dd/fQTXtLyw5Qh4TDZ18WpwIDAQAB')$$,
    'set_dkim_key: the From domain (lower case), the selector and the TXT record to publish'
);
SELECT throws_ok($$SELECT * FROM mailroom.set_dkim_key('nobody', 's', 'MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDOr5au5iO3vF4V4msbFugkeVGUzy7S+JT4OMR00wBW/WSEJ9FowgJTZUrAsA7FGgqmHII8EbHdzCgzgg56gHUnOvP83F5wyQFh1TDIEvDOOCS2i8GxvvQbGX19VdTA7hL/UzpORIK0DA9XVJFoq78Dd/fQTXtLyw5Qh4TDZ18WpwIDAQAB')$$, 'MR363', NULL, 'unknown sender: MR363');
SELECT throws_ok($$SELECT * FROM mailroom.set_dkim_key('news', 'bad selector', 'MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDOr5au5iO3vF4V4msbFugkeVGUzy7S+JT4OMR00wBW/WSEJ9FowgJTZUrAsA7FGgqmHII8EbHdzCgzgg56gHUnOvP83F5wyQFh1TDIEvDOOCS2i8GxvvQbGX19VdTA7hL/UzpORIK0DA9XVJFoq78Dd/fQTXtLyw5Qh4TDZ18WpwIDAQAB')$$, 'MR381', NULL, 'bad selector: MR381');
SELECT throws_ok($$SELECT * FROM mailroom.set_dkim_key('news', 's', 'not base64!')$$, 'MR382', NULL, 'not a public key: MR382');
SELECT throws_ok(
    $$SELECT * FROM mailroom.set_dkim_key('news', 's', '-----BEGIN PRIVATE KEY-----')$$, 'MR382', NULL,
    'a PEM (a private key pasted by mistake) is refused: MR382'
);
SELECT is((SELECT count(*)::int FROM mailroom.list_dkim_keys()), 1, 'list_dkim_keys: one key');

SELECT mailroom.enqueue_message('news', ARRAY['a@example.com'], 's', 'b');
SELECT mailroom.enqueue_message('other', ARRAY['b@example.com'], 's', 'b');
CREATE TEMP TABLE c AS SELECT sender_name, dkim_domain, dkim_selector, dkim_public_key, dkim_algorithm FROM mailroom.claim_messages(10, 'w');
SELECT results_eq(
    $$SELECT dkim_domain, dkim_selector, dkim_public_key, dkim_algorithm FROM c WHERE sender_name = 'news'$$,
    $$VALUES ('mailroom.test', 's2030', 'MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDOr5au5iO3vF4V4msbFugkeVGUzy7S+JT4OMR00wBW/WSEJ9FowgJTZUrAsA7FGgqmHII8EbHdzCgzgg56gHUnOvP83F5wyQFh1TDIEvDOOCS2i8GxvvQbGX19VdTA7hL/UzpORIK0DA9XVJFoq78Dd/fQTXtLyw5Qh4TDZ18WpwIDAQAB', 'rsa-sha256')$$,
    'claim returns the From domain''s selector and public half'
);
SELECT is((SELECT dkim_selector FROM c WHERE sender_name = 'other'), NULL, 'a domain without a key: unsigned');

SELECT lives_ok($$SELECT mailroom.delete_dkim_key('mailroom.test')$$, 'delete_dkim_key');
SELECT throws_ok($$SELECT mailroom.delete_dkim_key('mailroom.test')$$, 'MR383', NULL, 'no key for that domain: MR383');

SELECT * FROM finish();
ROLLBACK;
