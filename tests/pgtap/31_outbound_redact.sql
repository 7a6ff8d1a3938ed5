-- Outbound: redact_pii and the trigger that scrubs every write of error_log.
BEGIN;
SELECT plan(29);
\ir fixtures/default_settings.sql

SELECT matches(
    mailroom.redact_pii('550 5.1.1 <alice@example.com> user unknown'),
    '^550 5\.1\.1 <redacted:[0-9a-f]{16}> user unknown$',
    'an address in angle brackets becomes one tag; codes and text stay'
);
SELECT is(
    mailroom.redact_pii('<alice@example.com>'),
    mailroom.redact_pii('Alice@Example.COM'),
    'same address (any case, with or without brackets) -> same tag'
);
SELECT isnt(
    mailroom.redact_pii('alice@example.com'),
    mailroom.redact_pii('bob@example.com'),
    'different addresses -> different tags'
);
SELECT isnt(
    mailroom.redact_pii('alice@example.com'),
    '<redacted:' || left(encode(digest('alice@example.com', 'sha256'), 'hex'), 16) || '>',
    'the tag is keyed: not the plain hash of the address'
);
SELECT matches(
    mailroom.redact_pii('550 alice@example.com: Recipient address rejected.'),
    '^550 <redacted:[0-9a-f]{16}>: Recipient address rejected\.$',
    'a bare address is redacted, trailing punctuation kept'
);
SELECT unalike(
    mailroom.redact_pii('queued as <20261122.abc$1@mx.example.net>'),
    '%mx.example%',
    'a Message-ID is redacted'
);
SELECT is(
    mailroom.redact_pii('Client host [192.0.2.17] blocked') ~ '^Client host \[<redacted:[0-9a-f]{16}>\] blocked$',
    TRUE,
    'an IPv4 address is redacted'
);
SELECT is(
    regexp_replace(mailroom.redact_pii('from 2001:db8::1 and fe80:0:0:0:1:2:3:4'), '<redacted:[0-9a-f]{16}>', 'T', 'g'),
    'from T and T',
    'IPv6 addresses are redacted'
);
SELECT unalike(mailroom.redact_pii('rejected "John Smith" <John Smith>'), '%Smith%', 'quoted and bracketed names are redacted');
SELECT unalike(mailroom.redact_pii('user jürgen@bücher.de unknown'), '%bücher%', 'non-ASCII addresses are redacted');
SELECT is(
    mailroom.redact_pii('451 4.7.1 try again at 19:09:25, code 5.7.1'),
    '451 4.7.1 try again at 19:09:25, code 5.7.1',
    'times and enhanced codes are not mistaken for PII'
);
SELECT is(
    mailroom.redact_pii(mailroom.redact_pii('550 <a@b.example> "Bob" 10.0.0.1')),
    mailroom.redact_pii('550 <a@b.example> "Bob" 10.0.0.1'),
    'redact_pii is idempotent'
);
SELECT is(mailroom.redact_pii(NULL), NULL, 'NULL stays NULL');

-- obfuscated spellings of an address: redacted, and tagged as the address they spell
SELECT results_eq(
    $$SELECT mailroom.redact_pii(s) FROM (VALUES
        ('user%40example.com'), ('user(at)example.com'), ('user [at] example [dot] com'), ('User (AT) Example (DOT) COM'),
        ('user at example.com'), ('user at example dot com'), ('user[at]example[dot]com')) AS t (s)$$,
    $$SELECT mailroom.redact_pii('user@example.com') FROM generate_series(1, 7)$$,
    '%40, (at), [at], " at " (and (dot), [dot], " dot ") spellings get the tag of the address they spell'
);
SELECT is(
    regexp_replace(
        mailroom.redact_pii('550 5.1.1 user(at)example.com unknown; mail bob [at] example [dot] org or carol%40x.example.'),
        '<redacted:[0-9a-f]{16}>', 'T', 'g'
    ),
    '550 5.1.1 T unknown; mail T or T.',
    'in a reply, each obfuscated address becomes one tag; the text around it stays'
);
SELECT is(
    mailroom.redact_pii('Service unavailable at this time, try at 19:09 (code 4.3.2)'),
    'Service unavailable at this time, try at 19:09 (code 4.3.2)',
    'the word "at" alone is not an address (a domain needs a dot and an alphabetic last label)'
);
SELECT is(
    mailroom.redact_pii(mailroom.redact_pii('a (at) b.example and <c%40d.example> "e at f.example"')),
    mailroom.redact_pii('a (at) b.example and <c%40d.example> "e at f.example"'),
    'redact_pii stays idempotent with the new spellings'
);
SELECT is(mailroom.redact_pii(''), '', 'an empty text stays empty');

