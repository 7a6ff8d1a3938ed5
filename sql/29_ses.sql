-- Inbound mail from Amazon SES through SNS (POST /hooks/ses of `mailroom http serve`, docs/http.md):
-- the driver verifies the SNS signature and parses the raw message with the same parser as the
-- SMTP server (mailroom.inboxes.mime); this function stores it for each recipient through the
-- same RCPT check (with catch-all, sql/24) and the same guard (deliver_message, sql/21) as SMTP,
-- so an expired or deleted inbox, the size and the count limits behave exactly as over SMTP.
-- A replay of the same SES messageId stores nothing (outcome 'duplicate').
-- Errors: 22023 (no message id, no or too many recipients), MR211 (empty message).

CREATE OR REPLACE FUNCTION mailroom.deliver_ses_message(
    p_ses_message_id text,
    p_recipients text[],
    p_raw bytea,
    p_envelope_from text,
    p_parsed jsonb
)
RETURNS TABLE (recipient text, outcome text, message_id bigint)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := mailroom.clock();
    v_size bigint := octet_length(p_raw);
    v_stored integer := 0;
    v_verdict text;
    v_rcpt text;
BEGIN
    IF nullif(btrim(p_ses_message_id), '') IS NULL OR length(p_ses_message_id) > 200 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'an SES message id of 1 to 200 characters is required';
    END IF;
    IF coalesce(cardinality(p_recipients), 0) NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'between 1 and 100 recipients are required';
    END IF;
    IF p_raw IS NULL OR v_size = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'MR211', MESSAGE = 'message is empty';
    END IF;
    INSERT INTO mailroom.ses_receipts (ses_message_id, received_at, stored)
    VALUES (p_ses_message_id, v_now, 0)
    ON CONFLICT (ses_message_id) DO NOTHING;
    IF NOT FOUND THEN
        recipient := NULL;
        outcome := 'duplicate';
        message_id := NULL;
        RETURN NEXT;
        RETURN;
    END IF;

    -- each recipient once (by its stored form), in order; one refused recipient does not stop the others
    FOR v_rcpt IN
        SELECT r.address
        FROM (
            -- one copy per box, as over SMTP: box+a@ and box+b@ are box@'s (sql/02_addresses.sql)
            SELECT DISTINCT ON (mailroom_internal._address_base(mailroom_internal._normalize_address(a.address))) a.address, a.n
            FROM unnest(p_recipients) WITH ORDINALITY AS a (address, n)
            ORDER BY mailroom_internal._address_base(mailroom_internal._normalize_address(a.address)), a.n
        ) AS r
        ORDER BY r.n
    LOOP
        recipient := mailroom_internal._normalize_address(v_rcpt);
        message_id := NULL;
        SELECT c.verdict INTO v_verdict FROM mailroom_internal._check_recipient_or_claim(v_rcpt, v_size) AS c;
        IF v_verdict = 'ok' THEN
            BEGIN
                message_id := mailroom.deliver_message(v_rcpt, p_raw, p_envelope_from, p_parsed);
                v_verdict := 'stored';
                v_stored := v_stored + 1;
            EXCEPTION
                WHEN SQLSTATE 'MR203' OR SQLSTATE 'MR205' OR SQLSTATE 'MR206' OR SQLSTATE 'MR207' OR SQLSTATE 'MR208' THEN
                    -- the guard refused it after the check (a concurrent change): say why, as RCPT would
                    SELECT c.verdict INTO v_verdict FROM mailroom.check_recipient(v_rcpt, v_size) AS c;
            END;
        END IF;
        outcome := v_verdict;
        RETURN NEXT;
    END LOOP;

    UPDATE mailroom.ses_receipts AS s SET stored = v_stored WHERE s.ses_message_id = p_ses_message_id;
    -- receipts older than the replay window go, a few with each delivery
    DELETE FROM mailroom.ses_receipts AS s
    WHERE s.ses_message_id IN (
        SELECT o.ses_message_id FROM mailroom.ses_receipts AS o
        WHERE o.received_at < v_now - mailroom.setting('ses.replay_window')::interval
        LIMIT 100
        FOR UPDATE SKIP LOCKED
    );
END;
$$;

COMMENT ON FUNCTION mailroom.deliver_ses_message(text, text[], bytea, text, jsonb) IS
'Store a message received by SES and its parsed document (as deliver_message) for each recipient through the RCPT check (catch-all included) and deliver_message''s guard; one row per recipient: stored (with its id) or the refusal (unknown, expired, deleted, too_large, full); a replayed SES messageId: one row, duplicate. Errors: MR211 empty message.';

GRANT EXECUTE ON FUNCTION mailroom.deliver_ses_message(text, text[], bytea, text, jsonb) TO mailroom_http;

-- The previous release's form (its HTTP server, during an upgrade): the parsed fields one argument
-- each. Deprecated since 0.2.0, removed in 0.3.0.
CREATE OR REPLACE FUNCTION mailroom.deliver_ses_message(
    p_ses_message_id text,
    p_recipients text[],
    p_raw bytea,
    p_envelope_from text DEFAULT '',
    p_subject text DEFAULT null,
    p_from_header text DEFAULT null,
    p_text_body text DEFAULT null,
    p_html_body text DEFAULT null,
    p_attachments jsonb DEFAULT '[]'
)
RETURNS TABLE (recipient text, outcome text, message_id bigint)
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT * FROM mailroom.deliver_ses_message(
        p_ses_message_id => p_ses_message_id, p_recipients => p_recipients, p_raw => p_raw,
        p_envelope_from => p_envelope_from,
        p_parsed => mailroom_internal._parsed_document(p_subject, p_from_header, p_text_body, p_html_body, p_attachments)
    )
$$;

COMMENT ON FUNCTION mailroom.deliver_ses_message(text, text[], bytea, text, text, text, text, text, jsonb) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.deliver_ses_message(p_ses_message_id, p_recipients, p_raw, p_envelope_from, p_parsed jsonb); the parsed fields one argument each.';

GRANT EXECUTE ON FUNCTION mailroom.deliver_ses_message(
    text, text[], bytea, text, text, text, text, text, jsonb
) TO mailroom_http;
