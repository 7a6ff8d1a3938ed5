-- Outbound: enqueue_message validation, defaults, idempotency, send-after.
BEGIN;
SELECT plan(39);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);

SELECT ok(
    mailroom.enqueue_message('tap', ARRAY['a@example.com'], 'hello', 'text', '<p>html</p>') > 0,
    'enqueue_message returns an id'
);
SELECT is(
    (SELECT status::text || ' ' || attempts || ' ' || (next_retry_at IS NULL) FROM mailroom.outbound_messages WHERE sender_id = (SELECT s.id FROM mailroom.senders AS s WHERE s.name = 'tap')),
    'queued 0 true',
    'a new message is queued, never attempted, due now'
);
SELECT matches(
    (SELECT message_id FROM mailroom.outbound_messages WHERE sender_id = (SELECT s.id FROM mailroom.senders AS s WHERE s.name = 'tap')),
    '^<[0-9a-f]{32}@mailroom\.test>$',
    'a Message-ID is generated once, on the sender''s domain'
);
SELECT is(
    (SELECT created_at FROM mailroom.outbound_messages WHERE sender_id = (SELECT s.id FROM mailroom.senders AS s WHERE s.name = 'tap')), '2030-01-01 00:00Z'::timestamptz,
    'created_at follows mailroom.clock()'
);
SELECT is(
    mailroom.enqueue_message(
        'tap', ARRAY['a@example.com'], 's', 't', p_idempotency_key => 'order-1',
        p_send_after => '2030-01-02 00:00Z'
    ),
    mailroom.enqueue_message('tap', ARRAY['other@example.com'], 'x', 'y', p_idempotency_key => 'order-1'),
    'the same idempotency key returns the existing id'
);
SELECT is(
    (SELECT count(*)::integer FROM mailroom.outbound_messages WHERE idempotency_key = 'order-1'), 1,
    'and inserts nothing'
);
SELECT is(
    (SELECT next_retry_at FROM mailroom.outbound_messages WHERE idempotency_key = 'order-1'),
    '2030-01-02 00:00Z'::timestamptz,
    'p_send_after delays the first attempt'
);
SELECT lives_ok(
    $$SELECT mailroom.enqueue_message('tap', '{}', 's', NULL, '<p>only html</p>', p_bcc => ARRAY['b@example.com'])$$,
    'bcc-only, html-only messages are accepted'
);
SELECT lives_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_headers => '{"Reply-To": "help@mailroom.test"}')$$,
    'extra headers are accepted'
);

SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('nobody', ARRAY['a@example.com'], 's', 't')$$,
    'MR301', 'unknown sender ''nobody''', 'an unknown sender is MR301'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', '{}', 's', 't')$$,
    'MR302', 'a message needs at least one recipient (to, cc or bcc)', 'no recipient is MR302'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com', 'secret person@example.com'], 's', 't')$$,
    'MR303', 'to[2] is not a valid email address', 'an invalid recipient is MR303, without echoing it'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_bcc => ARRAY[NULL::text])$$,
    'MR303', 'bcc[1] is not a valid email address', 'a NULL recipient is MR303'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_cc => ARRAY['a..b@example.com'])$$,
    'MR303', 'cc[1] is not a valid email address', 'a malformed cc is MR303'
);
SELECT mailroom.set_setting('outbound.max_recipients', '2');
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com', 'b@example.com'], 's', 't', p_cc => ARRAY['c@example.com'])$$,
    'MR304', 'too many recipients: 3 (outbound.max_recipients is 2)', 'too many recipients is MR304'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], E's\r\nBcc: x@example.com', 't')$$,
    'MR305', NULL, 'a subject with CRLF (header injection) is MR305'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], NULL, 't')$$,
    'MR305', NULL, 'a NULL subject is MR305'
);
SELECT mailroom.set_setting('outbound.max_message_bytes', '100');
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', repeat('x', 200))$$,
    'MR306', 'message too large: 203 bytes (outbound.max_message_bytes is 100)', 'an oversized message is MR306'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', NULL)$$,
    'MR307', 'a message needs a text body or an HTML body', 'no body is MR307'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_headers => '["x"]')$$,
    'MR308', NULL, 'headers that are not an object are MR308'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_headers => '{"Bcc": "x@example.com"}')$$,
    'MR308', 'extra header Bcc is set by mailroom and cannot be overridden', 'a reserved header is MR308'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_headers => '{"DKIM-Signature": "v=1"}')$$,
    'MR308', 'extra header DKIM-Signature is set by mailroom and cannot be overridden',
    'an authentication field a submitter would forge is MR308 (attacker review of issue 45)'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_headers => '{"Resent-To": "b@example.com"}')$$,
    'MR308', 'extra header Resent-To is set by mailroom and cannot be overridden', 'so is a Resent- field'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_headers => '{"X-A": "a\r\nb"}')$$,
    'MR308', 'extra header X-A must be a string of at most 998 characters without line breaks or control characters (TAB allowed)',
    'a multi-line header is MR308'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_headers => '{"X A": "b"}')$$,
    'MR308', NULL, 'an invalid header name is MR308'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_idempotency_key => '')$$,
    'MR309', 'idempotency key must be 1-200 characters', 'an empty idempotency key is MR309'
);
-- header injection: every control character but HTAB, and U+2028 / U+2029, is refused
SELECT mailroom.set_setting('outbound.max_message_bytes', '10485760');
CREATE TEMP TABLE breaking (c text, label text);
INSERT INTO breaking VALUES
(E'\r', 'CR'), (E'\n', 'LF'), (E'\x0b', 'VT'), (E'\x0c', 'FF'), (E'\x1c', 'FS'), (E'\x1d', 'GS'), (E'\x1e', 'RS'),
(E'\x1f', 'US'), (E'\x01', 'SOH'), (E'\x7f', 'DEL'), (E'\u0085', 'NEL'), (E'\u009b', 'CSI'),
(E'\u2028', 'LINE SEPARATOR'), (E'\u2029', 'PARAGRAPH SEPARATOR');
CREATE FUNCTION pg_temp.sqlstate_of(p_sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE p_sql;
    RETURN 'ok';
EXCEPTION
    WHEN OTHERS THEN
        RETURN SQLSTATE;
END;
$$;
SELECT is(
    (
        SELECT string_agg(b.label || ' ' || pg_temp.sqlstate_of(format(
            'SELECT mailroom.enqueue_message(%L, ARRAY[%L], %L, %L)', 'tap', 'a@example.com', 'Hi' || b.c || 'Bcc: x@example.com', 't'
        )), ', ' ORDER BY b.label)
        FROM breaking AS b
    ),
    (SELECT string_agg(b.label || ' MR305', ', ' ORDER BY b.label) FROM breaking AS b),
    'a subject with any control character but TAB, or U+2028/U+2029, is MR305'
);
SELECT is(
    (
        SELECT string_agg(b.label || ' ' || pg_temp.sqlstate_of(format(
            'SELECT mailroom.enqueue_message(%L, ARRAY[%L], %L, %L, p_headers => %L)', 'tap', 'a@example.com', 's', 't',
            jsonb_build_object('X-Tag', 'a' || b.c || 'Bcc: x@example.com')
        )), ', ' ORDER BY b.label)
        FROM breaking AS b
    ),
    (SELECT string_agg(b.label || ' MR308', ', ' ORDER BY b.label) FROM breaking AS b),
    'an extra header value with any of them is MR308'
);
SELECT throws_ok(
    format('SELECT mailroom.enqueue_message(%L, ARRAY[%L], %L, %L, p_headers => %L)',
        'tap', 'a@example.com', 's', 't', jsonb_build_object(E'X-\x1cTag', 'v')),
    'MR308', NULL, 'a header name with a control character is MR308'
);
SELECT lives_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], E'Tab\there, Grüße\u00a0ok', 't',
        p_headers => jsonb_build_object('X-Tag', E'a\tb é'))$$,
    'TAB, non-ASCII letters and a no-break space are fine in a subject and a header value'
);

