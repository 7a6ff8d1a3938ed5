-- Collector --enqueue: dequeue tokens and enqueue their emails in the caller's transaction.

CREATE OR REPLACE FUNCTION mailroom.enqueue_token_emails(p_limit integer)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_sender text := mailroom.setting('collector.sender');
    v_count integer := 0;
    v_suppression bigint;
    r record;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('batch limit must be a positive integer, got %s', coalesce(p_limit::text, 'NULL'));
    END IF;
    IF v_sender IS NULL OR btrim(v_sender) = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR404',
            MESSAGE = 'setting collector.sender is empty',
            HINT = 'set it to the name of a sender created with mailroom.upsert_sender';
    END IF;
    FOR r IN
        -- taken and marked dispatched, but nothing minted: no link or code exists before the
        -- delivery attempt (claim_messages mints one at each attempt, _claim_token_email)
        SELECT d.action::text AS action, d.email, d.login, d.token_id
        FROM mailroom_internal._dequeue_tokens(p_limit, NULL, false) AS d
        ORDER BY d.token_id
    LOOP
        -- a suppressed address (sql/38) gets no email: the token stays dequeued, the skip is
        -- recorded in suppressed_token_emails and the batch goes on
        v_suppression := mailroom_internal._suppression_id(r.email);
        IF v_suppression IS NOT NULL THEN
            INSERT INTO mailroom.suppressed_token_emails (token_id, suppression_id, skipped_at)
            VALUES (r.token_id, v_suppression, mailroom.clock())
            ON CONFLICT (token_id) DO NOTHING;
            CONTINUE;
        END IF;
        -- mailroom's own scope: an application message with the same key cannot suppress it
        PERFORM mailroom_internal._enqueue_message(
            'mailroom', v_sender, ARRAY[r.email], mailroom_internal._token_email_subject(r.action, r.email, r.login),
            NULL, NULL,
            p_idempotency_key => 'token:' || r.token_id,
            p_token_id => r.token_id
        );
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom.enqueue_token_emails(integer) IS
'Dequeue up to p_limit tokens and enqueue one email each (idempotency key token:<id> in scope mailroom), in the caller''s '
'transaction; the email is rendered, with a freshly minted link, at each delivery attempt (claim_messages), so no link rests '
'in the queue; a suppressed address is skipped and recorded in suppressed_token_emails; returns how many were enqueued. '
'Errors: MR404 no collector.sender.';

GRANT EXECUTE ON FUNCTION mailroom.enqueue_token_emails(integer) TO mailroom_collector;

-- The keyed form of the previous release, for one release: the key is no longer used (nothing is
-- signed at enqueue).
CREATE OR REPLACE FUNCTION mailroom.enqueue_token_emails(p_limit integer, p_key bytea)
RETURNS integer
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailroom.enqueue_token_emails(p_limit);
$$;

COMMENT ON FUNCTION mailroom.enqueue_token_emails(integer, bytea) IS
'Deprecated since 0.2.0, removed in 0.3.0: enqueue_token_emails(p_limit); the key is ignored.';

GRANT EXECUTE ON FUNCTION mailroom.enqueue_token_emails(integer, bytea) TO mailroom_collector;

-- A token email's delivery attempt (claim_messages): a fresh link and code (_mint_token), rendered
-- from the template. Returned to the claiming sender only; never stored.
CREATE OR REPLACE FUNCTION mailroom_internal._claim_token_email(p_token_id bigint)
RETURNS TABLE (subject text, text_body text, html_body text)
LANGUAGE plpgsql
VOLATILE
STRICT
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT e.subject, e.text_body, e.html_body
    FROM mailroom_internal._mint_token(p_token_id) AS t
    CROSS JOIN LATERAL mailroom.render_token_email(t.action::text, t.email, t.login, t.signed, t.code) AS e;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._claim_token_email(bigint) IS
'Internal: subject and bodies of a token email for one delivery attempt, with a freshly minted link and code (no row: token purged).';
