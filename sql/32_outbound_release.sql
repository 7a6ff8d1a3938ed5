-- Release a captured message (issue 35, item 4; docs/outbound.md, "Releasing a captured message"):
-- an inbox's message, its stored bytes as received with a Resent- block prepended (RFC 5322
-- section 3.6.6: Resent-Date, Resent-From, Resent-To, Resent-Message-ID), is queued for a chosen
-- address through one of mailroom's senders by _enqueue_message, so it is validated, suppressed,
-- retried, logged and finalized like any other message; the row's raw_message holds the bytes the
-- sender sends as they are. Who may: the setting release.senders names the senders (empty: release
-- is off), release.owner_types the owner types of the inboxes (api,mcp by default: an anonymous
-- inbox is anyone's who reached the HTTP face). mailroom_http reaches it only through
-- http_release_message (sql/29_http.sql), with the HTTP face's owner rule.
-- Errors: MR395 release off, MR396 sender not allowed, MR397 owner type not allowed; those of
-- _authorize_mailbox (MR203-MR206) and MR209; those of _enqueue_message (MR301 unknown sender, MR303
-- bad address, MR318 suppressed); MR306 when the bytes exceed outbound.max_message_bytes.

CREATE OR REPLACE FUNCTION mailroom._setting_list(p_name text)
RETURNS text[]
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- a comma-separated setting as its items, trimmed, empty ones left out, in order
    SELECT coalesce(array_agg(btrim(i.item) ORDER BY i.n) FILTER (WHERE btrim(i.item) <> ''), '{}')
    FROM regexp_split_to_table(mailroom.setting(p_name), ',') WITH ORDINALITY AS i (item, n)
$$;

COMMENT ON FUNCTION mailroom._setting_list(text) IS
'Internal: a comma-separated setting (release.senders, release.owner_types) as a text array, items trimmed, empty ones dropped.';

CREATE OR REPLACE FUNCTION mailroom._resent_block(
    p_date timestamptz,
    p_from text,
    p_to text,
    p_message_id text,
    p_eol text DEFAULT E'\r\n'
)
RETURNS bytea
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- RFC 5322 section 3.6.6: the resent fields as one block, prepended to the message as received;
    -- the date in UTC in the RFC 5322 form (English day and month names: to_char without TM)
    SELECT convert_to(
        'Resent-Date: ' || to_char(p_date AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS') || ' +0000' || p_eol
        || 'Resent-From: ' || p_from || p_eol
        || 'Resent-To: ' || p_to || p_eol
        || 'Resent-Message-ID: ' || p_message_id || p_eol,
        'UTF8'
    )
$$;

COMMENT ON FUNCTION mailroom._resent_block(timestamptz, text, text, text, text) IS
'Internal: the Resent-Date, Resent-From, Resent-To and Resent-Message-ID fields (RFC 5322 3.6.6) as bytes, each line ended by p_eol.';

CREATE OR REPLACE FUNCTION mailroom.release_options()
RETURNS jsonb
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- what a release form offers: whether release is on, and the senders it may name
    SELECT jsonb_build_object(
        'enabled', cardinality(mailroom._setting_list('release.senders')) > 0,
        'senders', to_jsonb(mailroom._setting_list('release.senders'))
    )
$$;

COMMENT ON FUNCTION mailroom.release_options() IS
'GET /api/v1/release: {"enabled": bool, "senders": [name]}, from the setting release.senders (empty: release is off).';

GRANT EXECUTE ON FUNCTION mailroom.release_options() TO mailroom_app, mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.release_message(
    p_address text,
    p_session_token text,
    p_message_id bigint,
    p_to text,
    p_sender text DEFAULT null,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes := mailroom._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id);
    v_senders text [] := mailroom._setting_list('release.senders');
    v_sender text := coalesce(p_sender, v_senders[1]);
    v_message mailroom.messages;
    v_to text := btrim(p_to);
    v_from text;
    v_id bigint;
    v_created timestamptz;
    v_message_id text;
    v_raw bytea;
    v_eol text;
BEGIN
    IF cardinality(v_senders) = 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR395',
            MESSAGE = 'release is off (the setting release.senders names no sender)';
    END IF;
    IF NOT v_box.owner_type::text = ANY (mailroom._setting_list('release.owner_types')) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR397',
            MESSAGE = format('messages of %s inboxes may not be released (release.owner_types)', v_box.owner_type);
    END IF;
    IF NOT v_sender = ANY (v_senders) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR396',
            MESSAGE = format('sender %s may not release messages (release.senders)', quote_literal(left(v_sender, 63)));
    END IF;
    -- the message of this inbox (MR209 otherwise: the inbox area's rule, sql/25_waiting.sql)
    v_message := mailroom._readable_message(p_address, p_session_token, p_message_id, p_owner_type, p_owner_id);
    -- the row: the original's subject and text (what the operator's view shows, and what a sender
    -- of the previous release, which knows no raw_message, would send), validated, suppressed
    -- (MR318) and queued by the one enqueue path
    v_id := mailroom._enqueue_message(
        'app', v_sender, ARRAY[v_to],
        left(regexp_replace(coalesce(v_message.subject, ''), mailroom._header_breaking_chars(), ' ', 'g'), 998),
        coalesce(v_message.text_body, ''), v_message.html_body
    );
    SELECT m.message_id, m.created_at INTO v_message_id, v_created
    FROM mailroom.outbound_messages AS m WHERE m.id = v_id;
    SELECT s.from_address INTO v_from FROM mailroom.senders AS s WHERE s.name = v_sender;
    -- the block's line ends are the message's own (CRLF as received over SMTP; LF if it has no CR)
    v_eol := CASE WHEN position('\x0d0a'::bytea IN v_message.raw) = 0 AND position('\x0a'::bytea IN v_message.raw) > 0
        THEN E'\n' ELSE E'\r\n' END;
    v_raw := mailroom._resent_block(mailroom.clock(), v_from, v_to, v_message_id, v_eol) || v_message.raw;
    IF octet_length(v_raw) > mailroom.setting('outbound.max_message_bytes')::bigint THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR306',
            MESSAGE = format(
                'message too large: %s bytes (outbound.max_message_bytes is %s)',
                octet_length(v_raw), mailroom.setting('outbound.max_message_bytes')
            );
    END IF;
    UPDATE mailroom.outbound_messages AS m SET raw_message = v_raw WHERE m.id = v_id AND m.created_at = v_created;
    RETURN jsonb_build_object('outbound_id', v_id, 'to', v_to, 'sender', v_sender);
END;
$$;

COMMENT ON FUNCTION mailroom.release_message(text, text, bigint, text, text, text, text) IS
'Release a captured message: its bytes as received, with Resent-Date/-From/-To/-Message-ID prepended, queued for p_to through p_sender (default: the first of release.senders); {"outbound_id", "to", "sender"}. Errors: MR395 off, MR396 sender, MR397 owner type, MR203-MR209, MR301, MR303, MR306, MR318.';

GRANT EXECUTE ON FUNCTION mailroom.release_message(text, text, bigint, text, text, text, text) TO mailroom_app;
