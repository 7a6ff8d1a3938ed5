-- Issue 22: the token types as data. Every per-type rule reads mailroom.token_actions (sql/11_tokens.sql,
-- 12_consume.sql, the collector's CSV): the path a token's signature covers (byte-compatible with the
-- original C collector: /activate, /recover), the account status in which a token may be dispatched
-- and used, whether it carries a 5-digit code (signed after the secret and checked at consume), whether
-- consuming it activates the account, and the numeric action code of `mailroom collect`'s CSV. A type
-- of mailroom.token_action without a row is refused (MR125), never given another type's rules. Its
-- email template (token_email_templates) now references its row.
CREATE TABLE mailroom.token_actions (
    action mailroom.token_action PRIMARY KEY,
    signing_path text NOT NULL UNIQUE CHECK (signing_path ~ '^/[a-z][a-z0-9_-]*$'),
    eligible_status mailroom.account_status NOT NULL,
    with_code boolean NOT NULL,
    activates_account boolean NOT NULL,
    output_code smallint NOT NULL UNIQUE CHECK (output_code BETWEEN 1 AND 9)
);

COMMENT ON TABLE mailroom.token_actions IS
'Token types: the path the signature covers, the account status a token needs, whether it carries a code, whether consuming it activates the account, the CSV action code.';

INSERT INTO mailroom.token_actions (action, signing_path, eligible_status, with_code, activates_account, output_code)
VALUES
('activation', '/activate', 'provisioned', false, true, 1),
('password_recovery', '/recover', 'active', true, false, 2);

ALTER TABLE mailroom.token_email_templates DROP CONSTRAINT token_email_templates_action_check;
ALTER TABLE mailroom.token_email_templates
ALTER COLUMN action TYPE mailroom.token_action USING action::mailroom.token_action;
ALTER TABLE mailroom.token_email_templates
ADD CONSTRAINT token_email_templates_action_fkey FOREIGN KEY (action) REFERENCES mailroom.token_actions (action);
