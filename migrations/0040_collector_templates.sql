-- Collector: the activation / recovery email templates used by `mailroom collect --enqueue`,
-- and the collector's settings (link base URL, sending identity).

CREATE TABLE mailroom.token_email_templates (
    action text PRIMARY KEY CHECK (action IN ('activation', 'password_recovery')),
    link_path text NOT NULL CHECK (link_path ~ '^/[A-Za-z0-9/_.-]*$'),
    subject text NOT NULL CHECK (subject <> '' AND subject !~ '[\r\n]'),
    text_body text NOT NULL CHECK (text_body <> ''),
    html_body text CHECK (html_body <> '')
);

COMMENT ON TABLE mailroom.token_email_templates IS
'Email templates per token action for mailroom.enqueue_token_emails. Placeholders: {{login}}, {{email}}, '
'{{link}} (collector.link_base_url || link_path || ''?token='' || signed value), {{code}}. '
'Values are HTML-escaped in html_body. Edit with a plain UPDATE.';

INSERT INTO mailroom.token_email_templates (action, link_path, subject, text_body, html_body)
VALUES
(
    'activation',
    '/activate',
    'Activate your account',
    'Hello {{login}},

please confirm your email address to activate your account:

{{link}}

The link expires soon. If you did not sign up, you can ignore this email.
',
    '<p>Hello {{login}},</p>
<p>please confirm your email address to activate your account:</p>
<p><a href="{{link}}">Activate my account</a></p>
<p>The link expires soon. If you did not sign up, you can ignore this email.</p>
'
),
(
    'password_recovery',
    '/recover',
    'Reset your password',
    'Hello {{login}},

someone asked to reset the password of your account. Open this link:

{{link}}

and enter the code {{code}}.

If it was not you, ignore this email: your password stays unchanged.
',
    '<p>Hello {{login}},</p>
<p>someone asked to reset the password of your account. Open this link:</p>
<p><a href="{{link}}">Reset my password</a></p>
<p>and enter the code <strong>{{code}}</strong>.</p>
<p>If it was not you, ignore this email: your password stays unchanged.</p>
'
)
ON CONFLICT (action) DO NOTHING;

INSERT INTO mailroom.settings (name, value, description)
VALUES
(
    'collector.link_base_url',
    'http://localhost:8080',
    'Base URL of the links in activation / recovery emails (http or https, no trailing path needed).'
),
(
    'collector.sender',
    'mailroom',
    'Name of the sending identity (mailroom.upsert_sender) that activation / recovery emails go out from.'
)
ON CONFLICT (name) DO NOTHING;
