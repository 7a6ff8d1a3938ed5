-- Delivery: store one inbound message for one recipient, with the expiry guard in the statement
-- (deliver_message), and the inbound server's DATA step (deliver_messages): several messages in one
-- statement, each stored for all its recipients or for none, with the verdict and the SMTP reply.
-- Error codes: MR203 unknown, MR205 expired, MR206 deleted, MR207 too large, MR208 full,
-- MR211 empty or malformed input, MR216 deliver_messages' arrays, MR285 a trace that is not header lines.
-- The parsed message (mailroom.inboxes.mime, ParsedMessage.document()) is ONE jsonb object per
-- message, read here by name: subject, from_header, text_body, html_body (text or null) and
-- attachments (an array of metadata objects); keys nothing reads are ignored. A new parsed field is
-- a column of mailroom.messages and its line in deliver_message's INSERT. One key is not parsed:
-- "trace", the inbound server's facts of the SMTP session, from which deliver_messages writes the
-- message's Received: header (_received_header).

CREATE OR REPLACE FUNCTION mailroom.deliver_message(
    p_address text,
    p_raw bytea,
    p_envelope_from text,
    p_parsed jsonb,
    p_trace text DEFAULT null
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_address text := mailroom_internal._normalize_address(p_address);
    -- plus-addressing (sql/02_addresses.sql): box+tag@domain is stored in box@domain, tagged tag
    v_tag text := CASE WHEN strpos(v_address, '+') > 0 THEN mailroom_internal._address_tag(v_address) END;
    -- the plan's size limit bounds what the client sent (SIZE, RFC 1870); what is stored (and
    -- counted in size_bytes, stored_bytes) is that with the trace header in front
    v_size bigint := octet_length(p_raw);
    v_stored bytea := CASE WHEN p_trace IS NULL THEN p_raw ELSE convert_to(p_trace, 'UTF8') || p_raw END;
    v_stored_size bigint := octet_length(v_stored);
    v_message_id bigint;
    v_mailbox_id bigint;
    v_box_id bigint;
    v_reason text;
    v_now timestamptz;
    v_payload text;  -- the NOTIFY payload: ids only
    v_parsed jsonb := coalesce(p_parsed, '{}');
    v_attachments jsonb := coalesce(nullif(p_parsed -> 'attachments', 'null'), '[]');
    v_over integer;  -- messages over the plan's max_messages (a drop_oldest plan's full inbox)
    v_sink boolean;  -- a sink inbox (catchall_domain '*'): the sink's caps after storing
    -- the inbox's owner: an API key's (api, mcp) may have webhook endpoints. The enum itself, not a
    -- text cast in RETURNING: Citus allows only IMMUTABLE functions there (enum_out is STABLE)
    v_owner_type mailroom.mailbox_owner_type;
    v_owner_id text;
