-- Collector templates: seeded rows, settings, rendering, escaping and each error.
BEGIN;
SELECT plan(24);
\ir fixtures/default_settings.sql

SELECT has_table('mailroom', 'token_email_templates', 'templates table exists');
SELECT set_eq(
    'SELECT action::text FROM mailroom.token_email_templates',
    'SELECT action::text FROM mailroom.token_actions',
    'one template per token action (activation and password_recovery seeded)'
);
SELECT is(mailroom.setting('collector.link_base_url'), 'http://localhost:8080', 'link base URL default');
SELECT is(mailroom.setting('collector.sender'), 'mailroom', 'sender identity default');
SELECT has_function('mailroom', 'render_token_email', ARRAY['text', 'text', 'text', 'text', 'text']);
SELECT has_function('mailroom', 'enqueue_token_emails', ARRAY['integer']);
SELECT ok(
    obj_description('mailroom.enqueue_token_emails(integer)'::regprocedure, 'pg_proc') IS NOT null,
    'enqueue_token_emails is documented'
);

SELECT mailroom.set_setting('collector.link_base_url', 'https://example.test/app/');

-- activation
SELECT is(
    (SELECT e.subject FROM mailroom.render_token_email('activation', 'ann@example.test', 'ann', 'AbC-_9', '01234') AS e),
    'Activate your account', 'activation subject'
);
SELECT matches(
    (SELECT e.text_body FROM mailroom.render_token_email('activation', 'ann@example.test', 'ann', 'AbC-_9', '01234') AS e),
    '^Hello ann,.*https://example\.test/app/activate\?token=AbC-_9\n',
    'activation text: greeting and the link built from the base URL (trailing / folded)'
);
SELECT doesnt_match(
    (SELECT e.text_body FROM mailroom.render_token_email('activation', 'ann@example.test', 'ann', 'AbC-_9', '01234') AS e),
    '01234', 'activation text does not show the code'
);
SELECT matches(
    (SELECT e.html_body FROM mailroom.render_token_email('activation', 'ann@example.test', 'ann', 'AbC-_9', null) AS e),
    '<a href="https://example\.test/app/activate\?token=AbC-_9">',
    'activation HTML links the same URL'
);

-- recovery
SELECT matches(
    (SELECT e.text_body FROM mailroom.render_token_email('password_recovery', 'b@example.test', 'bob', 'xyz', '00042') AS e),
    'https://example\.test/app/recover\?token=xyz\n.*enter the code 00042\.',
    'recovery text: /recover link and the code'
);
SELECT is(
    (SELECT e.subject FROM mailroom.render_token_email('password_recovery', 'b@example.test', 'bob', 'xyz', '00042') AS e),
    'Reset your password', 'recovery subject'
);
SELECT matches(
    (SELECT e.html_body FROM mailroom.render_token_email('password_recovery', 'b@example.test', 'bob', 'xyz', '00042') AS e),
    '<strong>00042</strong>', 'recovery HTML shows the code'
);

-- escaping and header safety
SELECT matches(
    (SELECT e.html_body FROM mailroom.render_token_email('activation', 'a@example.test', '<b>"x"&''y''', 'q', null) AS e),
    'Hello &lt;b&gt;&quot;x&quot;&amp;&#39;y&#39;,', 'values are HTML-escaped in the HTML body'
);
SELECT matches(
    (SELECT e.text_body FROM mailroom.render_token_email('activation', 'a@example.test', '<b>', 'q', null) AS e),
    'Hello <b>,', 'values are verbatim in the text body'
);
UPDATE mailroom.token_email_templates SET subject = 'Welcome {{login}}'
WHERE action = 'activation';
SELECT is(
    (SELECT e.subject FROM mailroom.render_token_email('activation', 'a@example.test', E'x\r\nBcc: evil', 'q', null) AS e),
    'Welcome x Bcc: evil', 'line breaks from values cannot reach the subject header'
);
SELECT is(
    (
        SELECT e.subject FROM mailroom.render_token_email(
            'activation', 'a@example.test', E'x\x0bB\x0cC\x1cD\x1dE\x1eF\x7fG\u0085H\u2028I\u2029J\tK', 'q', null
        ) AS e
    ),
    E'Welcome x B C D E F G H I J\tK',
    'every character a header may not hold (controls but TAB, U+2028, U+2029) becomes a space in the subject'
);
UPDATE mailroom.token_email_templates SET subject = E'Welcome\u2028{{login}}'
WHERE action = 'activation';
SELECT is(
    (SELECT e.subject FROM mailroom.render_token_email('activation', 'a@example.test', 'x', 'q', null) AS e),
    'Welcome x', 'the template''s own text is held to the same rule'
);

-- errors
SELECT throws_ok(
    $$SELECT * FROM mailroom.render_token_email('welcome', 'a@example.test', 'a', 'q', null)$$,
    'MR401', 'no email template for token action ''welcome''', 'unknown action: MR401'
);
DELETE FROM mailroom.token_email_templates
WHERE action = 'password_recovery';
SELECT throws_ok(
    $$SELECT * FROM mailroom.render_token_email('password_recovery', 'a@example.test', 'a', 'q', '12345')$$,
    'MR401', 'no email template for token action ''password_recovery''', 'deleted template: MR401'
);
-- written around set_setting (which may refuse it), as a value stored before validation would be
UPDATE mailroom.settings SET value = 'javascript:alert(1)' WHERE name = 'collector.link_base_url';
SELECT throws_ok(
    $$SELECT * FROM mailroom.render_token_email('activation', 'a@example.test', 'a', 'q', null)$$,
    'MR402', 'setting collector.link_base_url must be an http:// or https:// URL without query',
    'non-http base URL: MR402'
);
SELECT mailroom.set_setting('collector.link_base_url', 'https://example.test');
SELECT throws_ok(
    $$SELECT * FROM mailroom.render_token_email('activation', 'a@example.test', 'a', 'a"><script>', null)$$,
    'MR403', 'signed token value must be non-empty URL-safe base64 without padding', 'bad signed value: MR403'
);
SELECT throws_ok(
    $$SELECT mailroom.enqueue_token_emails(0)$$,
    '22023', 'batch limit must be a positive integer, got 0', 'enqueue_token_emails rejects a limit < 1'
);

SELECT * FROM finish();
ROLLBACK;
