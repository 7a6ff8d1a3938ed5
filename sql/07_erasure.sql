-- Erasure (docs/erasure.md): mailroom.erase_address removes one person's address from every
-- table of the schema, or replaces it irreversibly, in one transaction, and leaves only its keyed
-- hash on the suppression list so mail to it stays refused. PL/pgSQL throughout: the tables and
-- helpers it reads are created by later files and migrations.

CREATE OR REPLACE FUNCTION mailroom_internal._erased_form(p_address text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- What replaces an erased address: 'erased:' and the hex of HMAC-SHA256(normalized address)
    -- under the redaction pepper (migration 0030, readable by no runtime role). The same address
    -- always gives the same value, so the suppression list still recognizes it; without the
    -- pepper the value cannot be tested against guessed addresses. It holds no '@': no address
    -- equals it.
    RETURN (
        SELECT 'erased:' || encode(
            mailroom_internal._hmac(convert_to(mailroom_internal._normalize_address(p_address), 'UTF8'), p.pepper, 'sha256'),
            'hex'
        )
        FROM mailroom.redaction_pepper AS p
        WHERE p.singleton
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._erased_form(text) IS
'Internal: the keyed hash that stands for an erased address (erased:<hex of HMAC-SHA256 under the redaction pepper>).';

CREATE OR REPLACE FUNCTION mailroom_internal._erased_recipient(p_recipient text, p_pepper bytea)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- What stands, in place, for an erased recipient of an outbound message (to, cc, bcc): the
    -- element is replaced, never removed, because a return path or an unsubscribe link names its
    -- recipient by envelope position (sql/36_outbound_bounces.sql). 'erased:' and the hex of
    -- HMAC-SHA256('recipient:' || the element exactly as it was) under the redaction pepper: two
    -- elements that were equal stay equal and two that differed stay different, so the envelope
    -- (each exact address once) keeps its positions. No '@': no address equals it, and a claim
    -- skips it (_is_erased_recipient). IMMUTABLE, the pepper an argument: erase_address calls it per
    -- row of an UPDATE, which Citus refuses for a STABLE function over columns (docs/scale.md).
    RETURN 'erased:' || encode(mailroom_internal._hmac(convert_to('recipient:' || p_recipient, 'UTF8'), p_pepper, 'sha256'), 'hex');
END;
$$;

COMMENT ON FUNCTION mailroom_internal._erased_recipient(text, bytea) IS
'Internal: the keyed hash (under the pepper given) that replaces an erased outbound recipient in place (positions stay; erased:<hex>).';

CREATE OR REPLACE FUNCTION mailroom_internal._erased_recipient(p_recipient text)
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailroom_internal._erased_recipient(p_recipient, p.pepper) FROM mailroom.redaction_pepper AS p WHERE p.singleton;
$$;

COMMENT ON FUNCTION mailroom_internal._erased_recipient(text) IS
'Internal: the keyed hash that replaces an erased outbound recipient in place (positions stay; erased:<hex>).';

CREATE OR REPLACE FUNCTION mailroom_internal._is_erased_recipient(p_recipient text)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- an element erasure replaced (an address never starts with 'erased:': ':' is no atom character)
    RETURN coalesce(left(p_recipient, 7) = 'erased:', false);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._is_erased_recipient(text) IS
'Internal: whether an outbound recipient element is an erased one (erased:<hex>), never mailed.';

CREATE OR REPLACE FUNCTION mailroom_internal._suppression_keys(p_address text)
RETURNS text[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The values of suppressions.address that stand for an address: itself (normalized) and, once
    -- it was erased, its keyed hash.
    RETURN ARRAY[mailroom_internal._normalize_address(p_address), mailroom_internal._erased_form(p_address)];
END;
$$;

COMMENT ON FUNCTION mailroom_internal._suppression_keys(text) IS
'Internal: the suppression list entries that stand for an address: the address (normalized) and its erased form.';

CREATE OR REPLACE FUNCTION mailroom_internal._address_pattern(p_address text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- A regular expression (to use with the case-insensitive operator ~* or flag 'i') matching the
    -- address where it stands as a whole address in a text: not inside a longer local part
    -- (malice@ is not alice@) nor a longer domain (example.com.evil.org); a sentence's final dot may
    -- follow it.
    -- An address without a plus tag also matches its plus forms (alice@ finds alice+news@: mail
    -- to those is alice's, sql/02_addresses.sql); an address with a tag matches as written.
    RETURN '(?<![[:alnum:]!#$%&''*+/=?^_`{|}~.-])'
        || regexp_replace(split_part(mailroom_internal._normalize_address(p_address), '@', 1), '([].^$*+?(){}|\\[-])', '\\\1', 'g')
        || CASE WHEN strpos(mailroom_internal._normalize_address(p_address), '+') = 0
            THEN '(?:[+][[:alnum:]!#$%&''*+/=?^_`{|}~.-]*)?' ELSE '' END
        || '@'
        || regexp_replace(split_part(mailroom_internal._normalize_address(p_address), '@', 2), '([].^$*+?(){}|\\[-])', '\\\1', 'g')
        || '(?![[:alnum:]_-]|[.][[:alnum:]])';
END;
$$;

COMMENT ON FUNCTION mailroom_internal._address_pattern(text) IS
'Internal: case-insensitive regular expression of an address standing whole in a text (an address without a plus tag: its plus forms too).';

CREATE OR REPLACE FUNCTION mailroom_internal._is_address_form(p_candidate text, p_address text)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- whether a recipient as written is the (normalized) address or one of its plus forms
    -- (alice+news@example.com is alice@example.com's; sql/02_addresses.sql)
    RETURN mailroom_internal._normalize_address(p_candidate) = p_address
        OR mailroom_internal._address_base(mailroom_internal._normalize_address(p_candidate)) = p_address;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._is_address_form(text, text) IS
'Internal (erase_address): whether a recipient as written is the normalized address or one of its plus forms (box+tag@domain).';

CREATE OR REPLACE FUNCTION mailroom_internal._escape_text_byte(p_code integer)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- one byte as encode(…, 'escape') writes it: printable ASCII and line breaks as themselves, a
    -- backslash doubled, any other byte as \ooo
    IF p_code = 92 THEN
        RETURN '\\';
    END IF;
    IF p_code BETWEEN 32 AND 126 OR p_code IN (9, 10, 13) THEN
        RETURN chr(p_code);
    END IF;
    RETURN format('\%s%s%s', p_code / 64, (p_code / 8) % 8, p_code % 8);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._escape_text_byte(integer) IS
'Internal: a byte in the text form encode(bytea, ''escape'') gives it.';

CREATE OR REPLACE FUNCTION mailroom_internal._base64_text(p_text text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_b64 text := regexp_replace(p_text, '[^A-Za-z0-9+/]+', '', 'g');
BEGIN
    -- base64 decoded leniently, as a mail reader does (RFC 2045 6.8: other characters ignored,
    -- padding completed), in the escape text form of the bytes; never an error
    IF length(v_b64) % 4 = 1 THEN
        v_b64 := left(v_b64, -1);
    END IF;
    RETURN encode(decode(v_b64 || repeat('=', (4 - length(v_b64) % 4) % 4), 'base64'), 'escape');
END;
$$;

COMMENT ON FUNCTION mailroom_internal._base64_text(text) IS
'Internal: base64 decoded leniently (other characters ignored, padding completed), as escape text.';

CREATE OR REPLACE FUNCTION mailroom_internal._decoded_hold_address(p_text text, p_pattern text, p_depth integer)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_piece text;
    v_kind text;
    v_word text;
    v_qp text;
    v_hex text;
BEGIN
    -- Whether what a reader gets by undoing MIME transfer encodings (RFC 2045, 2047) in these
    -- bytes (p_text: their encode(…, 'escape') form) holds the pattern. The MIME structure is not
    -- parsed: every form is decoded wherever it shows, a superset of what the parts declare:
    --   base64: each run of lines made only of base64 characters, decoded as one (the lines of a
    --     part's body; a shorter run of words decodes to noise, which holds no address), and, when
    --     that is MIME again (a message), what it decodes to, down to p_depth levels;
    --   encoded words (=?charset?B|Q?…?=, in headers): decoded in place, between spaces;
    --   quoted-printable (when the bytes say quoted-printable or hold an encoded word): soft line
    --     breaks removed and =XX replaced, everywhere.
    -- Compressed content (zip, gzip, a PDF's streams) is not opened (docs/erasure.md).
    IF p_text IS NULL OR p_depth <= 0 THEN
        RETURN false;
    END IF;
    FOR v_piece IN
        SELECT m.m[1]
        FROM regexp_matches(p_text, '((?:^[A-Za-z0-9+/]{4,}={0,2}\r?(?:\n|$))+)', 'gn') AS m (m)
        WHERE length(m.m[1]) >= 8
    LOOP
        v_piece := mailroom_internal._base64_text(v_piece);
        IF v_piece ~* p_pattern THEN
            RETURN true;
        END IF;
        -- a level deeper only for what is MIME itself (a message), never an image's bytes
        IF p_depth > 1 AND v_piece ~* '(content-transfer-encoding|=\?[^?[:space:]]+\?[bq]\?)'
            AND mailroom_internal._decoded_hold_address(v_piece, p_pattern, p_depth - 1) THEN
            RETURN true;
        END IF;
    END LOOP;
    -- quoted-printable is declared (a part's Content-Transfer-Encoding), encoded words show
    IF p_text !~* '(quoted-printable|=\?[^?[:space:]]+\?[bq]\?)' THEN
        RETURN false;
    END IF;
    v_qp := p_text;
    FOR v_word, v_kind, v_piece IN
        SELECT DISTINCT m.m[1], upper(m.m[2]), m.m[3]
        FROM regexp_matches(p_text, '(=\?[^?[:space:]]{1,64}\?([BbQq])\?([^?[:space:]]*)\?=)', 'g') AS m (m)
    LOOP
        IF v_kind = 'B' THEN
            v_piece := mailroom_internal._base64_text(v_piece);
        ELSE
            v_piece := replace(v_piece, '_', ' ');  -- its =XX go with the quoted-printable below
        END IF;
        v_qp := replace(v_qp, v_word, ' ' || v_piece || ' ');
    END LOOP;
    v_qp := regexp_replace(v_qp, '=\r?\n', '', 'g');
    FOR v_hex IN SELECT DISTINCT m.m[1] FROM regexp_matches(v_qp, '=([0-9A-Fa-f]{2})', 'g') AS m (m) LOOP
        v_qp := replace(v_qp, '=' || v_hex, mailroom_internal._escape_text_byte(get_byte(decode(v_hex, 'hex'), 0)));
    END LOOP;
    RETURN v_qp <> p_text AND v_qp ~* p_pattern;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._decoded_hold_address(text, text, integer) IS
'Internal: whether the base64, encoded-word and quoted-printable forms in bytes (escape text) decode to text holding a pattern.';

CREATE OR REPLACE FUNCTION mailroom_internal._bytes_hold_address(p_bytes bytea, p_pattern text)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_text text := encode(p_bytes, 'escape');
BEGIN
    -- bytea as text with escape encoding: ASCII stays as it is, other bytes become \ooo, so an
    -- ASCII address is found case-insensitively in any bytes (a message's raw form); and in what
    -- they decode to (base64 parts, quoted-printable, encoded words: what a reader of the message
    -- or of one of its attachments gets), two levels deep
    RETURN v_text ~* p_pattern OR mailroom_internal._decoded_hold_address(v_text, p_pattern, 2);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._bytes_hold_address(bytea, text) IS
'Internal: whether bytes hold an address pattern (ASCII, case-insensitive), as they are or once their MIME transfer encodings are undone.';

CREATE OR REPLACE FUNCTION mailroom_internal._key_holds_address(p_key text, p_address text)
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- An idempotency key is an opaque string an application builds, often from the address
    -- (idem-alice@example.com, welcome:alice@example.com, signup/alice%40example.com): it holds
    -- the (normalized) address when the address is anywhere in it, case-insensitively, also
    -- URL-encoded; no whole-address rule (a key for malice@ is dropped with alice@'s: a key is
    -- no recipient, and losing it only lets a retry with it enqueue again).
    RETURN coalesce(
        strpos(lower(p_key), p_address) > 0 OR strpos(lower(p_key), replace(p_address, '@', '%40')) > 0,
        false
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._key_holds_address(text, text) IS
'Internal (erase_address): whether an idempotency key holds a normalized address anywhere (also URL-encoded), whole or not.';

CREATE OR REPLACE FUNCTION mailroom_internal._texts_hold_address(p_pattern text, VARIADIC p_texts text[])
RETURNS boolean
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- each text on its own (NULLs skipped): the pattern needs a non-address character around the
    -- address, so this is the same as matching the texts joined by spaces. IMMUTABLE, unlike
    -- concat_ws and array_to_string: Citus calls it per row in the UPDATEs and DELETEs of erasure.
    RETURN EXISTS (SELECT 1 FROM unnest(p_texts) AS t (v) WHERE t.v ~* p_pattern);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._texts_hold_address(text, text[]) IS
'Internal: whether any of the texts holds an address pattern (case-insensitive).';

CREATE OR REPLACE FUNCTION mailroom_internal._erase_recipients(p_recipients text[], p_address text, p_pepper bytea)
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- a recipient list with every element that is the (normalized) address replaced in place by
    -- its _erased_recipient form: same length, same positions (IMMUTABLE, the pepper an argument:
    -- called per row of erase_address's UPDATE, which Citus refuses for a STABLE function)
    RETURN ARRAY(
        SELECT CASE
            WHEN mailroom_internal._is_address_form(r.a, p_address) THEN mailroom_internal._erased_recipient(r.a, p_pepper)
            ELSE r.a
        END
        FROM unnest(p_recipients) WITH ORDINALITY AS r (a, n)
        ORDER BY r.n
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._erase_recipients(text[], text, bytea) IS
'Internal (erase_address): a recipient list with the address replaced in place by its erased form (positions kept).';

-- Its Citus form: sql/citus/12_accounts.sql (a seam: mailroom.db.citus.SEAMS).
CREATE OR REPLACE FUNCTION mailroom_internal._erase_account_keys(p_accounts bigint[], p_pattern text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Where else the layout keeps erased accounts' login and email: nowhere on one node (the
    -- accounts table holds them); on Citus the lookup tables that make them unique
    -- (sql/citus/12_accounts.sql overrides this).
    NULL;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._erase_account_keys(bigint[], text) IS
'Internal (erase_address): remove the erased accounts'' keys kept outside accounts (none on one node; Citus: the lookup tables).';

CREATE OR REPLACE FUNCTION mailroom.erase_address(p_address text, p_dry_run boolean DEFAULT false)
RETURNS TABLE (item text, affected bigint)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_addr text := mailroom_internal._normalize_address(p_address);
    v_pattern text;
    v_erased text;
    v_tag text;
    v_pepper bytea := (SELECT p.pepper FROM mailroom.redaction_pepper AS p WHERE p.singleton);
    v_counts jsonb := '{}';
    v_n bigint;
    v_m bigint;
    v_reason text;
    v_where text;
    v_accounts bigint [];
    v_gone bigint [];
BEGIN
    IF v_addr IS NULL OR NOT coalesce(mailroom_internal._is_valid_address(v_addr), false) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR006',
            MESSAGE = 'the address to erase is not a valid email address';
    END IF;
    v_pattern := mailroom_internal._address_pattern(v_addr);
    v_erased := mailroom_internal._erased_form(v_addr);
    v_tag := mailroom_internal._redaction_tag(v_addr);

    -- Configuration is the operator's to change: mailroom does not rewrite a relay or a template.
    SELECT coalesce(
        (
            SELECT format('sender %s', s.name) FROM mailroom.senders AS s
            WHERE concat_ws(' ', s.from_address, s.smtp_username) ~* v_pattern
            ORDER BY s.name LIMIT 1
        ),
        (
            SELECT format('setting %s', s.name) FROM mailroom.settings AS s
            WHERE s.value ~* v_pattern ORDER BY s.name LIMIT 1
        ),
        (
            SELECT format('template %s', t.action) FROM mailroom.token_email_templates AS t
            WHERE concat_ws(' ', t.subject, t.text_body, t.html_body) ~* v_pattern ORDER BY t.action LIMIT 1
        ),
        (
            -- a sender's webhook endpoint is the operator's (mailroom webhook add --sender)
            SELECT format('webhook endpoint %s', w.id) FROM mailroom.webhook_endpoints AS w
            WHERE w.sender_id IS NOT NULL AND w.url ~* v_pattern ORDER BY w.id LIMIT 1
        )
    ) INTO v_where;
    IF v_where IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR007',
            MESSAGE = format('the address to erase is in the configuration (%s): change it first', v_where);
    END IF;

    BEGIN
        -- accounts: the one whose email it is, or whose login holds it; their tokens go with them
        -- (ON DELETE CASCADE), and so do the token emails skipped for them and their recovery requests
        SELECT coalesce(array_agg(a.id), '{}') INTO v_accounts
        FROM mailroom.accounts AS a
        WHERE lower(a.email) = v_addr OR a.login ~* v_pattern OR a.email ~* v_pattern;
        DELETE FROM mailroom.suppressed_token_emails AS s
        WHERE s.token_id IN (SELECT t.id FROM mailroom.tokens AS t WHERE t.account = ANY (v_accounts));
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_counts := v_counts || jsonb_build_object('suppressed_token_emails', v_n);
        DELETE FROM mailroom.tokens AS t WHERE t.account = ANY (v_accounts);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_counts := v_counts || jsonb_build_object('tokens', v_n);
        DELETE FROM mailroom.accounts AS a WHERE a.id = ANY (v_accounts);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_counts := v_counts || jsonb_build_object('accounts', v_n);
        PERFORM mailroom_internal._erase_account_keys(v_accounts, v_pattern);
        DELETE FROM mailroom.recovery_requests AS r
        WHERE r.account = ANY (v_accounts) OR r.email ~* v_pattern;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_counts := v_counts || jsonb_build_object('recovery_requests', v_n);

        -- outbound mail: a message with no other recipient goes (with its idempotency key and its
        -- bounces); the others have the address replaced in place among their recipients (by
        -- _erased_recipient: the other recipients keep their positions) and, wherever it appears
        -- (subject, bodies, headers, idempotency key), have it replaced by its erased form
        SELECT coalesce(array_agg(m.id), '{}') INTO v_gone
        FROM mailroom.outbound_messages AS m
        WHERE
            EXISTS (
                SELECT 1 FROM unnest(m.to_addrs || m.cc_addrs || m.bcc_addrs) AS r (a)
                WHERE mailroom_internal._is_address_form(r.a, v_addr)
            )
            -- no other recipient left (one erased before is nobody)
            AND NOT EXISTS (
                SELECT 1 FROM unnest(m.to_addrs || m.cc_addrs || m.bcc_addrs) AS r (a)
                WHERE NOT mailroom_internal._is_address_form(r.a, v_addr) AND NOT mailroom_internal._is_erased_recipient(r.a)
            );
        DELETE FROM mailroom.outbound_bounces AS b WHERE b.message_id = ANY (v_gone);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_counts := v_counts || jsonb_build_object('outbound_bounces', v_n);
        DELETE FROM mailroom.outbound_idempotency_keys AS k
        WHERE k.message_id = ANY (v_gone) OR mailroom_internal._key_holds_address(k.key, v_addr);
        DELETE FROM mailroom.outbound_messages AS m WHERE m.id = ANY (v_gone);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_counts := v_counts || jsonb_build_object('outbound_messages_deleted', v_n);
        UPDATE mailroom.outbound_messages AS m
        SET
            -- erased in place: a signed address names its recipient by envelope position
            -- (sql/36_outbound_bounces.sql), so the others keep theirs; a claim skips the erased
            to_addrs = mailroom_internal._erase_recipients(m.to_addrs, v_addr, v_pepper),
            cc_addrs = mailroom_internal._erase_recipients(m.cc_addrs, v_addr, v_pepper),
            bcc_addrs = mailroom_internal._erase_recipients(m.bcc_addrs, v_addr, v_pepper),
            subject = regexp_replace(m.subject, v_pattern, v_erased, 'gi'),
            text_body = regexp_replace(m.text_body, v_pattern, v_erased, 'gi'),
            html_body = regexp_replace(m.html_body, v_pattern, v_erased, 'gi'),
            headers = regexp_replace(m.headers::text, v_pattern, v_erased, 'gi')::jsonb,
            idempotency_key = CASE WHEN mailroom_internal._key_holds_address(m.idempotency_key, v_addr) THEN null ELSE m.idempotency_key END,
            -- error_log is redacted on write: the address shows there only as its tag
            error_log = replace(m.error_log, v_tag, '<erased>'),
            -- an attachment naming the address (its name or its bytes) goes whole: bytes are
            -- not rewritten (sql/32)
            attachments = mailroom_internal._attachments_without(m.attachments, v_addr),
            -- a released message's bytes (sql/32_outbound_release.sql) holding it go whole: it is
            -- then sent as its (erased) subject and text
            raw_message = CASE
                WHEN strpos(lower(encode(m.raw_message, 'escape')), v_addr) = 0 THEN m.raw_message
            END
        WHERE
            mailroom_internal._texts_hold_address(v_pattern, VARIADIC m.to_addrs || m.cc_addrs || m.bcc_addrs)
            OR mailroom_internal._texts_hold_address(v_pattern, m.subject, m.text_body, m.html_body, m.headers::text)
            OR mailroom_internal._key_holds_address(m.idempotency_key, v_addr)
            OR strpos(m.error_log, v_tag) > 0
            OR m.attachments IS DISTINCT FROM mailroom_internal._attachments_without(m.attachments, v_addr)
            OR strpos(lower(encode(m.raw_message, 'escape')), v_addr) > 0;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_counts := v_counts || jsonb_build_object('outbound_messages_rewritten', v_n);
        UPDATE mailroom.outbound_bounces AS b
        SET diagnostic = replace(b.diagnostic, v_tag, '<erased>')
        WHERE strpos(b.diagnostic, v_tag) > 0;

        -- the suppression list keeps the keyed hash only, in force until removed
        DELETE FROM mailroom.suppressions AS s WHERE s.address = v_addr
        RETURNING s.reason INTO v_reason;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        INSERT INTO mailroom.suppressions AS s (address, reason, source_message, created_at, expires_at)
        VALUES (v_erased, coalesce(v_reason, 'manual'), null, mailroom.clock(), null)
        ON CONFLICT (address) DO UPDATE SET expires_at = null;
        v_counts := v_counts || jsonb_build_object('suppressions', v_n);

        -- inboxes: the inbox of that address (its messages go with it), and every message
        -- anywhere that holds it (envelope, headers, bodies, raw bytes, attachment names);
        -- an owner named by it is replaced by its erased form
        v_n := mailroom_internal._delete_mailbox(v_addr);
        v_counts := v_counts || jsonb_build_object('mailboxes', v_n);
        DELETE FROM mailroom.messages AS m
        WHERE
            mailroom_internal._is_address_form(m.envelope_to, v_addr)
            OR mailroom_internal._texts_hold_address(
                v_pattern, m.envelope_from, m.envelope_to, m.from_header, m.subject, m.text_body, m.html_body,
                m.attachments::text
            )
            OR mailroom_internal._bytes_hold_address(m.raw, v_pattern);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_counts := v_counts || jsonb_build_object('messages', v_n);
        UPDATE mailroom.mailboxes AS b SET owner_id = regexp_replace(b.owner_id, v_pattern, v_erased, 'gi')
        WHERE b.owner_id ~* v_pattern;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        UPDATE mailroom.api_keys AS k
        SET
            owner_id = regexp_replace(k.owner_id, v_pattern, v_erased, 'gi'),
            label = regexp_replace(k.label, v_pattern, v_erased, 'gi')
        WHERE mailroom_internal._texts_hold_address(v_pattern, k.owner_id, k.label);
        GET DIAGNOSTICS v_m = ROW_COUNT;
        v_n := v_n + v_m;
        -- an API key's webhook endpoints (sql/38): the owner copied on them is renamed as the key's,
        -- else message.received, found by that copy, would go on reaching the erased owner's endpoint
        -- for the inboxes of whoever owns that id next; an endpoint whose URL holds the address goes
        -- (its queued deliveries fail at their claim, as for any removed endpoint)
        DELETE FROM mailroom.webhook_endpoints AS w
        WHERE w.key_id IS NOT NULL AND w.url ~* v_pattern;
        UPDATE mailroom.webhook_endpoints AS w SET owner_id = regexp_replace(w.owner_id, v_pattern, v_erased, 'gi')
        WHERE w.owner_id ~* v_pattern;
        GET DIAGNOSTICS v_m = ROW_COUNT;
        v_n := v_n + v_m;
        UPDATE mailroom.catchall_domains AS c SET owner_id = regexp_replace(c.owner_id, v_pattern, v_erased, 'gi')
        WHERE c.owner_id ~* v_pattern;
        GET DIAGNOSTICS v_m = ROW_COUNT;
        v_counts := v_counts || jsonb_build_object('owners', v_n + v_m);

        -- the workers' tables: names, what they serve, their last summaries
        UPDATE mailroom.workers AS w
        SET
            worker = regexp_replace(w.worker, v_pattern, v_erased, 'gi'),
            host = regexp_replace(w.host, v_pattern, v_erased, 'gi'),
            serves = regexp_replace(w.serves, v_pattern, v_erased, 'gi'),
            metrics_address = regexp_replace(w.metrics_address, v_pattern, v_erased, 'gi')
        WHERE mailroom_internal._texts_hold_address(v_pattern, w.worker, w.host, w.serves, w.metrics_address);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        UPDATE mailroom.job_runs AS j SET last_summary = regexp_replace(j.last_summary, v_pattern, v_erased, 'gi')
        WHERE j.last_summary ~* v_pattern;
        GET DIAGNOSTICS v_m = ROW_COUNT;
        v_counts := v_counts || jsonb_build_object('worker_logs', v_n + v_m);

        IF p_dry_run THEN
            -- undo everything above (the counts stay in the variable)
            RAISE EXCEPTION USING ERRCODE = 'MR009', MESSAGE = 'dry run';
        END IF;
    EXCEPTION WHEN SQLSTATE 'MR009' THEN
        NULL;
    END;
    RETURN QUERY
    SELECT c.key, c.value::bigint FROM jsonb_each_text(v_counts) AS c
    ORDER BY c.key;
END;
$$;

COMMENT ON FUNCTION mailroom.erase_address(text, boolean) IS
'Erase an address from every table in one transaction (accounts, tokens, outbound mail, bounces, inboxes and their messages, recovery requests, workers'' tables), keeping only its keyed hash on the suppression list; p_dry_run counts and changes nothing. Returns the rows affected per item. Errors: MR006 not a valid address, MR007 the address is in the configuration (MR009 only rolls a dry run back inside).';

GRANT EXECUTE ON FUNCTION mailroom.erase_address(text, boolean) TO mailroom_admin;
