-- SES delivery: each recipient through the RCPT check (catch-all included) and deliver_message's
-- guard; refusals named as RCPT names them; a replayed messageId stores nothing.
BEGIN;
SELECT plan(11);
\ir fixtures/default_settings.sql

SET LOCAL mailroom.clock = '2030-01-01 00:00:00+00';
CREATE TEMP TABLE b AS SELECT * FROM mailroom.create_mailbox(5, 'free');
CREATE TEMP TABLE gone AS SELECT * FROM mailroom.create_mailbox(1, 'free');
SELECT mailroom.set_catchall_domain('dev.example', 'team-1');
SET LOCAL mailroom.clock = '2030-01-01 00:02:00+00';
CREATE TEMP TABLE r AS SELECT * FROM mailroom.deliver_ses_message(
    'ses-1', ARRAY[(SELECT address FROM b), upper((SELECT address FROM b)), (SELECT address FROM gone),
                   'nobody@nowhere.example', 'new@dev.example'],
    convert_to(E'Subject: hi\r\n\r\nbody', 'UTF8'), 'a@example.org', '{"subject": "hi", "text_body": "body"}'::jsonb
) WITH ORDINALITY AS d (recipient, outcome, message_id, n);
SELECT is(
    (SELECT string_agg(outcome, ',' ORDER BY n) FROM r),
    'stored,expired,unknown,stored', 'stored, expired and unknown as RCPT says; each address once'
);
SELECT is(
    (SELECT count(*)::int FROM mailroom.messages AS g INNER JOIN r ON g.id = r.message_id), 2,
    'the stored ones are in their inboxes'
);
SELECT is(
    (SELECT array_agg(DISTINCT g.subject || '/' || g.text_body) FROM mailroom.messages AS g INNER JOIN r ON g.id = r.message_id),
    ARRAY['hi/body'], 'with the parsed document''s fields'
);
SELECT ok(EXISTS (SELECT 1 FROM mailroom.mailboxes WHERE address = 'new@dev.example'), 'the catch-all inbox was made');
SELECT is(
    (SELECT row(recipient, outcome, message_id)::text FROM mailroom.deliver_ses_message(
        'ses-1', ARRAY[(SELECT address FROM b)], '\x31'::bytea)),
    '(,duplicate,)', 'a replay of the messageId: duplicate'
);
SELECT is((SELECT message_count FROM mailroom.mailboxes WHERE address = (SELECT address FROM b)), 1, 'and nothing more stored');
-- plus-addressing: box+a@ and box+b@ are box@'s: one copy, tagged with the first (and the previous
-- release's form, a deprecated wrapper: the parsed fields one argument each)
CREATE TEMP TABLE p AS SELECT * FROM mailroom.deliver_ses_message(
    'ses-plus', ARRAY[replace((SELECT address FROM b), '@', '+a@'), replace((SELECT address FROM b), '@', '+b@')],
    '\x31'::bytea, p_subject => 'old form'
);
SELECT is((SELECT string_agg(outcome, ',') FROM p), 'stored', 'two plus forms of one box: stored once');
SELECT is((SELECT tags FROM mailroom.messages WHERE id = (SELECT message_id FROM p)), '{a}'::text[], 'tagged with the first');
SELECT is((SELECT subject FROM mailroom.messages WHERE id = (SELECT message_id FROM p)), 'old form',
    'the previous release''s form stores its fields');
UPDATE mailroom.plans SET max_message_bytes = 3 WHERE name = 'free';
SELECT is(
    (SELECT outcome FROM mailroom.deliver_ses_message('ses-2', ARRAY[(SELECT address FROM b)], '\x31323334'::bytea)),
    'too_large', 'the plan''s size limit: too_large'
);
SELECT throws_ok($$SELECT * FROM mailroom.deliver_ses_message('ses-3', ARRAY['x@y.example'], ''::bytea)$$, 'MR211', NULL,
    'an empty message: MR211');

SELECT * FROM finish();
ROLLBACK;
