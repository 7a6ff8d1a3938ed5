-- enqueue_message: validate, insert a queued row (idempotent on p_idempotency_key within the
-- application's scope), NOTIFY channel mailroom_outbound with the new id only. mailroom's own
-- emails go through _enqueue_message with scope 'mailroom'.

CREATE OR REPLACE FUNCTION mailroom_internal._header_breaking_chars()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    -- The characters no header line may hold, as a regular-expression bracket: every control
    -- character except HTAB (C0 U+0001-U+0008 and U+000A-U+001F, DEL, C1 U+0080-U+009F with
    -- U+0085 NEL) and the Unicode line and paragraph separators U+2028, U+2029. A mail library
    -- or relay may take any of them for a line end, so one in a subject or header value could
    -- start a header of its own.
    SELECT '[\u0001-\u0008\u000A-\u001F\u007F-\u009F\u2028\u2029]'::text;
$$;

COMMENT ON FUNCTION mailroom_internal._header_breaking_chars() IS
'Internal: regular-expression bracket of the characters refused in header lines (controls but HTAB, U+2028, U+2029).';

CREATE OR REPLACE FUNCTION mailroom_internal._check_recipients(p_kind text, p_addresses text[])
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_i integer;
BEGIN
    FOR v_i IN 1 .. coalesce(cardinality(p_addresses), 0) LOOP
        IF NOT mailroom_internal._is_valid_address(p_addresses[v_i]) THEN
            -- never echo the address itself
            RAISE EXCEPTION USING
                ERRCODE = 'MR303',
                MESSAGE = format('%s[%s] is not a valid email address', p_kind, v_i);
        END IF;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION mailroom_internal._check_extra_headers(p_headers jsonb)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_name text;
    v_value jsonb;
BEGIN
    IF p_headers IS NULL OR jsonb_typeof(p_headers) <> 'object' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR308',
            MESSAGE = 'extra headers must be a JSON object of header name to string value';
    END IF;
    FOR v_name, v_value IN SELECT h.key, h.value FROM jsonb_each(p_headers) AS h LOOP
        IF v_name !~ '^[!-9;-~]{1,76}$' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR308',
                MESSAGE = format(
                    'extra header name %s is not a valid header field name', quote_literal(left(v_name, 40))
                );
        END IF;
        -- what mailroom sets, and the trace and authentication fields a submitter must not forge
        -- (a DKIM-Signature or Authentication-Results of its choosing, a Received: or Resent- block)
        IF lower(v_name) IN (
            'from', 'to', 'cc', 'bcc', 'subject', 'date', 'message-id', 'sender',
            'mime-version', 'content-type', 'content-transfer-encoding', 'content-disposition',
            'dkim-signature', 'received', 'return-path', 'authentication-results', 'arc-seal',
            'arc-message-signature', 'arc-authentication-results'
        ) OR lower(v_name) LIKE 'resent-%' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR308',
                MESSAGE = format('extra header %s is set by mailroom and cannot be overridden', v_name);
        END IF;
        IF jsonb_typeof(v_value) <> 'string'
            OR v_value #>> '{}' ~ mailroom_internal._header_breaking_chars()
            OR length(v_value #>> '{}') > 998 THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR308',
                MESSAGE = format(
                    'extra header %s must be a string of at most 998 characters without line breaks '
                    || 'or control characters (TAB allowed)',
                    v_name
                );
        END IF;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION mailroom_internal._outbound_attachments(p_attachments jsonb)
RETURNS mailroom.outbound_attachment[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_result mailroom.outbound_attachment[] := '{}';
    v_item jsonb;
    v_name text;
    v_type text;
    v_content bytea;
    v_position integer := 0;
BEGIN
    -- [{"name": …, "content_type": …, "content_base64": …}, …] → the attachments of a message,
    -- or MR385 naming the position (never a name or a byte). NULL or [] → NULL (none).
    IF p_attachments IS NULL OR p_attachments = '[]'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_attachments) <> 'array' OR jsonb_array_length(p_attachments) > 20 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR385',
            MESSAGE = 'attachments must be a JSON array of at most 20 objects';
    END IF;
    FOR v_item IN SELECT e.value FROM jsonb_array_elements(p_attachments) AS e LOOP
        v_position := v_position + 1;
        IF jsonb_typeof(v_item) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = 'MR385', MESSAGE = format('attachment %s is not an object', v_position);
        END IF;
        v_name := v_item ->> 'name';
        v_type := lower(v_item ->> 'content_type');
        -- a file name, not a path, on one line: what a mail client saves it as
        IF v_name IS NULL OR length(v_name) NOT BETWEEN 1 AND 255 OR v_name ~ '[\x00-\x1f\x7f/\\]'
            OR btrim(v_name) IN ('', '.', '..') THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR385',
                MESSAGE = format(
                    'attachment %s: the name must be 1-255 characters, no path separator or control character',
                    v_position
                );
        END IF;
        -- RFC 2045 type/subtype tokens
        IF v_type IS NULL OR v_type !~ '^[a-z0-9!#$&^_.+-]{1,64}/[a-z0-9!#$&^_.+-]{1,64}$'
            OR split_part(v_type, '/', 1) = 'multipart' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR385',
                MESSAGE = format('attachment %s: the content type must be type/subtype (not multipart)', v_position);
        END IF;
        BEGIN
            v_content := decode(v_item ->> 'content_base64', 'base64');
        EXCEPTION
            WHEN invalid_parameter_value OR invalid_text_representation THEN
                v_content := NULL;
        END;
        IF v_content IS NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR385',
                MESSAGE = format('attachment %s: content_base64 must be base64', v_position);
        END IF;
        v_result := v_result || ROW(v_name, v_type, v_content)::mailroom.outbound_attachment;
    END LOOP;
    RETURN v_result;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._outbound_attachments(jsonb) IS
'Internal: the attachments of a message from [{"name", "content_type", "content_base64"}] (NULL for none); MR385 names the position of a bad one.';

CREATE OR REPLACE FUNCTION mailroom_internal._attachments_json(p_attachments mailroom.outbound_attachment[])
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    -- what the claim hands the sender: [{"name", "content_type", "content_base64"}] in order
    SELECT jsonb_agg(
        jsonb_build_object('name', a.name, 'content_type', a.content_type, 'content_base64', encode(a.content, 'base64'))
        ORDER BY a.n
    )
    FROM unnest(p_attachments) WITH ORDINALITY AS a (name, content_type, content, n);
$$;

COMMENT ON FUNCTION mailroom_internal._attachments_json(mailroom.outbound_attachment[]) IS
'Internal: a message''s attachments as the claim returns them, [{"name", "content_type", "content_base64"}] (NULL: none).';

CREATE OR REPLACE FUNCTION mailroom_internal._attachments_without(
    p_attachments mailroom.outbound_attachment[], p_address text
)
RETURNS mailroom.outbound_attachment[]
LANGUAGE sql
IMMUTABLE
STRICT
SET search_path = pg_catalog, pg_temp
AS $$
    -- the attachments whose name and bytes do not hold p_address (case-insensitive; bytes
    -- compared in their escape form, where an ASCII address reads as itself); NULL when none is left
    SELECT array_agg(ROW(a.name, a.content_type, a.content)::mailroom.outbound_attachment ORDER BY a.n)
    FROM unnest(p_attachments) WITH ORDINALITY AS a (name, content_type, content, n)
    WHERE strpos(lower(a.name), lower(p_address)) = 0
        AND strpos(lower(encode(a.content, 'escape')), lower(p_address)) = 0;
$$;

COMMENT ON FUNCTION mailroom_internal._attachments_without(mailroom.outbound_attachment[], text) IS
'Internal (erasure): the attachments whose name and bytes do not contain p_address; NULL if none is left.';

CREATE OR REPLACE FUNCTION mailroom_internal._enqueue_message(
    p_scope text,
    p_sender text,
    p_to text[],
    p_subject text,
    p_text_body text,
    p_html_body text DEFAULT null,
    p_cc text[] DEFAULT '{}',
    p_bcc text[] DEFAULT '{}',
    p_headers jsonb DEFAULT '{}',
    p_idempotency_key text DEFAULT null,
    p_send_after timestamptz DEFAULT null,
    p_token_id bigint DEFAULT null,
    p_priority integer DEFAULT null,
    p_attachments jsonb DEFAULT null
)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_attachments mailroom.outbound_attachment[] := mailroom_internal._outbound_attachments(p_attachments);
    v_priority integer;
    v_sender_id bigint;
    v_from text;
    v_to text [] := coalesce(p_to, '{}');
    v_cc text [] := coalesce(p_cc, '{}');
    v_bcc text [] := coalesce(p_bcc, '{}');
    v_headers jsonb := coalesce(p_headers, '{}');
    v_count integer;
    v_size bigint;
    v_id bigint;
    v_suppressed text [];
BEGIN
    -- p_scope is the namespace of p_idempotency_key: 'app' for enqueue_message, 'mailroom' for
    -- mailroom's own emails, so neither can take the other's key.
    IF p_scope IS NULL OR p_scope NOT IN ('app', 'mailroom') THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'idempotency scope must be app or mailroom';
    END IF;
    SELECT s.id, s.from_address INTO v_sender_id, v_from
    FROM mailroom.senders AS s
    WHERE s.name = p_sender;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR301',
            MESSAGE = format('unknown sender %s', coalesce(quote_literal(p_sender), 'NULL'));
    END IF;

    IF p_idempotency_key IS NOT NULL THEN
        IF length(p_idempotency_key) NOT BETWEEN 1 AND 200 THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR309',
                MESSAGE = 'idempotency key must be 1-200 characters';
        END IF;
        -- The key is claimed in mailroom.outbound_idempotency_keys (unique across the time
        -- partitions of outbound_messages); a concurrent caller with the same key waits here for
        -- the first one's commit, then returns its message. A key whose message was purged is free.
        INSERT INTO mailroom.outbound_idempotency_keys AS k (scope, key, created_at)
        VALUES (p_scope, p_idempotency_key, mailroom.clock())
        ON CONFLICT (scope, key) DO NOTHING;
        IF NOT FOUND THEN
            SELECT k.message_id INTO v_id
            FROM mailroom.outbound_idempotency_keys AS k
            WHERE k.scope = p_scope AND k.key = p_idempotency_key
            FOR UPDATE;
            IF EXISTS (SELECT 1 FROM mailroom.outbound_messages AS m WHERE m.id = v_id) THEN
                RETURN v_id;
            END IF;
        END IF;
    END IF;

    v_count := cardinality(v_to) + cardinality(v_cc) + cardinality(v_bcc);
    IF v_count = 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR302',
            MESSAGE = 'a message needs at least one recipient (to, cc or bcc)';
    END IF;
    IF v_count > mailroom.setting('outbound.max_recipients')::integer THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR304',
            MESSAGE = format(
                'too many recipients: %s (outbound.max_recipients is %s)',
                v_count, mailroom.setting('outbound.max_recipients')
            );
    END IF;
    PERFORM mailroom_internal._check_recipients('to', v_to);
    PERFORM mailroom_internal._check_recipients('cc', v_cc);
    PERFORM mailroom_internal._check_recipients('bcc', v_bcc);

    IF p_subject IS NULL OR p_subject ~ mailroom_internal._header_breaking_chars() OR length(p_subject) > 998 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR305',
            MESSAGE = 'subject must be at most 998 characters without line breaks or control characters '
            || '(TAB allowed), not NULL';
    END IF;
    -- a token email (p_token_id, enqueue_token_emails) has no body at rest: claim_messages renders
    -- it, with a freshly minted link, at each delivery attempt
    IF p_text_body IS NULL AND p_html_body IS NULL AND p_token_id IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR307',
            MESSAGE = 'a message needs a text body or an HTML body';
    END IF;
    PERFORM mailroom_internal._check_extra_headers(v_headers);
    -- higher first; mailroom's own emails (activation, recovery) take the setting collector.priority
    v_priority := coalesce(
        p_priority, CASE WHEN p_scope = 'mailroom' THEN mailroom.setting('collector.priority')::integer ELSE 0 END
    );
    IF v_priority NOT BETWEEN -10 AND 10 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR326',
            MESSAGE = format('priority must be between -10 (last) and 10 (first), got %s', v_priority);
    END IF;
    IF NOT isfinite(p_send_after) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR317',
            MESSAGE = 'send_after must be a finite time (NULL: as soon as possible), not infinity or -infinity';
    END IF;

    v_size := octet_length(p_subject)
        + coalesce(octet_length(p_text_body), 0)
        + coalesce(octet_length(p_html_body), 0)
        + octet_length(v_headers::text)
        + coalesce((SELECT sum(octet_length(a.content)) FROM unnest(v_attachments) AS a), 0);
    IF v_size > mailroom.setting('outbound.max_message_bytes')::bigint THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR306',
            MESSAGE = format(
                'message too large: %s bytes (outbound.max_message_bytes is %s)',
                v_size, mailroom.setting('outbound.max_message_bytes')
            );
    END IF;

    -- The suppression list (sql/38_outbound_suppressions.sql): a suppressed recipient refuses
    -- the message (MR318, naming its position), or with outbound.drop_suppressed_recipients is
    -- dropped; the positions dropped are kept in suppressed_recipients and reported in a NOTICE,
    -- and a message with no recipient left is refused.
    -- (one _suppressed_flags call for every recipient: one HMAC batch, one index probe)
    v_suppressed := mailroom_internal._suppressed_recipients(v_to, v_cc, v_bcc);
    IF cardinality(v_suppressed) > 0 THEN
        IF NOT mailroom.setting('outbound.drop_suppressed_recipients')::boolean THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR318',
                MESSAGE = format('%s is on the suppression list', v_suppressed[1]),
                HINT = 'outbound.drop_suppressed_recipients = true drops suppressed recipients instead';
        END IF;
        v_to := mailroom_internal._without_suppressed(v_to);
        v_cc := mailroom_internal._without_suppressed(v_cc);
        v_bcc := mailroom_internal._without_suppressed(v_bcc);
        IF cardinality(v_to) + cardinality(v_cc) + cardinality(v_bcc) = 0 THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR318',
                MESSAGE = 'every recipient is on the suppression list';
        END IF;
        RAISE NOTICE USING
            MESSAGE = format(
                'suppressed recipients dropped: %s', array_to_string(v_suppressed, ', ')
            );
    END IF;

    INSERT INTO mailroom.outbound_messages AS m (
        sender_id, to_addrs, cc_addrs, bcc_addrs, subject, text_body, html_body, headers,
        message_id, next_retry_at, send_after, idempotency_scope, idempotency_key, created_at, updated_at,
        suppressed_recipients,
        -- the domain the domain limits count it against (sql/39_outbound_domain_limits.sql)
        rcpt_domain,
        token_id,
        priority,
        attachments
    )
    VALUES (
        v_sender_id, v_to, v_cc, v_bcc, p_subject, p_text_body, p_html_body, v_headers,
        '<' || replace(pg_catalog.gen_random_uuid()::text, '-', '') || '@' || split_part(v_from, '@', 2) || '>',
        p_send_after, p_send_after, p_scope, p_idempotency_key, mailroom.clock(), mailroom.clock(),
        v_suppressed,
        mailroom_internal._recipient_domain(v_to, v_cc, v_bcc),
        p_token_id,
        v_priority,
        v_attachments
    )
    RETURNING m.id INTO v_id;

    IF p_idempotency_key IS NOT NULL THEN
        UPDATE mailroom.outbound_idempotency_keys AS k
        SET message_id = v_id, created_at = mailroom.clock()
        WHERE k.scope = p_scope AND k.key = p_idempotency_key;
    END IF;

    PERFORM pg_notify('mailroom_outbound', v_id::text);
    RETURN v_id;
END;
$$;

CREATE OR REPLACE FUNCTION mailroom.enqueue_message(
    p_sender text,
    p_to text[],
    p_subject text,
    p_text_body text,
    p_html_body text DEFAULT null,
    p_cc text[] DEFAULT '{}',
    p_bcc text[] DEFAULT '{}',
    p_headers jsonb DEFAULT '{}',
    p_idempotency_key text DEFAULT null,
    p_send_after timestamptz DEFAULT null,
    p_priority integer DEFAULT 0
)
RETURNS bigint
LANGUAGE sql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- The application's messages: idempotency keys in scope 'app'.
    SELECT mailroom_internal._enqueue_message(
        'app', p_sender, p_to, p_subject, p_text_body, p_html_body, p_cc, p_bcc, p_headers,
        p_idempotency_key, p_send_after, p_priority => coalesce(p_priority, 0)
    );
$$;

COMMENT ON FUNCTION mailroom.enqueue_message(
    text, text[], text, text, text, text[], text[], jsonb, text, timestamptz, integer
) IS
'Validate and queue a message for a sender (p_priority -10 last to 10 first, 0 by default); same idempotency key returns the same id; NOTIFY mailroom_outbound (id).';

GRANT EXECUTE ON FUNCTION mailroom.enqueue_message(
    text, text[], text, text, text, text[], text[], jsonb, text, timestamptz, integer
) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom.enqueue_message_with_attachments(
    p_sender text,
    p_to text[],
    p_subject text,
    p_text_body text,
    p_attachments jsonb,
    p_html_body text DEFAULT null,
    p_cc text[] DEFAULT '{}',
    p_bcc text[] DEFAULT '{}',
    p_headers jsonb DEFAULT '{}',
    p_idempotency_key text DEFAULT null,
    p_send_after timestamptz DEFAULT null,
    p_priority integer DEFAULT 0,
    p_bulk boolean DEFAULT false
)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    -- enqueue_message (p_bulk: enqueue_bulk_message) with attachments; the sender builds
    -- multipart/mixed around the body
    v_id := mailroom_internal._enqueue_message(
        'app', p_sender, p_to, p_subject, p_text_body, p_html_body, p_cc, p_bcc, p_headers,
        p_idempotency_key, p_send_after, p_priority => coalesce(p_priority, 0), p_attachments => p_attachments
    );
    IF coalesce(p_bulk, false) THEN
        PERFORM mailroom_internal._mark_bulk(v_id);  -- sql/36, as enqueue_bulk_message
    END IF;
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom.enqueue_message_with_attachments(
    text, text[], text, text, jsonb, text, text[], text[], jsonb, text, timestamptz, integer, boolean
) IS
'enqueue_message with attachments (p_attachments: [{"name", "content_type", "content_base64"}], at most 20, counted in '
'outbound.max_message_bytes); p_bulk: as enqueue_bulk_message (List-Unsubscribe). Errors as enqueue_message, and MR385 '
'a bad attachment, MR306 too large.';

GRANT EXECUTE ON FUNCTION mailroom.enqueue_message_with_attachments(
    text, text[], text, text, jsonb, text, text[], text[], jsonb, text, timestamptz, integer, boolean
) TO mailroom_app;

COMMENT ON FUNCTION mailroom_internal._enqueue_message(
    text, text, text[], text, text, text, text[], text[], jsonb, text, timestamptz, bigint, integer, jsonb
) IS
'Internal: validate and queue a message, idempotent on (p_scope, p_idempotency_key), at p_priority (NULL: 0, or '
'collector.priority for mailroom''s own emails); NOTIFY mailroom_outbound (id); p_token_id: a token email, its bodies '
'rendered at claim; p_attachments: see _outbound_attachments.';

COMMENT ON FUNCTION mailroom_internal._check_recipients(text, text[]) IS
'Internal: raise MR303 naming the position (never the value) of an invalid address.';

COMMENT ON FUNCTION mailroom_internal._check_extra_headers(jsonb) IS
'Internal: raise MR308 unless extra headers are an object of valid names to single-line strings.';
