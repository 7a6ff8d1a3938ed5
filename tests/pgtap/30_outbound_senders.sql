-- Outbound: sending identities, relay settings, the password encrypted to the sender key (issue 20.4), no cleartext login (21.8).
BEGIN;
SELECT plan(49);
\ir fixtures/default_settings.sql

SELECT has_table('mailroom', 'senders', 'senders table exists');
SELECT has_table('mailroom', 'outbound_messages', 'outbound_messages table exists');
SELECT has_index('mailroom', 'outbound_messages', 'outbound_messages_due_idx', 'the due-query partial index exists');

SELECT ok(
    mailroom.upsert_sender('tap', 'robot@mailroom.test', 'smtp.example.net', 587, 'starttls') > 0,
    'upsert_sender creates a sender'
);
-- a password needs the sender key (its public half here; the private half only where senders run)
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('tap2', 'robot@mailroom.test', 'h', 587, 'starttls', 'u', 'pw')$$,
    'MR313', 'a secret (a relay password, a webhook secret) needs a sender key to be stored',
    'a password before any sender key is MR313'
);
\ir fixtures/sender_key.sql
SELECT throws_ok($$SELECT mailroom.set_sender_public_key('\x0102')$$, 'MR324', NULL, 'set_sender_public_key: not a key');
SELECT throws_ok($$SELECT mailroom.set_sender_public_key((SELECT secret_key FROM sender_key))$$, 'MR324', NULL,
    'set_sender_public_key: a secret key is refused (only the public half belongs here)');
SELECT isnt(mailroom.set_sender_public_key((SELECT public_key FROM sender_key)), NULL, 'set_sender_public_key');
SELECT is(mailroom.set_sender_public_key((SELECT public_key FROM sender_key)),
    (SELECT id FROM mailroom.sender_public_key()), 'setting the same key again keeps it');
SELECT is((SELECT key_id FROM mailroom.sender_public_key()), pgp_key_id((SELECT public_key FROM sender_key)),
    'sender_public_key: the key and the id pgcrypto encrypts to');

SELECT is(
    mailroom.upsert_sender('tap', 'robot@mailroom.test', 'relay.example.net', 2525, 'starttls', 'robot', 'pa55 word'),
    (SELECT id FROM mailroom.senders WHERE name = 'tap'),
    'upsert_sender on an existing name keeps its id'
);
SELECT is(
    (SELECT smtp_host || ':' || smtp_port || ' ' || smtp_security || ' ' || smtp_username FROM mailroom.senders WHERE name = 'tap'),
    'relay.example.net:2525 starttls robot',
    'upsert_sender replaces the relay settings'
);
SELECT ok(
    position('pa55' IN encode((SELECT smtp_password_sealed FROM mailroom.senders WHERE name = 'tap'), 'escape')) = 0
    AND (SELECT smtp_password_encrypted IS NULL FROM mailroom.senders WHERE name = 'tap'),
    'the password is not stored in clear (nor under a symmetric key)'
);
SELECT is(
    pgp_pub_decrypt((SELECT smtp_password_sealed FROM mailroom.senders WHERE name = 'tap'), (SELECT secret_key FROM sender_key)),
    'pa55 word',
    'only the private half of the sender key gives the password back (round trip)'
);
-- the CLI encrypts before sending: the password never reaches the server
SELECT lives_ok(
    $$SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', 'relay.example.net', 2525, 'starttls', 'robot',
        p_sealed_password => pgp_pub_encrypt('s3aled', (SELECT public_key FROM sender_key)))$$,
    'upsert_sender with a password sealed by the client'
);
SELECT is(
    pgp_pub_decrypt((SELECT smtp_password_sealed FROM mailroom.senders WHERE name = 'tap'), (SELECT secret_key FROM sender_key)),
    's3aled', 'the sealed password is stored as given'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', 'h', 587, 'starttls', 'robot',
        p_sealed_password => pgp_sym_encrypt('x', 'y'))$$,
    'MR325', 'the sealed SMTP password is not encrypted to the active sender key', 'a sealed password for another key is MR325'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', 'h', 587, 'starttls', 'robot',
        p_sealed_password => '\x00010203'::bytea)$$,
    'MR325', NULL, 'a sealed password that is not an OpenPGP message is MR325'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', 'h', 587, 'starttls', 'robot', 'pw',
        pgp_pub_encrypt('pw', (SELECT public_key FROM sender_key)))$$,
    'MR325', 'give the SMTP password or its sealed form, not both', 'both forms is MR325'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('tap2', 'robot@mailroom.test', 'h', 587, 'starttls', NULL, 'pw')$$,
    'MR316', 'an SMTP password needs an SMTP username',
    'a password without a username is MR316'
);
SELECT is(
    (SELECT pronargs FROM pg_proc WHERE oid = 'mailroom.upsert_sender'::regproc)::int, 9,
    'upsert_sender has one form, without a key'
);

