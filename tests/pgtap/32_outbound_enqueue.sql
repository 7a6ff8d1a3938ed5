-- Outbound: enqueue_message validation, defaults, idempotency, send-after.
BEGIN;
SELECT plan(25);

SET LOCAL mailroom.clock = '2030-01-01 00:00Z';
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);

SELECT ok(
    mailroom.enqueue_message('tap', ARRAY['a@example.com'], 'hello', 'text', '<p>html</p>') > 0,
    'enqueue_message returns an id'
);
SELECT is(
    (SELECT status::text || ' ' || attempts || ' ' || (next_retry_at IS NULL) FROM mailroom.outbound_messages),
    'queued 0 true',
    'a new message is queued, never attempted, due now'
);
SELECT matches(
    (SELECT message_id FROM mailroom.outbound_messages),
    '^<[0-9a-f]{32}@mailroom\.test>$',
    'a Message-ID is generated once, on the sender''s domain'
);
SELECT is(
    (SELECT created_at FROM mailroom.outbound_messages), '2030-01-01 00:00Z'::timestamptz,
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
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_headers => '{"X-A": "a\r\nb"}')$$,
    'MR308', 'extra header X-A must be a single-line string of at most 998 characters', 'a multi-line header is MR308'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_headers => '{"X A": "b"}')$$,
    'MR308', NULL, 'an invalid header name is MR308'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 's', 't', p_idempotency_key => '')$$,
    'MR309', 'idempotency key must be 1-200 characters', 'an empty idempotency key is MR309'
);
SELECT isnt(
    obj_description('mailroom.enqueue_message(text,text[],text,text,text,text[],text[],jsonb,text,timestamptz)'::regprocedure),
    NULL,
    'enqueue_message is documented'
);

SELECT * FROM finish();
ROLLBACK;
