-- Release a captured message (issue 35, item 4; docs/outbound.md, "Releasing a captured message"):
-- an inbox's message, its stored bytes as received with a Resent- block prepended (RFC 5322
-- section 3.6.6: Resent-Date, Resent-From, Resent-To, Resent-Message-ID), is queued for a chosen
-- address through one of mailroom's senders by _enqueue_message, so it is validated, suppressed,
-- retried, logged and finalized like any other message; the row's raw_message holds the bytes the
-- sender sends as they are. Who may: the setting release.senders names the senders (empty: release
-- is off), release.owner_types the owner types of the inboxes (api,mcp by default: an anonymous
-- inbox is anyone's who reached the HTTP face; a catch-all inbox only when it lists catchall).
-- mailroom_http reaches it only through http_release_message (sql/29_http.sql), with the HTTP
-- face's owner rule.
-- Release is forwarding, not relaying (issue 45, item 1): the recipient must match
-- release.allowed_recipients (empty: none may be released to, MR021); each release takes one from
-- the API key's (or the application owner's) rate release.rate_per_key and one from the inbox's
-- release.rate_per_inbox (MR020, sql/09_rates.sql) and writes one line of mailroom.audit_log; a
-- message whose From names a domain mailroom signs for (a dkim_keys row, or a sender's From domain)
-- goes out From the release sender, the original in X-Original-From, as mailing lists do for DMARC
-- (_release_forwarded).
-- Errors: MR395 release off, MR396 sender not allowed, MR397 owner type not allowed (or a catch-all
-- inbox); those of _authorize_mailbox (MR203-MR206) and MR209; those of _enqueue_message (MR301
-- unknown sender, MR303 bad address, MR318 suppressed); MR306 when the bytes exceed
-- outbound.max_message_bytes; MR390 a header that cannot be forwarded (a NUL byte); MR020 over a
-- rate, MR021 a recipient not allowed.

CREATE OR REPLACE FUNCTION mailroom_internal._setting_list(p_name text)
RETURNS text[]
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- a comma-separated setting as its items, trimmed, empty ones left out, in order
    SELECT coalesce(array_agg(btrim(i.item) ORDER BY i.n) FILTER (WHERE btrim(i.item) <> ''), '{}')
    FROM regexp_split_to_table(mailroom.setting(p_name), ',') WITH ORDINALITY AS i (item, n)
$$;

COMMENT ON FUNCTION mailroom_internal._setting_list(text) IS
'Internal: a comma-separated setting (release.senders, release.owner_types) as a text array, items trimmed, empty ones dropped.';

CREATE OR REPLACE FUNCTION mailroom_internal._resent_block(
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

COMMENT ON FUNCTION mailroom_internal._resent_block(timestamptz, text, text, text, text) IS
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
        'enabled', cardinality(mailroom_internal._setting_list('release.senders')) > 0,
        'senders', to_jsonb(mailroom_internal._setting_list('release.senders'))
    )
$$;

COMMENT ON FUNCTION mailroom.release_options() IS
'GET /api/v1/release: {"enabled": bool, "senders": [name]}, from the setting release.senders (empty: release is off).';

GRANT EXECUTE ON FUNCTION mailroom.release_options() TO mailroom_app, mailroom_http;

CREATE OR REPLACE FUNCTION mailroom_internal._release_signs_for(p_value text)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_plain text := lower(p_value);
    v_squeezed text := lower(p_value);
BEGIN
    -- Whether a From field's value names a domain mailroom signs for: a dkim_keys row, or the From
    -- domain of a sender. DMARC's relaxed alignment compares organizational domains, so the test
    -- is whether the last two labels of such a domain appear anywhere in the value, as written or
    -- with its comments and white space taken out. It errs toward yes (a rewrite is harmless, a
    -- forged From is not): a value too long to read cheaply is yes.
    IF length(p_value) > 2000 THEN
        RETURN true;
    END IF;
    WHILE v_squeezed ~ '\([^()]*\)' LOOP
        v_squeezed := regexp_replace(v_squeezed, '\([^()]*\)', '', 'g');
    END LOOP;
    v_squeezed := regexp_replace(v_squeezed, '[ \t]+', '', 'g');
    RETURN EXISTS (
        SELECT 1
        FROM (
            SELECT k.domain AS d FROM mailroom.dkim_keys AS k
            UNION
            SELECT mailroom_internal._address_domain(s.from_address) FROM mailroom.senders AS s
        ) AS x
        CROSS JOIN LATERAL (SELECT coalesce(substring(x.d FROM '([^.]+[.][^.]+)$'), x.d) AS org) AS o
        WHERE o.org <> '' AND (position(o.org IN v_plain) > 0 OR position(o.org IN v_squeezed) > 0)
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._release_signs_for(text) IS
'Internal: whether a From value names (at the organizational level, last two labels) a domain mailroom signs for: dkim_keys or a sender''s From domain; true when longer than 2000 characters.';

CREATE OR REPLACE FUNCTION mailroom_internal._release_display(p_value text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v text := btrim(regexp_replace(p_value, '[\r\n]+', '', 'g'), E' \t');
    v_display text;
BEGIN
    -- The phrase of the rewritten From: the original display name (or its address) and " via
    -- mailroom", "@" written " at " (so it does not read as an address), as a quoted string; an
    -- original made only of encoded words (RFC 2047) stays one, unquoted.
    IF v ~ '<[^<>]*>$' THEN
        v_display := btrim(substring(v FROM '^(.*)<[^<>]*>$'), E' \t');
        IF v_display = '' THEN
            v_display := substring(v FROM '<([^<>]*)>$');
        END IF;
    ELSE
        v_display := v;
    END IF;
    IF v_display ~ '^"(.*)"$' THEN
        v_display := regexp_replace(substr(v_display, 2, length(v_display) - 2), '\\(.)', '\1', 'g');
    END IF;
    IF v_display ~ '^(=\?[^? \t]+\?[BbQq]\?[^? \t]*\?=[ \t]*)+$' AND length(v_display) <= 200 THEN
        RETURN v_display || ' via mailroom';
    END IF;
    v_display := btrim(regexp_replace(replace(v_display, '@', ' at '), '[\x01-\x1f\x7f \t]+', ' ', 'g'));
    v_display := left(v_display, 64);
    RETURN '"' || replace(replace(v_display, '\', '\\'), '"', '\"') || ' via mailroom"';
END;
$$;

COMMENT ON FUNCTION mailroom_internal._release_display(text) IS
'Internal: the display name of a rewritten From: "<original display name or address> via mailroom", @ as " at ", at most 64 characters of the original.';

CREATE OR REPLACE FUNCTION mailroom_internal._release_forwarded(p_raw bytea, p_sender_from text)
RETURNS bytea
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_lf integer := position('\x0a0a'::bytea IN p_raw);
    v_crlf integer := position('\x0a0d0a'::bytea IN p_raw);
    v_end integer;
    v_head text;
    v_eol text;
    v_froms text [];
    v_at integer;
    v_new text;
BEGIN
    -- Release is forwarding (docs/outbound.md, "Release is forwarding"): when a From field of the
    -- header names a domain mailroom signs for (_release_signs_for), or there are several, every
    -- From field is renamed X-Original-From (its lines kept as they were), and in place of the
    -- first come From: "<its display name> via mailroom" <the release sender> and, when the header
    -- has no Reply-To, Reply-To: the first original From's value. The header is the bytes up to the
    -- first empty line, read as Latin-1 (byte for byte, so 8-bit headers pass unchanged), by
    -- regular expressions without back-references (linear), folded continuation lines belonging
    -- to the field above them. Any other message is returned as it is.
    IF p_raw IS NULL OR substring(p_raw FROM 1 FOR 1) = '\x0a'::bytea OR substring(p_raw FROM 1 FOR 2) = '\x0d0a'::bytea THEN
        RETURN p_raw;
    END IF;
    v_end := CASE
        WHEN v_lf = 0 AND v_crlf = 0 THEN octet_length(p_raw)
        WHEN v_lf = 0 THEN v_crlf
        WHEN v_crlf = 0 THEN v_lf
        ELSE least(v_lf, v_crlf)
    END;
    IF position('\x00'::bytea IN substring(p_raw FROM 1 FOR v_end)) > 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR390',
            MESSAGE = 'this message cannot be released: its header holds a NUL byte';
    END IF;
    v_head := convert_from(substring(p_raw FROM 1 FOR v_end), 'LATIN1');
    v_eol := CASE WHEN v_head ~ '\r\n' OR v_head !~ '\n' THEN E'\r\n' ELSE E'\n' END;

    -- the From fields' values (after "From:", continuation lines and line ends as written), in order;
    -- flag n: ^ is the start of any line of the header
    v_froms := ARRAY(
        SELECT f.m[1] FROM regexp_matches(v_head, '^from[ \t]*:([^\n]*(?:\n[ \t][^\n]*)*\n?)', 'gin') AS f (m)
    );
    IF cardinality(v_froms) = 0
        OR (cardinality(v_froms) = 1
            AND NOT mailroom_internal._release_signs_for(regexp_replace(v_froms[1], '\r?\n', '', 'g'))) THEN
        RETURN p_raw;
    END IF;
    v_new := 'From: ' || mailroom_internal._release_display(v_froms[1]) || ' <' || p_sender_from || '>' || v_eol
        || CASE WHEN v_head ~* '(?n)^reply-to[ \t]*:' THEN '' ELSE
            'Reply-To:' || v_froms[1] || CASE WHEN v_froms[1] ~ '\n$' THEN '' ELSE v_eol END
        END;
    -- the new fields where the first From was, every From renamed in place (its lines unchanged)
    v_at := regexp_instr(v_head, '^from[ \t]*:', 1, 1, 0, 'in');
    RETURN convert_to(
        substr(v_head, 1, v_at - 1) || v_new
        || regexp_replace(substr(v_head, v_at), '^from[ \t]*:', 'X-Original-From:', 'gin'),
        'LATIN1'
    ) || substring(p_raw FROM v_end + 1);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._release_forwarded(bytea, text) IS
'Internal: the bytes of a released message as forwarded: a From naming a domain mailroom signs for becomes "<name> via mailroom" <release sender>, the original kept in X-Original-From (and Reply-To when none); MR390 a header with a NUL byte.';

CREATE OR REPLACE FUNCTION mailroom_internal._release_message(
    p_address text,
    p_session_token text,
    p_message_id bigint,
    p_to text,
    p_sender text,
    p_owner_type text,
    p_owner_id text,
    p_key_id bigint
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes := mailroom_internal._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id);
    v_senders text [] := mailroom_internal._setting_list('release.senders');
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
    IF NOT v_box.owner_type::text = ANY (mailroom_internal._setting_list('release.owner_types')) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR397',
            MESSAGE = format('messages of %s inboxes may not be released (release.owner_types)', v_box.owner_type);
    END IF;
    IF v_box.catchall_domain IS NOT NULL AND NOT 'catchall' = ANY (mailroom_internal._setting_list('release.owner_types')) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR397',
            MESSAGE = 'messages of catch-all inboxes may not be released (release.owner_types does not list catchall)';
    END IF;
    IF NOT v_sender = ANY (v_senders) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR396',
            MESSAGE = format('sender %s may not release messages (release.senders)', quote_literal(left(v_sender, 63)));
    END IF;
    -- the message of this inbox (MR209 otherwise: the inbox area's rule, sql/25_waiting.sql)
    v_message := mailroom_internal._readable_message(p_address, p_session_token, p_message_id, p_owner_type, p_owner_id);
    -- a well-formed address must be allowed (a malformed one is _enqueue_message's MR303)
    IF mailroom_internal._is_valid_address(v_to) THEN
        PERFORM mailroom_internal._require_recipient_allowed('release.allowed_recipients', v_to);
    END IF;
    -- one from the key's rate (or, for the application's form, its owner's: a digest, never the
    -- id itself) and one from the inbox's
    IF p_key_id IS NOT NULL THEN
        PERFORM mailroom_internal._take_rate('release.key', 'k' || p_key_id, 'release.rate_per_key');
    ELSIF p_owner_id IS NOT NULL THEN
        PERFORM mailroom_internal._take_rate('release.key',
            'o' || encode(sha256(convert_to(p_owner_type || ':' || p_owner_id, 'UTF8')), 'hex'), 'release.rate_per_key');
    END IF;
    PERFORM mailroom_internal._take_rate('release.inbox', v_box.id::text, 'release.rate_per_inbox');
    -- the row: the original's subject and text (what the operator's view shows, and what a sender
    -- of the previous release, which knows no raw_message, would send), validated, suppressed
    -- (MR318) and queued by the one enqueue path
    v_id := mailroom_internal._enqueue_message(
        'app', v_sender, ARRAY[v_to],
        left(regexp_replace(coalesce(v_message.subject, ''), mailroom_internal._header_breaking_chars(), ' ', 'g'), 998),
        coalesce(v_message.text_body, ''), v_message.html_body
    );
    SELECT m.message_id, m.created_at INTO v_message_id, v_created
    FROM mailroom.outbound_messages AS m WHERE m.id = v_id;
    SELECT s.from_address INTO v_from FROM mailroom.senders AS s WHERE s.name = v_sender;
    -- the block's line ends are the message's own (CRLF as received over SMTP; LF if it has no CR)
    v_eol := CASE WHEN position('\x0d0a'::bytea IN v_message.raw) = 0 AND position('\x0a'::bytea IN v_message.raw) > 0
        THEN E'\n' ELSE E'\r\n' END;
    v_raw := mailroom_internal._resent_block(mailroom.clock(), v_from, v_to, v_message_id, v_eol)
        || mailroom_internal._release_forwarded(v_message.raw, v_from);
    IF octet_length(v_raw) > mailroom.setting('outbound.max_message_bytes')::bigint THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR306',
            MESSAGE = format(
                'message too large: %s bytes (outbound.max_message_bytes is %s)',
                octet_length(v_raw), mailroom.setting('outbound.max_message_bytes')
            );
    END IF;
    UPDATE mailroom.outbound_messages AS m SET raw_message = v_raw WHERE m.id = v_id AND m.created_at = v_created;
    PERFORM mailroom_internal._audit('release', p_key_id, v_box.owner_type::text, v_box.owner_id, v_box.id,
        p_message_id, v_id, 1);
    RETURN jsonb_build_object('outbound_id', v_id, 'to', v_to, 'sender', v_sender);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._release_message(text, text, bigint, text, text, text, text, bigint) IS
'Internal: the work of release_message and http_release_message, p_key_id the API key''s id (its rate) or NULL; errors as release_message.';

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
BEGIN
    RETURN mailroom_internal._release_message(
        p_address, p_session_token, p_message_id, p_to, p_sender, p_owner_type, p_owner_id, null
    );
END;
$$;

COMMENT ON FUNCTION mailroom.release_message(text, text, bigint, text, text, text, text) IS
'Release a captured message: its bytes as received (From rewritten when it names a domain mailroom signs for), with Resent-Date/-From/-To/-Message-ID prepended, queued for p_to (release.allowed_recipients) through p_sender (default: the first of release.senders), within release.rate_per_key and release.rate_per_inbox, one audit line; {"outbound_id", "to", "sender"}. Errors: MR395 off, MR396 sender, MR397 owner type, MR203-MR209, MR301, MR303, MR306, MR318, MR390, MR020, MR021.';

GRANT EXECUTE ON FUNCTION mailroom.release_message(text, text, bigint, text, text, text, text) TO mailroom_app;