-- issue 21, item 8: no login over cleartext, unless to a relay on this machine and asked for
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('clear', 'robot@mailroom.test', 'relay.example.net', 25, 'none', 'u', 'pw')$$,
    'MR319', 'sender clear: an SMTP login needs security starttls or tls', 'a login with security none is MR319'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('clear', 'robot@mailroom.test', 'relay.example.net', 25, 'none', 'u')$$,
    'MR319', NULL, 'a username alone with security none is MR319 too'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('clear', 'robot@mailroom.test', 'relay.example.net', 25, 'none', 'u', 'pw',
        p_allow_cleartext => true)$$,
    'MR319', 'sender clear: a cleartext login is allowed only to a relay on this machine',
    'the opt-in is refused for a relay elsewhere'
);
SELECT lives_ok(
    $$SELECT mailroom.upsert_sender('clear', 'robot@mailroom.test', '127.0.0.1', 2525, 'none', 'u', 'pw',
        p_allow_cleartext => true)$$,
    'a loopback relay with the opt-in is accepted'
);
SELECT lives_ok(
    $$SELECT mailroom.upsert_sender('clear6', 'robot@mailroom.test', 'localhost', 2525, 'none', 'u', 'pw',
        p_allow_cleartext => true)$$,
    'localhost with the opt-in too'
);
SELECT is((SELECT smtp_allow_cleartext FROM mailroom.senders WHERE name = 'clear'), true, 'the opt-in is stored');
SELECT ok(
    mailroom_internal._is_loopback_host('127.1.2.3') AND mailroom_internal._is_loopback_host('::1')
    AND NOT mailroom_internal._is_loopback_host('127.example.net') AND NOT mailroom_internal._is_loopback_host('10.0.0.1'),
    '_is_loopback_host: 127.0.0.0/8, ::1, localhost only'
);

-- the one-time conversion of the previous release's ciphertexts (pgp_sym_encrypt under MAILROOM_ENCRYPTION_KEY)
UPDATE mailroom.senders
SET smtp_password_sealed = NULL,
    smtp_password_encrypted = pgp_sym_encrypt('old pw', repeat('ab', 32), 'cipher-algo=aes256, s2k-mode=1, s2k-digest-algo=sha256')
WHERE name = 'tap';
SELECT is(
    mailroom_internal._smtp_password(
        (SELECT smtp_password_encrypted FROM mailroom.senders WHERE name = 'tap'), decode(repeat('ab', 32), 'hex'), 'tap'
    ),
    'old pw',
    '_smtp_password decrypts a previous release''s ciphertext with the right key'
);
SELECT throws_ok($$SELECT mailroom.convert_sender_passwords(decode(repeat('cd', 32), 'hex'))$$,
    'MR315', 'cannot decrypt the SMTP password of sender tap: wrong encryption key', 'convert with a wrong key is MR315');
SELECT throws_ok($$SELECT mailroom.convert_sender_passwords('\x0011')$$,
    'MR314', 'encryption key must be 32 bytes (64 hex characters), got 2 bytes', 'a short key is MR314');
SELECT is(mailroom.convert_sender_passwords(decode(repeat('ab', 32), 'hex')), 1, 'convert_sender_passwords converts one');
SELECT results_eq(
    $$SELECT smtp_password_encrypted IS NULL, pgp_pub_decrypt(smtp_password_sealed, (SELECT secret_key FROM sender_key))
      FROM mailroom.senders WHERE name = 'tap'$$,
    $$VALUES (true, 'old pw')$$,
    'the password is now sealed for the sender key, the old ciphertext gone'
);
SELECT is(mailroom.convert_sender_passwords(decode(repeat('ab', 32), 'hex')), 0, 'converting again finds nothing to do');
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('bad name!', 'robot@mailroom.test', 'h', 25)$$,
    'MR310', NULL, 'an invalid sender name is MR310'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('tap2', 'robot at mailroom.test', 'h', 25)$$,
    'MR303', 'from address of sender tap2 is not a valid email address',
    'an invalid from address is MR303 (not echoed)'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('tap2', 'robot@mailroom.test', 'h', 0)$$,
    'MR311', 'SMTP port must be between 1 and 65535, got 0',
    'port 0 is MR311'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('tap2', 'robot@mailroom.test', 'bad host', 25)$$,
    'MR311', 'SMTP host must be a host name or IP address',
    'a host with a space is MR311'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('tap2', 'robot@mailroom.test', 'h', 25, 'ssl')$$,
    'MR312', 'SMTP security must be none, starttls or tls, got ''ssl''',
    'an unknown security mode is MR312'
);
SELECT lives_ok(
    $$SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', 'relay.example.net', 25)$$,
    'upsert without credentials'
);
SELECT is(
    (SELECT smtp_password_sealed IS NULL AND smtp_username IS NULL FROM mailroom.senders WHERE name = 'tap'),
    TRUE,
    'upsert sets the row exactly as given: no credentials now'
);
SELECT isnt(
    obj_description('mailroom.upsert_sender(text,text,text,integer,text,text,text,bytea,boolean)'::regprocedure),
    NULL,
    'upsert_sender is documented'
);

