-- Delivery: store one inbound message for one recipient, with the expiry guard in the statement.
-- Error codes: MR203 unknown, MR205 expired, MR206 deleted, MR207 too large, MR208 full,
-- MR211 empty or malformed input.

CREATE OR REPLACE FUNCTION mailroom.deliver_message(
    p_address text,
    p_raw bytea,
    p_envelope_from text DEFAULT '',
    p_subject text DEFAULT null,
    p_from_header text DEFAULT null,
    p_text_body text DEFAULT null,
    p_html_body text DEFAULT null,
    p_attachments jsonb DEFAULT '[]'
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_address text := mailroom._normalize_address(p_address);
    v_size bigint := octet_length(p_raw);
    v_message_id bigint;
    v_mailbox_id bigint;
    v_reason text;
BEGIN
    IF p_raw IS NULL OR v_size = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'MR211', MESSAGE = 'message is empty';
    END IF;
    IF p_attachments IS NOT NULL AND jsonb_typeof(p_attachments) <> 'array' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR211',
            MESSAGE = 'attachments must be a JSON array of metadata objects';
    END IF;

    FOR v_attempt IN 1..2 LOOP
        -- The guard (open by mailroom._mailbox_open, under the plan's size and
        -- count limits) is part of this one statement: a message can never land in an expired
        -- inbox, whether or not the expiry sweep has run. Bumping message_count takes the row
        -- lock, so the count limit is exact under concurrency and a concurrent sweep that
        -- flips is_active is seen on re-check.
        WITH box AS (
            UPDATE mailroom.mailboxes AS m
            SET message_count = m.message_count + 1
            FROM mailroom.plans AS p
            WHERE
                m.address = v_address
                AND p.name = m.plan
                AND mailroom._mailbox_open(m)
                AND m.message_count < p.max_messages
                AND v_size <= p.max_message_bytes
            RETURNING m.id, mailroom.clock() AS received_at
        )

        INSERT INTO mailroom.messages (
            mailbox_id, raw, envelope_from, envelope_to, from_header, subject,
            text_body, html_body, attachments, size_bytes, received_at
        )
        SELECT
            box.id, p_raw, coalesce(p_envelope_from, ''), btrim(p_address), p_from_header,
            p_subject, p_text_body, p_html_body, coalesce(p_attachments, '[]'), v_size,
            box.received_at
        FROM box
        RETURNING id, mailbox_id INTO v_message_id, v_mailbox_id;

        IF v_message_id IS NOT NULL THEN
            -- mailroom_inbox (issue 15) and, for existing listeners, mailroom_delivery: the same
            -- ids-only payload, delivered at commit. No address or subject ever goes in it.
            PERFORM pg_notify(
                'mailroom_inbox',
                json_build_object('mailbox_id', v_mailbox_id, 'message_id', v_message_id)::text
            );
            PERFORM pg_notify(
                'mailroom_delivery',
                json_build_object('mailbox_id', v_mailbox_id, 'message_id', v_message_id)::text
            );
            RETURN v_message_id;
        END IF;

        SELECT c.verdict INTO v_reason FROM mailroom.check_recipient(p_address, v_size) AS c;
        CASE v_reason
            WHEN 'unknown' THEN
                RAISE EXCEPTION USING ERRCODE = 'MR203', MESSAGE = 'mailbox not found';
            WHEN 'deleted' THEN
                RAISE EXCEPTION USING ERRCODE = 'MR206', MESSAGE = 'mailbox was deleted';
            WHEN 'expired' THEN
                RAISE EXCEPTION USING ERRCODE = 'MR205', MESSAGE = 'mailbox expired';
            WHEN 'too_large' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'MR207',
                    MESSAGE = format('message of %s bytes exceeds the plan''s size limit', v_size);
            WHEN 'full' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'MR208',
                    MESSAGE = 'mailbox is full (plan message limit reached)';
            ELSE
                -- A concurrent change between the guard and the diagnosis: try once more.
                NULL;
        END CASE;
    END LOOP;
    RAISE EXCEPTION USING ERRCODE = 'MR205', MESSAGE = 'mailbox does not accept mail now';
END;
$$;

COMMENT ON FUNCTION mailroom.deliver_message(text, bytea, text, text, text, text, text, jsonb) IS
'Store a raw message for one recipient if its mailbox is open and within plan limits (guard in the INSERT); NOTIFY mailroom_inbox and mailroom_delivery with ids; returns the message id.';

GRANT EXECUTE ON FUNCTION mailroom.deliver_message(text, bytea, text, text, text, text, text, jsonb) TO mailroom_inbound;

-- deliver_messages: several messages (of several SMTP sessions) in ONE statement, so one COMMIT
-- stores them all: the inbound server's group commit. Each recipient row names its message by
-- position in the message arrays; a message's data is sent once, however many recipients it has.
-- A refused recipient raises deliver_message's error and nothing of the statement is kept.
CREATE OR REPLACE FUNCTION mailroom.deliver_messages(
    p_message integer[],
    p_address text[],
    p_raw bytea[],
    p_envelope_from text[],
    p_subject text[],
    p_from_header text[],
    p_text_body text[],
    p_html_body text[],
    p_attachments jsonb[]
)
RETURNS TABLE (message integer, message_id bigint)
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT
        r.message,
        mailroom.deliver_message(
            r.address, m.raw, m.envelope_from, m.subject, m.from_header, m.text_body, m.html_body, m.attachments
        )
    FROM unnest(p_message, p_address) WITH ORDINALITY AS r (message, address, n)
    INNER JOIN unnest(p_raw, p_envelope_from, p_subject, p_from_header, p_text_body, p_html_body, p_attachments)
        WITH ORDINALITY AS m (raw, envelope_from, subject, from_header, text_body, html_body, attachments, message)
        ON r.message = m.message
    ORDER BY r.n
$$;

COMMENT ON FUNCTION mailroom.deliver_messages(
    integer[], text[], bytea[], text[], text[], text[], text[], text[], jsonb[]
) IS
'Group commit: deliver_message for every (message, recipient) row in one statement, the message data given once per message (1-based positions); returns (message, message_id) per recipient in order. All or nothing.';

GRANT EXECUTE ON FUNCTION mailroom.deliver_messages(
    integer[], text[], bytea[], text[], text[], text[], text[], text[], jsonb[]
) TO mailroom_inbound;

-- check_message_size: while DATA grows, whether any accepted recipient's plan still takes the
-- size so far (check_recipient answers 'too_large' exactly when the size is over the mailbox's
-- plan; another verdict, a mailbox that expired meanwhile, is left to deliver_message).
CREATE OR REPLACE FUNCTION mailroom.check_message_size(p_addresses text[], p_size bigint)
RETURNS TABLE (verdict text, address text, reply text)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- the first recipient that takes it (ask it first next time), else the refusal
    SELECT 'ok', c.address, NULL::text INTO verdict, address, reply
    FROM unnest(p_addresses) WITH ORDINALITY AS a (address, n)
    CROSS JOIN LATERAL mailroom.check_recipient(a.address, p_size) AS c
    WHERE c.verdict <> 'too_large'
    ORDER BY a.n
    LIMIT 1;
    IF NOT FOUND THEN
        verdict := 'too_large';
        address := NULL;
        reply := '552 5.3.4 Message too big for this mailbox';
    END IF;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom.check_message_size(text[], bigint) IS
'DATA-stage size probe: ok with the first recipient whose plan takes p_size octets, or too_large with the SMTP reply when none does.';

GRANT EXECUTE ON FUNCTION mailroom.check_message_size(text[], bigint) TO mailroom_inbound;
