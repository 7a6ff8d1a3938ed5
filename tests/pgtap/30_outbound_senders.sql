-- Outbound: sending identities, relay settings, the password encrypted under a caller's key.
BEGIN;
SELECT plan(29);

SELECT has_table('mailroom', 'senders', 'senders table exists');
SELECT has_table('mailroom', 'outbound_messages', 'outbound_messages table exists');
SELECT has_index('mailroom', 'outbound_messages', 'outbound_messages_due_idx', 'the due-query partial index exists');

SELECT ok(
    mailroom.upsert_sender('tap', 'robot@mailroom.test', 'smtp.example.net', 587, 'starttls') > 0,
    'upsert_sender creates a sender'
);
SELECT is(
    mailroom.upsert_sender(
        'tap', 'robot@mailroom.test', 'relay.example.net', 2525, 'starttls', 'robot', 'pa55 word',
        decode(repeat('ab', 32), 'hex')
    ),
    (SELECT id FROM mailroom.senders WHERE name = 'tap'),
    'upsert_sender on an existing name keeps its id'
);
SELECT is(
    (SELECT smtp_host || ':' || smtp_port || ' ' || smtp_security || ' ' || smtp_username FROM mailroom.senders WHERE name = 'tap'),
    'relay.example.net:2525 starttls robot',
    'upsert_sender replaces the relay settings'
);
SELECT ok(
    position('pa55' IN encode((SELECT smtp_password_encrypted FROM mailroom.senders WHERE name = 'tap'), 'escape')) = 0,
    'the password is not stored in clear'
);
SELECT is(
    pgp_sym_decrypt(
        (SELECT smtp_password_encrypted FROM mailroom.senders WHERE name = 'tap'), repeat('ab', 32)
    ),
    'pa55 word',
    'pgp_sym_decrypt with the hex key gives the password back (round trip)'
);
SELECT is(
    mailroom._smtp_password(
        (SELECT smtp_password_encrypted FROM mailroom.senders WHERE name = 'tap'), decode(repeat('ab', 32), 'hex'), 'tap'
    ),
    'pa55 word',
    '_smtp_password decrypts with the right key'
);
SELECT is(
    mailroom._smtp_password((SELECT smtp_password_encrypted FROM mailroom.senders WHERE name = 'tap'), NULL, 'tap'),
    NULL,
    'no key, no password'
);
SELECT throws_ok(
    $$SELECT mailroom._smtp_password(
        (SELECT smtp_password_encrypted FROM mailroom.senders WHERE name = 'tap'), decode(repeat('cd', 32), 'hex'), 'tap')$$,
    'MR315', 'cannot decrypt the SMTP password of sender tap: wrong encryption key',
    'a wrong key is MR315'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('tap2', 'robot@mailroom.test', 'h', 25, 'none', 'u', 'pw')$$,
    'MR313', 'an SMTP password needs an encryption key (MAILROOM_ENCRYPTION_KEY) to be stored',
    'a password without a key is MR313'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('tap2', 'robot@mailroom.test', 'h', 25, 'none', 'u', 'pw', '\x0011'::bytea)$$,
    'MR314', 'encryption key must be 32 bytes (64 hex characters), got 2 bytes',
    'a short key is MR314'
);
SELECT throws_ok(
    $$SELECT mailroom.upsert_sender('tap2', 'robot@mailroom.test', 'h', 25, 'none', NULL, 'pw', decode(repeat('ab', 32), 'hex'))$$,
    'MR316', 'an SMTP password needs an SMTP username',
    'a password without a username is MR316'
);
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
    (SELECT smtp_password_encrypted IS NULL AND smtp_username IS NULL FROM mailroom.senders WHERE name = 'tap'),
    TRUE,
    'upsert sets the row exactly as given: no credentials now'
);
SELECT isnt(
    obj_description('mailroom.upsert_sender(text,text,text,integer,text,text,text,bytea)'::regprocedure),
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
        WHERE p.pronamespace = 'mailroom'::regnamespace
            AND p.prosrc ~ 'mailroom\.(senders|outbound_messages|mailboxes|messages)\M'
            AND p.prosrc ~* '\m(now\(\)|current_timestamp|clock_timestamp|transaction_timestamp)'
    ),
    NULL,
    'no inbox or outbound function reads now() (time comes from mailroom.clock())'
);

-- list_senders: the relay settings without the password
SELECT mailroom.upsert_sender('listed', 'robot@mailroom.test', 'smtp.example.com', 587, 'starttls', 'robot', 'hunter2',
    decode(repeat('cd', 32), 'hex'));
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