-- linear: 4,000 addresses in one text (a0@b … a9@b, space-separated: 19,999 characters)
CREATE TEMP TABLE many AS
SELECT string_agg('a' || (g % 10) || '@b', ' ' ORDER BY g) AS s FROM generate_series(1, 4000) AS g;
SELECT is((SELECT length(s) FROM many), 19999, 'the input holds 4,000 addresses in 19,999 characters');
SET LOCAL statement_timeout = '5s';
CREATE TEMP TABLE many_out AS SELECT mailroom.redact_pii(s) AS r FROM many;
SET LOCAL statement_timeout = 0;
SELECT is(
    (SELECT count(*)::integer FROM many_out AS o, regexp_matches(o.r, '<redacted:[0-9a-f]{16}>', 'g') AS m),
    4000,
    'every one of the 4,000 addresses became one tag, well within a 5 s statement timeout'
);
SELECT is(
    (SELECT regexp_replace(o.r, '<redacted:[0-9a-f]{16}>', '', 'g') FROM many_out AS o),
    repeat(' ', 3999),
    'nothing but the tags and the separators is left'
);
SELECT is(
    (SELECT count(DISTINCT m[1])::integer FROM many_out AS o, regexp_matches(o.r, '<redacted:[0-9a-f]{16}>', 'g') AS m),
    10,
    'the 10 distinct addresses get 10 distinct tags'
);

-- the pepper lookup stays cheap when the caller disabled sequential scans (finalize_messages does)
SET LOCAL enable_seqscan = off;
SET LOCAL statement_timeout = '5s';
CREATE TEMP TABLE tags_noseq AS SELECT mailroom_internal._redaction_tag('u' || g || '@example.com') AS t FROM generate_series(1, 300) AS g;
SET LOCAL statement_timeout = 0;
SET LOCAL enable_seqscan = on;
SELECT is(
    (SELECT count(DISTINCT t)::integer FROM tags_noseq), 300,
    '300 tags under enable_seqscan = off within a 5 s statement timeout (the pepper is read by its key, not JIT-compiled each time)'
);

-- the trigger
SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525);
INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id, error_log)
SELECT id, ARRAY['x@example.com'], 's', 't', '<m1@mailroom.test>', '550 <carol@example.com> unknown'
FROM mailroom.senders WHERE name = 'tap';
SELECT is(
    (SELECT error_log FROM mailroom.outbound_messages WHERE message_id = '<m1@mailroom.test>'),
    mailroom.redact_pii('550 <carol@example.com> unknown'),
    'an INSERT with a raw error_log is scrubbed by the trigger'
);
UPDATE mailroom.outbound_messages SET error_log = error_log || E'\n451 dave@example.com later'
WHERE message_id = '<m1@mailroom.test>';
SELECT unalike(
    (SELECT error_log FROM mailroom.outbound_messages WHERE message_id = '<m1@mailroom.test>'),
    '%@%',
    'an UPDATE by any client is scrubbed by the trigger'
);
SELECT is(
    (SELECT error_log FROM mailroom.outbound_messages WHERE message_id = '<m1@mailroom.test>'),
    mailroom.redact_pii('550 <carol@example.com> unknown') || E'\n451 ' || mailroom.redact_pii('dave@example.com') || ' later',
    'previously scrubbed text keeps its tags'
);

-- the pepper
SELECT is(
    (SELECT octet_length(pepper) FROM mailroom.redaction_pepper), 32, 'the pepper is 32 random bytes'
);
SELECT ok(
    NOT has_table_privilege('public', 'mailroom.redaction_pepper', 'SELECT'),
    'PUBLIC cannot read the pepper'
);
SELECT isnt(obj_description('mailroom.redact_pii(text)'::regprocedure), NULL, 'redact_pii is documented');

SELECT * FROM finish();
ROLLBACK;