BEGIN
    IF p_raw IS NULL OR btrim(p_raw, '\x20090d0a'::bytea) = ''::bytea THEN
        -- no header, no body (nothing, or only white space): nothing to store
        RAISE EXCEPTION USING ERRCODE = 'MR211', MESSAGE = 'message is empty';
    END IF;
    IF p_trace IS NOT NULL AND p_trace !~ '^([!-9;-~]+:[^\r\n]*\r\n([ \t][^\r\n]*\r\n)*)+$' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR285',
            MESSAGE = 'the trace header must be header fields, each line ending in CRLF';
    END IF;
    IF jsonb_typeof(v_parsed) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'MR211', MESSAGE = 'the parsed message must be a JSON object';
    END IF;
    IF jsonb_typeof(v_attachments) <> 'array' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR211',
            MESSAGE = 'attachments must be a JSON array of metadata objects';
    END IF;

    -- the mailbox by its address (mailbox_addresses), then every statement by its id: on Citus
    -- the mailbox row and the message are on the same worker (colocated by mailbox id)
    v_box_id := mailroom_internal._mailbox_id(
        CASE WHEN strpos(v_address, '+') > 0 THEN mailroom_internal._address_base(v_address) ELSE v_address END
    );
    FOR v_attempt IN 1..2 LOOP
        v_now := mailroom.clock();
        -- The guard (open by mailroom_internal._mailbox_open, under the plan's size and
        -- count limits) is part of this one statement: a message can never land in an expired
        -- inbox, whether or not the expiry sweep has run. Bumping message_count takes the row
        -- lock, so the count limit is exact under concurrency and a concurrent sweep that
        -- flips is_active is seen on re-check. The message is inserted by the next statement, in
        -- this transaction, under the row lock: two statements, not an INSERT … SELECT from the
        -- UPDATE, which Citus runs through the coordinator (the row pulled back, the message pushed
        -- to the worker as an intermediate result, then a two-phase commit); two statements on one
        -- worker commit there in one phase (issue 37).
        -- A plan that lets the oldest go when full (plans.when_full drop_oldest) takes the message over
        -- its count; its oldest are deleted below, under the same row lock.
        v_mailbox_id := NULL;
        UPDATE mailroom.mailboxes AS m
        SET message_count = m.message_count + 1, stored_bytes = m.stored_bytes + v_stored_size
        FROM mailroom.plans AS p
        WHERE
            m.id = v_box_id
            AND p.name = m.plan
            AND mailroom_internal._mailbox_open(m.is_active, m.deleted_at, m.expires_at, v_now)
            AND (m.message_count < p.max_messages OR p.when_full = 'drop_oldest')
            AND v_size <= p.max_message_bytes
        RETURNING m.id, m.message_count - p.max_messages, m.catchall_domain = '*', m.owner_type, m.owner_id
        INTO v_mailbox_id, v_over, v_sink, v_owner_type, v_owner_id;

        IF v_mailbox_id IS NOT NULL THEN
            INSERT INTO mailroom.messages (
                mailbox_id, raw, envelope_from, envelope_to, size_bytes, received_at, tags,
                -- the parsed fields, by name
                subject,
                from_header,
                reply_to,
                text_body,
                html_body,
                attachments
            )
            VALUES (
                v_mailbox_id, v_stored, coalesce(p_envelope_from, ''), btrim(p_address), v_stored_size, v_now,
                CASE WHEN v_tag IS NULL THEN '{}'::text[] ELSE ARRAY[v_tag] END,
                v_parsed ->> 'subject',
                v_parsed ->> 'from_header',
                v_parsed ->> 'reply_to',
                v_parsed ->> 'text_body',
                v_parsed ->> 'html_body',
                v_attachments
            )
            RETURNING id INTO v_message_id;
        END IF;

        IF v_over > 0 THEN
            -- bounded work per delivery: one message goes for the one stored; an inbox over its count by
            -- more (its plan's max_messages lowered) loses at most 10 a delivery until it is back under
            PERFORM mailroom_internal._let_oldest_go(v_mailbox_id, least(v_over, 10));
        END IF;
        IF v_sink THEN
            PERFORM mailroom_internal._sink_let_go(v_mailbox_id, 0);
        END IF;

        IF v_message_id IS NOT NULL THEN
            -- mailroom_inbox (issue 15) and, for existing listeners, mailroom_delivery: the same
            -- ids-only payload, delivered at commit, and only while someone listens (sql/08: a
            -- NOTIFY serializes the commits of every notifying transaction). No address or
            -- subject ever goes in it.
            v_payload := json_build_object('mailbox_id', v_mailbox_id, 'message_id', v_message_id)::text;
            PERFORM mailroom_internal._notify_each(ARRAY['mailroom_inbox', 'mailroom_delivery'], v_payload);
            -- webhooks (sql/38_outbound_webhooks.sql): message.received, queued in this transaction,
            -- for an API key's inbox whose owner registered an endpoint; one indexed look-up, and
            -- no statement at all for any other inbox
            IF v_owner_type IN ('api', 'mcp') THEN
                IF EXISTS (SELECT 1 FROM mailroom.webhook_endpoints AS w WHERE w.owner_id = v_owner_id) THEN
                    PERFORM mailroom_internal._webhook_message_received(
                        v_owner_id, btrim(p_address), v_message_id, v_now, v_stored_size, v_parsed
                    );
                END IF;
            END IF;
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

COMMENT ON FUNCTION mailroom.deliver_message(text, bytea, text, jsonb, text) IS
'Store a raw message and its parsed fields (p_parsed: one JSON object, read by name) for one recipient if its mailbox is open and within plan limits (the guard is the UPDATE of the mailbox''s count, under its row lock; box+tag@domain: in box@domain, tagged tag); p_trace: header lines stored in front of the message (deliver_messages'' Received:), not counted against the plan''s size limit; NOTIFY mailroom_inbox and mailroom_delivery with ids where someone listens (mailroom.listen); returns the message id. Errors: MR203 unknown, MR205 expired, MR206 deleted, MR207 too large, MR208 full, MR211 empty or malformed, MR285 a trace that is not header lines.';

GRANT EXECUTE ON FUNCTION mailroom.deliver_message(text, bytea, text, jsonb, text) TO mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom_internal._let_oldest_go(p_mailbox_id bigint, p_count integer)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
    v_bytes bigint;
BEGIN
    -- A full inbox of a drop_oldest plan (plans.when_full): its p_count oldest messages go (by id, the
    -- order they were stored in), their places and bytes freed. Called under the inbox's row lock
    -- (deliver_message's UPDATE), so the count is exact. How many went. The inbox's ids are read through
    -- (mailbox_id, received_at), at most its plan's count, then sorted (OFFSET 0: never the primary key's
    -- id order with a filter, which walks every older message of every inbox to reach this one's first).
    WITH gone AS (
        DELETE FROM mailroom.messages AS g
        WHERE g.mailbox_id = p_mailbox_id AND g.id IN (
            SELECT o.id
            FROM (SELECT o.id FROM mailroom.messages AS o WHERE o.mailbox_id = p_mailbox_id OFFSET 0) AS o
            ORDER BY o.id
            LIMIT p_count
        )
        RETURNING g.size_bytes
    )
    SELECT count(*), coalesce(sum(gone.size_bytes), 0) INTO v_n, v_bytes FROM gone;
    UPDATE mailroom.mailboxes AS m
    SET message_count = greatest(m.message_count - v_n, 0), stored_bytes = greatest(m.stored_bytes - v_bytes, 0)
    WHERE m.id = p_mailbox_id;
    RETURN v_n;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._let_oldest_go(bigint, integer) IS
'Internal: delete the p_count oldest messages of an inbox (a drop_oldest plan''s full inbox), freeing their places and bytes; how many.';

CREATE OR REPLACE FUNCTION mailroom_internal._parsed_document(
    p_subject text,
    p_from_header text,
    p_text_body text,
    p_html_body text,
    p_attachments jsonb
)
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT jsonb_build_object(
        'subject', p_subject, 'from_header', p_from_header, 'text_body', p_text_body,
        'html_body', p_html_body, 'attachments', p_attachments
    )
$$;

COMMENT ON FUNCTION mailroom_internal._parsed_document(text, text, text, text, jsonb) IS
'Internal, deprecated since 0.2.0, removed in 0.3.0 (for the field-by-field forms of deliver_message, deliver_messages and deliver_ses_message): their fields as the p_parsed document.';

-- The previous release's form (its inbound server and SES hook, during an upgrade): the parsed
-- fields one argument each. Deprecated since 0.2.0, removed in 0.3.0.
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
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailroom.deliver_message(
        p_address => p_address, p_raw => p_raw, p_envelope_from => p_envelope_from,
        p_parsed => mailroom_internal._parsed_document(p_subject, p_from_header, p_text_body, p_html_body, p_attachments)
    )
$$;

COMMENT ON FUNCTION mailroom.deliver_message(text, bytea, text, text, text, text, text, jsonb) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.deliver_message(p_address, p_raw, p_envelope_from, p_parsed jsonb); the parsed fields one argument each.';

GRANT EXECUTE ON FUNCTION mailroom.deliver_message(text, bytea, text, text, text, text, text, jsonb) TO mailroom_inbound;

-- The Received: trace header (RFC 5321 section 4.4) the inbound server's messages are stored with,
-- made from the facts of its SMTP session (deliver_messages reads them from the parsed document's
-- key "trace", set by the server, not parsed): the client's address, its HELO/EHLO name, the
-- server's name, whether it was EHLO, STARTTLS, AUTH, SMTPUTF8. The HELO name is the client's to
-- choose: only a domain's or an address literal's characters are kept, the rest (CR, LF, controls,
-- white space, parentheses, non-ASCII) written '?', at most 255, so it can never end the header or
-- start another.
CREATE OR REPLACE FUNCTION mailroom_internal._received_header(p_trace jsonb, p_for text, p_at timestamptz)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_helo text := regexp_replace(left(coalesce(p_trace ->> 'helo', ''), 255), '[^]A-Za-z0-9.:_[-]', '?', 'g');
    v_by text := regexp_replace(left(coalesce(p_trace ->> 'by', ''), 255), '[^]A-Za-z0-9.:_[-]', '?', 'g');
    v_client text := left(p_trace ->> 'client', 64);
    v_for text := regexp_replace(left(p_for, 320), '[[:cntrl:]<>]', '?', 'g');
    v_with text;
BEGIN
    -- the client as an address literal (no reverse lookup: its cost is a round trip per session)
    v_client := CASE
        WHEN v_client ~ '^[0-9]{1,3}(\.[0-9]{1,3}){3}$' THEN '[' || v_client || ']'
        WHEN v_client ~ '^[0-9A-Fa-f:.]+$' AND strpos(v_client, ':') > 0 THEN '[IPv6:' || lower(v_client) || ']'
        ELSE 'unknown'
    END;
    -- the protocol: RFC 3848 (ESMTP, ESMTPS, ESMTPA, ESMTPSA), RFC 6531 (UTF8SMTP…)
    v_with := CASE
        WHEN p_trace -> 'esmtp' IS DISTINCT FROM 'true'::jsonb THEN 'SMTP'
        ELSE
            CASE WHEN p_trace -> 'smtputf8' = 'true'::jsonb THEN 'UTF8SMTP' ELSE 'ESMTP' END
            || CASE WHEN p_trace -> 'tls' = 'true'::jsonb THEN 'S' ELSE '' END
            || CASE WHEN p_trace -> 'auth' = 'true'::jsonb THEN 'A' ELSE '' END
    END;
    RETURN 'Received: from ' || coalesce(nullif(v_helo, ''), 'unknown') || ' (' || v_client || ')'
        || E'\r\n\tby ' || coalesce(nullif(v_by, ''), 'unknown') || ' (mailroom) with ' || v_with
        -- an id of its own (shared by the copies of one message): 12 hex digits
        || ' id ' || upper(lpad(to_hex((random() * 281474976710655)::bigint), 12, '0'))
        -- for <recipient> only when the message has one (never the list of a message's recipients)
        || CASE WHEN v_for IS NULL THEN E';\r\n\t' ELSE E'\r\n\tfor <' || v_for || E'>; ' END
        || to_char(p_at AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS') || E' +0000\r\n';
END;
$$;

COMMENT ON FUNCTION mailroom_internal._received_header(jsonb, text, timestamptz) IS
'Internal: the Received: header (RFC 5321 4.4; RFC 3848 and 6531 protocol names) of a message stored over SMTP, from its session''s trace (client, helo, by, esmtp, tls, auth, smtputf8), for p_for when it has one recipient, dated p_at; every client-chosen value cleaned so it stays one header field.';

-- deliver_messages: the DATA step of `mailroom inbox serve`. Several messages (of several SMTP
-- sessions) in ONE statement, so one COMMIT stores them all (the server's group commit). Each
-- recipient row names its message by position in the message arrays, so a message's data is sent
-- once however many recipients it has. Each message is stored for all its recipients or for none
-- (a subtransaction each): one row per message with its ids, its verdict and the SMTP reply the
-- server sends (250 only for a stored message; a refusal's reply from mailroom.error_codes, chosen
-- by _delivery_refusal), or 'fault' with the reply of an inbox's injected fault at DATA (nothing
-- stored) or after DATA (stored: message_ids; sql/24_faults.sql), applied only when every recipient
-- of the message belongs to the fault's owner (else skipped, counted in faults_skipped). An error
-- that is no refusal of mail (error_codes has no reply for it)
-- fails the whole statement: then nothing of it is kept. p_receipt: the key of the receipt it leaves
-- (below), in the same transaction, so the server's DATA step is one autocommit statement.
CREATE OR REPLACE FUNCTION mailroom.deliver_messages(
    p_message integer[],
    p_address text[],
    p_raw bytea[],
    p_envelope_from text[],
    p_parsed jsonb[],
    p_receipt uuid DEFAULT null
)
RETURNS TABLE (message integer, message_ids bigint[], verdict text, reply text, faults_skipped integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_n integer := coalesce(cardinality(p_raw), 0);
    v_recipients text[];
    v_address text;
    v_state text;
    v_fault text;
    v_skipped integer;
    v_faults boolean;
    v_replies text[] := '{}';
    v_trace text;  -- the message's Received: header, when the server gave its session's trace
BEGIN
    IF p_message IS NULL OR p_address IS NULL OR cardinality(p_message) <> cardinality(p_address)
        OR coalesce(cardinality(p_envelope_from), 0) <> v_n OR coalesce(cardinality(p_parsed), 0) <> v_n
        OR EXISTS (SELECT 1 FROM unnest(p_message) AS m (i) WHERE m.i IS NULL OR m.i NOT BETWEEN 1 AND v_n) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR216',
            MESSAGE = 'deliver_messages: message arrays of one length, and a message position (1-based) for each recipient';
    END IF;
    -- whether any inbox has a fault (sql/24_faults.sql): once a statement, so mail for inboxes
    -- without one costs nothing more while no fault is set anywhere
    v_faults := EXISTS (SELECT 1 FROM mailroom.inbox_faults);
    FOR i IN 1..v_n LOOP
        message := i;
        v_recipients := ARRAY(
            SELECT r.address FROM unnest(p_message, p_address) WITH ORDINALITY AS r (m, address, k)
            WHERE r.m = i ORDER BY r.k
        );
        -- a fault at DATA (sql/24_faults.sql): the first recipient's inbox fault that answers
        -- refuses the message, before anything is stored, when every recipient is its owner's
        -- (else it is skipped and counted: one owner's fault never refuses another's copy)
        reply := NULL;
        faults_skipped := 0;
        IF v_faults THEN
            SELECT t.reply, t.skipped INTO reply, faults_skipped
            FROM mailroom_internal._transaction_fault(v_recipients, 'data') AS t;
        END IF;
        IF reply IS NOT NULL THEN
            message_ids := '{}';
            verdict := 'fault';
            v_replies := v_replies || reply;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- one Received: header per message (its copies alike), dated by mailroom.clock()
        v_trace := CASE WHEN jsonb_typeof(p_parsed[i] -> 'trace') = 'object' THEN
            mailroom_internal._received_header(
                p_parsed[i] -> 'trace',
                CASE WHEN cardinality(v_recipients) = 1 THEN v_recipients[1] END,
                mailroom.clock()
            )
        END;
        BEGIN
            message_ids := '{}';
            FOREACH v_address IN ARRAY v_recipients LOOP
                message_ids := message_ids || mailroom.deliver_message(
                    v_address, p_raw[i], p_envelope_from[i], p_parsed[i], v_trace
                );
            END LOOP;
            verdict := 'ok';
            reply := format('250 2.0.0 OK: stored for %s recipient(s)', cardinality(message_ids));
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE;
            IF mailroom_internal._code_reply(v_state) IS NULL THEN
                RAISE;  -- not a refusal of mail
            END IF;
            message_ids := '{}';
            SELECT r.verdict, r.reply INTO verdict, reply
            FROM mailroom_internal._delivery_refusal(v_recipients, octet_length(p_raw[i]), v_state) AS r;
        END;
        IF verdict = 'ok' AND v_faults THEN
            -- a fault after DATA: stored (message_ids), then answered the fault's reply; as at
            -- DATA, only when every recipient is the fault's owner's (else the retry it asks for
            -- would store another owner's copy twice)
            SELECT t.reply, t.skipped INTO v_fault, v_skipped
            FROM mailroom_internal._transaction_fault(v_recipients, 'after_data') AS t;
            faults_skipped := faults_skipped + v_skipped;
            IF v_fault IS NOT NULL THEN
                verdict := 'fault';
                reply := v_fault;
            END IF;
        END IF;
        v_replies := v_replies || reply;
        RETURN NEXT;
    END LOOP;
    -- the receipt the inbound server asked for (p_receipt, or set_delivery_receipt earlier in this
    -- transaction), in this same transaction
    PERFORM mailroom_internal._record_delivery_receipt(v_replies, p_receipt);
END;
$$;

COMMENT ON FUNCTION mailroom.deliver_messages(integer[], text[], bytea[], text[], jsonb[], uuid) IS
'The inbound DATA step: deliver_message for every (message, recipient) with its parsed document (its key trace, the SMTP session''s facts, makes the stored copy''s Received: header), each message for all its recipients or none; one row per message: its ids, verdict (ok, a refusing recipient verdict, retry, fault (an injected fault, applied only when every recipient is the fault owner''s: stored only after DATA), or the code of a refusal of the message itself), the SMTP reply to send and faults_skipped (the DATA-stage faults not applied because a recipient is another owner''s); leaves a receipt of the replies under p_receipt (or the key set_delivery_receipt gave), for settle_delivery (MR216 bad arrays).';

GRANT EXECUTE ON FUNCTION mailroom.deliver_messages(integer[], text[], bytea[], text[], jsonb[], uuid) TO mailroom_inbound;

-- The previous release's form (its inbound server, during an upgrade): the parsed fields one array
-- each. Deprecated since 0.2.0, removed in 0.3.0.
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
RETURNS TABLE (message integer, message_ids bigint[], verdict text, reply text)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer := coalesce(cardinality(p_raw), 0);
BEGIN
    IF coalesce(cardinality(p_subject), 0) <> v_n OR coalesce(cardinality(p_from_header), 0) <> v_n
        OR coalesce(cardinality(p_text_body), 0) <> v_n OR coalesce(cardinality(p_html_body), 0) <> v_n
        OR coalesce(cardinality(p_attachments), 0) <> v_n THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR216',
            MESSAGE = 'deliver_messages: message arrays of one length, and a message position (1-based) for each recipient';
    END IF;
    RETURN QUERY SELECT d.message, d.message_ids, d.verdict, d.reply FROM mailroom.deliver_messages(
        p_message => p_message, p_address => p_address, p_raw => p_raw, p_envelope_from => p_envelope_from,
        p_parsed => ARRAY(
            SELECT mailroom_internal._parsed_document(
                p_subject[i], p_from_header[i], p_text_body[i], p_html_body[i], p_attachments[i]
            )
            FROM generate_series(1, v_n) AS i ORDER BY i
        )
    ) AS d;
END;
$$;

COMMENT ON FUNCTION mailroom.deliver_messages(
    integer[], text[], bytea[], text[], text[], text[], text[], text[], jsonb[]
) IS
'Deprecated since 0.2.0, removed in 0.3.0: use mailroom.deliver_messages(p_message, p_address, p_raw, p_envelope_from, p_parsed jsonb[]); the parsed fields one array each (MR216 bad arrays).';

GRANT EXECUTE ON FUNCTION mailroom.deliver_messages(
    integer[], text[], bytea[], text[], text[], text[], text[], text[], jsonb[]
) TO mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom_internal._delivery_refusal(p_addresses text[], p_size bigint, p_code text)
RETURNS TABLE (verdict text, reply text)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_verdict text := (SELECT e.verdict FROM mailroom.error_codes AS e WHERE e.code = p_code);
    v_verdicts text[];
    v_first text;
BEGIN
    -- A message refused at DATA (nothing of it was kept). With one recipient, or a refusal of the
    -- message itself (MR211, empty), the refusal's own reply. With several, the verdicts of all of
    -- them now: when none refuses any more (a concurrent change), or each refusal is one RCPT would
    -- now give (anything but too_large, which only DATA knows) while another recipient would take the
    -- message, a retry of the transaction stores it for the others: 451 4.2.0. Else the reply of the
    -- first refused recipient.
    IF cardinality(p_addresses) <= 1 OR v_verdict IS NULL THEN
        verdict := coalesce(v_verdict, p_code);  -- a refusal of the message itself: its code
        reply := mailroom_internal._code_reply(p_code);
        RETURN NEXT;
        RETURN;
    END IF;
    v_verdicts := ARRAY(
        SELECT c.verdict
        FROM unnest(p_addresses) WITH ORDINALITY AS a (address, k)
        CROSS JOIN LATERAL mailroom.check_recipient(a.address, p_size) AS c
        ORDER BY a.k
    );
    v_first := (SELECT v.verdict FROM unnest(v_verdicts) WITH ORDINALITY AS v (verdict, k)
                WHERE v.verdict <> 'ok' ORDER BY v.k LIMIT 1);
    IF v_first IS NULL OR ('ok' = ANY(v_verdicts) AND 'too_large' <> ALL(v_verdicts)) THEN
        verdict := 'retry';
        reply := '451 4.2.0 A recipient became unavailable; please try again';
    ELSE
        verdict := v_first;
        reply := mailroom_internal._verdict_reply(v_first);
    END IF;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._delivery_refusal(text[], bigint, text) IS
'Internal: the verdict and SMTP reply of a message deliver_messages could not store (p_code: the refusal that stopped it): the refusal''s reply, or 451 4.2.0 when a retry would succeed for the other recipients.';

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

-- Delivery receipts (issue 34): an answer lost after the delivering statement was sent is not a
-- possible duplicate. The inbound server passes its key to deliver_messages (p_receipt), which
-- records the receipt in the statement's own transaction: one autocommit statement, one round trip
-- (set_delivery_receipt(key) before deliver_messages in one transaction does the same for a
-- caller that does not pass it); the receipt holds the replies decided. When the
-- answer is lost, settle_delivery(key) on another connection tells what was decided, and makes it
-- final: where no receipt is there yet it leaves a tombstone, so the statement, were it still
-- running, cannot commit (its receipt's key is taken). A settle that meets the receipt of a
-- transaction in flight waits for it (a unique key's insert waits for the inserting transaction).
CREATE OR REPLACE FUNCTION mailroom.set_delivery_receipt(p_key uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_key IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MR217', MESSAGE = 'set_delivery_receipt: a receipt needs a key';
    END IF;
    -- transaction-local: only a deliver_messages of this same transaction reads it
    PERFORM pg_catalog.set_config('mailroom.delivery_receipt', p_key::text, true);
END;
$$;

COMMENT ON FUNCTION mailroom.set_delivery_receipt(uuid) IS
'The deliver_messages call that follows in this transaction leaves a receipt under p_key (its replies), for settle_delivery after a lost answer (MR217 no key).';

GRANT EXECUTE ON FUNCTION mailroom.set_delivery_receipt(uuid) TO mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom_internal._record_delivery_receipt(p_replies text[], p_key uuid)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_asked text := nullif(pg_catalog.current_setting('mailroom.delivery_receipt', true), '');
    v_key uuid := coalesce(p_key, v_asked::uuid);
BEGIN
    IF v_asked IS NOT NULL THEN
        PERFORM pg_catalog.set_config('mailroom.delivery_receipt', '', true);  -- one receipt per key
    END IF;
    IF v_key IS NULL THEN
        RETURN;  -- not asked for (psql, the SES hook, a test)
    END IF;
    -- a tombstone under the key (settle_delivery came first): unique_violation, nothing commits
    INSERT INTO mailroom.delivery_receipts (key, replies, created_at)
    VALUES (v_key, p_replies, mailroom.clock());
END;
$$;

COMMENT ON FUNCTION mailroom_internal._record_delivery_receipt(text[], uuid) IS
'Internal: the receipt of a delivering statement (its replies) under p_key, or under the key set_delivery_receipt gave in this transaction when p_key is null; fails when settle_delivery took the key first.';

CREATE OR REPLACE FUNCTION mailroom.settle_delivery(p_key uuid)
RETURNS text[]
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_replies text[];
BEGIN
    IF p_key IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MR217', MESSAGE = 'settle_delivery: a receipt needs a key';
    END IF;
    -- a receipt of a transaction in flight makes this insert wait for its end
    INSERT INTO mailroom.delivery_receipts AS r (key, replies, created_at)
    VALUES (p_key, null, mailroom.clock())
    ON CONFLICT (key) DO NOTHING;
    IF FOUND THEN
        RETURN null;  -- nothing was delivered under the key, and now nothing can be
    END IF;
    SELECT r.replies INTO v_replies FROM mailroom.delivery_receipts AS r WHERE r.key = p_key;
    RETURN v_replies;  -- NULL: an earlier settle's tombstone
END;
$$;

COMMENT ON FUNCTION mailroom.settle_delivery(uuid) IS
'After a lost answer: the replies deliver_messages decided under receipt p_key, in message order, or NULL when nothing was delivered under it (then nothing can be any more) (MR217 no key).';

GRANT EXECUTE ON FUNCTION mailroom.settle_delivery(uuid) TO mailroom_inbound;