-- time comes from mailroom.clock(), whichever path writes the row
SET LOCAL mailroom.clock = '2030-01-01 00:00Z';
SELECT mailroom.upsert_sender('clocked', 'robot@mailroom.test', 'h', 25);
SET LOCAL mailroom.clock = '2030-01-02 00:00Z';
SELECT mailroom.upsert_sender('clocked', 'robot@mailroom.test', 'h2', 25);
SELECT is(
    (SELECT ARRAY[created_at, updated_at] FROM mailroom.senders WHERE name = 'clocked'),
    ARRAY['2030-01-01 00:00Z', '2030-01-02 00:00Z']::timestamptz [],
    'upsert_sender: created_at and updated_at follow mailroom.clock()'
);
INSERT INTO mailroom.senders (name, from_address, smtp_host, smtp_port) VALUES ('raw', 'r@mailroom.test', 'h', 25);
INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id)
SELECT id, ARRAY['x@example.com'], 's', 't', '<raw@mailroom.test>' FROM mailroom.senders WHERE name = 'raw';
SELECT is(
    (SELECT ARRAY[s.created_at, s.updated_at, m.created_at, m.updated_at]
        FROM mailroom.senders AS s JOIN mailroom.outbound_messages AS m ON m.sender_id = s.id WHERE s.name = 'raw'),
    array_fill('2030-01-02 00:00Z'::timestamptz, ARRAY[4]),
    'a row inserted outside the API gets its times from mailroom.clock() too (column defaults)'
);
SELECT is(
    (
        SELECT string_agg(c.relname || '.' || a.attname, ', ' ORDER BY c.relname, a.attname)
        FROM pg_attrdef AS d
        JOIN pg_class AS c ON d.adrelid = c.oid
        JOIN pg_attribute AS a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
        WHERE c.relnamespace = 'mailroom'::regnamespace
            AND c.relname IN ('senders', 'outbound_messages')
            AND pg_get_expr(d.adbin, d.adrelid) ~* 'now\(\)|current_timestamp|clock_timestamp|transaction_timestamp'
    ),
    NULL,
    'no outbound column defaults to now()'
);
SELECT is(
    (
        SELECT string_agg(p.proname, ', ' ORDER BY p.proname)
        FROM pg_proc AS p
        WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace)
            AND p.prosrc ~ 'mailroom\.(senders|outbound_messages|mailboxes|messages)\M'
            AND p.prosrc ~* '\m(now\(\)|current_timestamp|clock_timestamp|transaction_timestamp)'
    ),
    NULL,
    'no inbox or outbound function reads now() (time comes from mailroom.clock())'
);

-- list_senders: the relay settings without the password
SELECT mailroom.upsert_sender('listed', 'robot@mailroom.test', 'smtp.example.com', 587, 'starttls', 'robot', 'hunter2');
SELECT is(
    (SELECT row(from_address, smtp_host, smtp_port, smtp_security, smtp_username, password_set, queued)::text
     FROM mailroom.list_senders() WHERE name = 'listed'),
    '(robot@mailroom.test,smtp.example.com,587,starttls,robot,t,0)',
    'list_senders: relay, username, whether a password is stored, messages waiting'
);
SELECT is(
    (SELECT count(*)::integer FROM information_schema.routines AS r
     JOIN information_schema.parameters AS p ON p.specific_name = r.specific_name
     WHERE r.routine_schema = 'mailroom' AND r.routine_name = 'list_senders' AND p.parameter_name ~ 'password_enc|password$'),
    0, 'it has no column that could carry the password'
);
SELECT ok(
    has_function_privilege('mailroom_admin', 'mailroom.list_senders()', 'EXECUTE')
    AND NOT has_function_privilege('mailroom_monitor', 'mailroom.list_senders()', 'EXECUTE'),
    'the admin lists senders; the monitor does not'
);

SELECT * FROM finish();
ROLLBACK;
