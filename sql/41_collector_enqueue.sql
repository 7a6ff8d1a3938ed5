-- Collector --enqueue: dequeue tokens and enqueue their emails in the caller's transaction.

CREATE OR REPLACE FUNCTION mailroom.enqueue_token_emails(p_limit integer, p_key bytea)
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
    m record;
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
        SELECT d.action::text AS action, d.email, d.login, d.signed, d.code, d.token_id
        FROM mailroom.dequeue_tokens(p_limit, p_key) AS d
        ORDER BY d.token_id
    LOOP
        -- a suppressed address (sql/38) gets no email: the token stays dequeued, the skip is
        -- recorded in suppressed_token_emails and the batch goes on
        v_suppression := mailroom._suppression_id(r.email);
        IF v_suppression IS NOT NULL THEN
            INSERT INTO mailroom.suppressed_token_emails (token_id, suppression_id, skipped_at)
            VALUES (r.token_id, v_suppression, mailroom.clock())
            ON CONFLICT (token_id) DO NOTHING;
            CONTINUE;
        END IF;
        SELECT e.* INTO m FROM mailroom.render_token_email(r.action, r.email, r.login, r.signed, r.code) AS e;
        -- mailroom's own scope: an application message with the same key cannot suppress it
        PERFORM mailroom._enqueue_message(
            'mailroom', v_sender, ARRAY[r.email], m.subject, m.text_body, m.html_body,
            p_idempotency_key => 'token:' || r.token_id
        );
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom.enqueue_token_emails(integer, bytea) IS
'Dequeue up to p_limit tokens (signed with p_key) and enqueue one rendered email each (idempotency key '
'token:<id> in scope mailroom), in the caller''s transaction; a suppressed address is skipped and recorded in suppressed_token_emails; returns how many were enqueued. Errors: MR404 no collector.sender; MR120, MR401-MR403 from the dequeue and the rendering.';

GRANT EXECUTE ON FUNCTION mailroom.enqueue_token_emails(integer, bytea) TO mailroom_collector;
