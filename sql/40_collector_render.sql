-- Collector: render an activation / recovery email from mailroom.token_email_templates.

CREATE OR REPLACE FUNCTION mailroom_internal._html_escape(p_text text)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT replace(replace(replace(replace(replace(
        p_text, '&', '&amp;'), '<', '&lt;'), '>', '&gt;'), '"', '&quot;'), '''', '&#39;');
$$;

COMMENT ON FUNCTION mailroom_internal._html_escape(text) IS
'Internal: escape & < > " and '' for HTML text and attribute values.';

CREATE OR REPLACE FUNCTION mailroom.render_token_email(
    p_action text, p_email text, p_login text, p_signed text, p_code text DEFAULT null
)
RETURNS TABLE (subject text, text_body text, html_body text)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_tpl mailroom.token_email_templates;
    v_base text := mailroom.setting('collector.link_base_url');
    v_link text;
    v_keys text[] := ARRAY['{{login}}', '{{email}}', '{{link}}', '{{code}}'];
    v_vals text[];
BEGIN
    SELECT t.* INTO v_tpl FROM mailroom.token_email_templates AS t WHERE t.action::text = p_action;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR401',
            MESSAGE = format('no email template for token action %L', p_action),
            HINT = 'rows of mailroom.token_email_templates: activation, password_recovery';
    END IF;
    IF v_base IS NULL OR v_base !~ '^https?://[^\s/?#]+(/[^\s?#]*)?$' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR402',
            MESSAGE = 'setting collector.link_base_url must be an http:// or https:// URL without query',
            HINT = 'SELECT mailroom.set_setting(''collector.link_base_url'', ''https://example.com'')';
    END IF;
    IF p_signed IS NULL OR p_signed !~ '^[A-Za-z0-9_-]+$' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR403',
            MESSAGE = 'signed token value must be non-empty URL-safe base64 without padding';
    END IF;
    v_link := rtrim(v_base, '/') || v_tpl.link_path || '?token=' || p_signed;
    v_vals := ARRAY[coalesce(p_login, ''), coalesce(p_email, ''), v_link, coalesce(p_code, '')];

    subject := v_tpl.subject;
    text_body := v_tpl.text_body;
    html_body := v_tpl.html_body;
    FOR i IN 1 .. array_length(v_keys, 1) LOOP
        subject := replace(subject, v_keys[i], v_vals[i]);
        text_body := replace(text_body, v_keys[i], v_vals[i]);
        html_body := replace(html_body, v_keys[i], mailroom_internal._html_escape(v_vals[i]));
    END LOOP;
    -- A header line must stay one line whatever a login or a template contains: every run of
    -- characters a header may not hold (mailroom_internal._header_breaking_chars) becomes one space.
    subject := regexp_replace(subject, mailroom_internal._header_breaking_chars() || '+', ' ', 'g');
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom.render_token_email(text, text, text, text, text) IS
'Subject, text and HTML body of the activation / recovery email for one token (MR401 no template, '
'MR402 bad collector.link_base_url, MR403 bad signed value).';

GRANT EXECUTE ON FUNCTION mailroom.render_token_email(text, text, text, text, text) TO mailroom_collector;

CREATE OR REPLACE FUNCTION mailroom_internal._token_email_subject(p_action text, p_email text, p_login text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_subject text;
BEGIN
    -- the subject a queued token email keeps at rest: no link and no code (claim_messages
    -- renders the whole email, with a fresh link, at each delivery attempt)
    SELECT t.subject INTO v_subject FROM mailroom.token_email_templates AS t WHERE t.action::text = p_action;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR401',
            MESSAGE = format('no email template for token action %L', p_action),
            HINT = 'rows of mailroom.token_email_templates: activation, password_recovery';
    END IF;
    v_subject := replace(replace(replace(replace(v_subject,
        '{{login}}', coalesce(p_login, '')), '{{email}}', coalesce(p_email, '')), '{{link}}', ''), '{{code}}', '');
    RETURN regexp_replace(v_subject, mailroom_internal._header_breaking_chars() || '+', ' ', 'g');
END;
$$;

COMMENT ON FUNCTION mailroom_internal._token_email_subject(text, text, text) IS
'Internal: the subject of a token email without its link and code (what a queued token email keeps at rest).';
