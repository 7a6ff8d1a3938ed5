-- SMTP capture credentials: registered by digest only, smtp_login answers the capture inbox (kept
-- open, re-made when closed) or MR290 alike for a wrong secret, an unknown user and a revoked one.
BEGIN;
SELECT plan(18);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
CREATE TEMP TABLE c AS SELECT * FROM mailroom.create_smtp_credential('team-1', sha256('mrs_one'::bytea), 'ci');
SELECT matches((SELECT username FROM c), '^smtp-[0-9a-f]{12}$', 'a username is made');
SELECT is(
    (SELECT row(m.owner_type, m.owner_id, m.plan, m.expires_at)::text
     FROM mailroom.mailboxes AS m JOIN c ON m.address = c.capture_address),
    '(api,team-1,pro,"2030-01-02 00:00:00+00")',
    'a capture inbox of the owner (owner type api), open for the plan''s max TTL'
);

SELECT is(
    (SELECT row(l.credential_id, l.capture_address)::text
     FROM mailroom.smtp_login((SELECT username FROM c), sha256('mrs_one'::bytea)) AS l),
    (SELECT row(credential_id, capture_address)::text FROM c),
    'a good login: the credential and its capture inbox'
);
SELECT throws_ok(
    format('SELECT * FROM mailroom.smtp_login(%L, sha256(''mrs_two''::bytea))', (SELECT username FROM c)),
    'MR290', NULL, 'a wrong secret: MR290'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.smtp_login('smtp-000000000000', sha256('mrs_one'::bytea))$$,
    'MR290', NULL, 'an unknown username: MR290'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.smtp_login(null, null)$$, 'MR290', NULL, 'nothing: MR290'
);
SELECT is(
    (SELECT error_codes.smtp_reply FROM mailroom.error_codes WHERE code = 'MR290'),
    '535 5.7.8 Authentication credentials invalid', 'MR290 is answered 535 5.7.8'
);

-- an hour later a login extends the inbox to 24 h from then
SET LOCAL mailroom.clock = '2030-01-01 01:00:00+00';
SELECT is(
    (SELECT l.expires_at FROM mailroom.smtp_login((SELECT username FROM c), sha256('mrs_one'::bytea)) AS l),
    '2030-01-02 01:00:00+00'::timestamptz, 'a login extends the capture inbox'
);
SELECT is(
    (SELECT last_login_at FROM mailroom.list_smtp_credentials('team-1')),
    '2030-01-01 01:00:00+00'::timestamptz, 'the last login is listed'
);

-- closed (here deleted): the next login makes a new capture inbox
UPDATE mailroom.mailboxes SET is_active = false, deleted_at = mailroom.clock(), inactive_since = mailroom.clock()
WHERE address = (SELECT capture_address FROM c);
CREATE TEMP TABLE l2 AS
SELECT * FROM mailroom.smtp_login((SELECT username FROM c), sha256('mrs_one'::bytea));
SELECT isnt((SELECT capture_address FROM l2), (SELECT capture_address FROM c), 'a closed capture inbox is made anew');
SELECT is(
    (SELECT capture_address FROM mailroom.list_smtp_credentials('team-1')),
    (SELECT capture_address FROM l2), 'and listed'
);

-- purged (the row gone; no foreign key): the next login makes another
DELETE FROM mailroom.mailboxes WHERE address = (SELECT capture_address FROM l2);
SELECT isnt(
    (SELECT l.capture_address FROM mailroom.smtp_login((SELECT username FROM c), sha256('mrs_one'::bytea)) AS l),
    (SELECT capture_address FROM l2), 'a purged capture inbox is made anew'
);

SELECT is(
    (SELECT row(owner_id, username, label, revoked_at)::text FROM mailroom.list_smtp_credentials('team-1')),
    (SELECT row('team-1', username, 'ci', null::timestamptz)::text FROM c),
    'listed with owner, username and label, never the digest'
);
SELECT ok(mailroom.revoke_smtp_credential((SELECT credential_id FROM c)), 'revoke');
SELECT ok(NOT mailroom.revoke_smtp_credential((SELECT credential_id FROM c)), 'revoking twice: false');
SELECT throws_ok(
    format('SELECT * FROM mailroom.smtp_login(%L, sha256(''mrs_one''::bytea))', (SELECT username FROM c)),
    'MR290', NULL, 'a revoked credential: MR290'
);
SELECT throws_ok(
    $$SELECT * FROM mailroom.create_smtp_credential('x', '\x00'::bytea)$$, 'MR291', NULL,
    'a digest not of 32 bytes: MR291'
);
SELECT throws_ok($$SELECT mailroom.revoke_smtp_credential(-1)$$, 'MR292', NULL, 'no such credential: MR292');

SELECT * FROM finish();
ROLLBACK;