-- send_after: a finite time, or NULL for now
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_send_after => 'infinity')$$,
    'MR317', 'send_after must be a finite time (NULL: as soon as possible), not infinity or -infinity',
    'send_after infinity is MR317 (the message would never be due)'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_send_after => '-infinity')$$,
    'MR317', NULL, 'send_after -infinity is MR317'
);
CREATE TEMP TABLE due_now AS
SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 'now', 't', p_send_after => NULL) AS id;
SELECT is(
    (
        SELECT m.next_retry_at IS NULL AND m.send_after IS NULL FROM mailroom.outbound_messages AS m
        WHERE m.id = (SELECT d.id FROM due_now AS d)
    ),
    true,
    'send_after NULL: due at once'
);

-- idempotency scopes: the application's keys and mailroom's own never meet
SELECT is(
    (SELECT idempotency_scope FROM mailroom.outbound_messages WHERE idempotency_key = 'order-1'), 'app',
    'enqueue_message keys live in scope app'
);
CREATE TEMP TABLE scoped AS
SELECT
    mailroom.enqueue_message('tap', ARRAY['app@example.com'], 'app', 't', p_idempotency_key => 'token:42') AS app_id,
    mailroom_internal._enqueue_message('mailroom', 'tap', ARRAY['own@example.com'], 'own', 't', p_idempotency_key => 'token:42')
        AS own_id;
SELECT isnt((SELECT own_id FROM scoped), (SELECT app_id FROM scoped), 'the same key in scope mailroom is another message');
SELECT is(
    mailroom_internal._enqueue_message('mailroom', 'tap', ARRAY['own@example.com'], 'own', 't', p_idempotency_key => 'token:42'),
    (SELECT own_id FROM scoped),
    'within scope mailroom the key is still idempotent'
);
SELECT is(
    mailroom.enqueue_message('tap', ARRAY['app@example.com'], 'app', 't', p_idempotency_key => 'token:42'),
    (SELECT app_id FROM scoped),
    'and within scope app'
);
SELECT throws_ok(
    $$SELECT mailroom_internal._enqueue_message('other', 'tap', ARRAY['a@example.com'], 's', 't')$$,
    '22023', 'idempotency scope must be app or mailroom', 'an unknown scope is refused'
);
SELECT isnt(
    obj_description('mailroom.enqueue_message(text,text[],text,text,text,text[],text[],jsonb,text,timestamptz,integer)'::regprocedure),
    NULL,
    'enqueue_message is documented'
);

SELECT * FROM finish();
ROLLBACK;
