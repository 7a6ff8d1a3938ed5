-- Bounces (docs/bounces.md): VERP return paths for outbound mail and the bounce reports, ARF
-- complaints and unsubscribe mails that come back to them through `mailroom inbox serve`.
--
-- Return path: bounce+<outbound message id>-<recipient>-<signature>@<bounce domain>, one per
-- envelope recipient (issue 21, item 2; the scheme is described at _envelope below). Signatures
-- are lower-case hex (local parts may be case-folded on the way back, the check lower-cases
-- first) under mailroom.verp_key (migration 0095), read only here, inside SECURITY DEFINER
-- callers; no function returns it.
-- The bounce domain is the sender's bounce_domain, else the setting outbound.bounce_domain;
-- neither: no VERP (claim_messages returns return_paths NULL and the sender uses from_address).

CREATE OR REPLACE FUNCTION mailroom_internal._bounce_domain_name(p_domain text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_domain text := lower(btrim(p_domain));
BEGIN
    -- the domain in lower case when it is a domain name (LDH labels, at most 253 octets), else
    -- NULL. PL/pgSQL: claim calls this per row, and a SQL function with a SET clause is planned
    -- on every call.
    IF mailroom_internal._is_domain_name(v_domain) THEN
        RETURN v_domain;
    END IF;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._bounce_domain_name(text) IS
'Internal: a bounce domain in lower case if it is a domain name, else NULL (an empty setting: no VERP).';

CREATE OR REPLACE FUNCTION mailroom_internal._is_bounce_domain(p_domain text)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- a domain some return path may be on now: the setting's or a sender's
    SELECT coalesce(
        mailroom_internal._bounce_domain_name(p_domain) = mailroom_internal._bounce_domain_name(
            mailroom.setting('outbound.bounce_domain')
        )
        OR EXISTS (
            SELECT 1 FROM mailroom.senders AS s
            WHERE s.bounce_domain = mailroom_internal._bounce_domain_name(p_domain)
        ),
        false
    );
$$;

COMMENT ON FUNCTION mailroom_internal._is_bounce_domain(text) IS
'Internal: whether a domain is a bounce domain now (the setting outbound.bounce_domain or a sender''s bounce_domain).';

CREATE OR REPLACE FUNCTION mailroom_internal._verp_signature(p_message_id bigint, p_key bytea)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- 64 bits of the HMAC as 16 lower-case hex characters (PL/pgSQL: a SQL function with a SET
    -- clause is planned on every call, ten times the cost of the HMAC; claim calls this per row)
    RETURN encode(
        substring(
            mailroom_internal._hmac(convert_to('mailroom-verp:' || p_message_id::text, 'UTF8'), p_key, 'sha256')
            FROM 1 FOR 8
        ),
        'hex'
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._verp_signature(bigint, bytea) IS
'Internal: the VERP signature of an outbound message id under a key (truncated HMAC-SHA256, 16 hex characters).';

CREATE OR REPLACE FUNCTION mailroom_internal._verp_signature(p_message_id bigint)
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailroom_internal._verp_signature(p_message_id, k.key) FROM mailroom.verp_key AS k WHERE k.singleton;
$$;

COMMENT ON FUNCTION mailroom_internal._verp_signature(bigint) IS
'Internal: the VERP signature of an outbound message id under mailroom.verp_key.';

CREATE OR REPLACE FUNCTION mailroom_internal._return_path(p_message_id bigint, p_sender_id bigint)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_domain text;
    v_key bytea;
BEGIN
    -- Called once per claimed row: PL/pgSQL keeps its plans for the session, and nothing here
    -- calls another function but the two below (the bounce domain: the sender's, else the
    -- setting's; none: no VERP).
    SELECT coalesce(
        (SELECT s.bounce_domain FROM mailroom.senders AS s WHERE s.id = p_sender_id),
        (SELECT t.value FROM mailroom.settings AS t WHERE t.name = 'outbound.bounce_domain')
    ) INTO v_domain;
    IF coalesce(v_domain, '') = '' THEN
        RETURN NULL;
    END IF;
    v_domain := mailroom_internal._bounce_domain_name(v_domain);
    IF v_domain IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT k.key INTO v_key FROM mailroom.verp_key AS k WHERE k.singleton;
    RETURN 'bounce+' || p_message_id::text || '-' || mailroom_internal._verp_signature(p_message_id, v_key) || '@' || v_domain;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._return_path(bigint, bigint) IS
'Internal, deprecated since 0.2.0, removed in 0.3.0: the message-level VERP envelope sender of the previous release (bounce+<id>-<signature>@<bounce domain>), NULL without a bounce domain; claim uses _return_paths.';

CREATE OR REPLACE FUNCTION mailroom_internal._is_verp_address(p_address text)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_address text := mailroom_internal._normalize_address(p_address);
BEGIN
    -- bounce+…@<a bounce domain>: such an address is a return path or nothing (never a mailbox).
    -- Every RCPT asks this: PL/pgSQL (a SQL function with SET search_path is parsed again in every
    -- transaction, sql/20_mailboxes.sql), and the bounce domains are read only for the prefixes.
    IF v_address IS NULL OR NOT (v_address LIKE 'bounce+%@%' OR v_address LIKE 'unsubscribe+%@%')
        OR v_address LIKE '%@%@%' THEN
        RETURN false;
    END IF;
    RETURN coalesce(mailroom_internal._is_bounce_domain(split_part(v_address, '@', 2)), false);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._is_verp_address(text) IS
'Internal: whether an address has the form of a signed address (bounce+… or unsubscribe+… at a bounce domain), valid or not.';

-- Per-recipient signed addresses (issue 21, item 2): a return path, an unsubscribe address or
-- link names the message AND the recipient it was issued for. The recipient is its 1-based
-- position in the message's envelope (_envelope: to, cc, bcc, each exact address once, in order;
-- the sender's RCPT list). The signature is the first 64 bits of HMAC-SHA256(purpose ':' id '-' n)
-- under mailroom.verp_key, 16 lower-case hex characters; purposes: 'mailroom-verp' (return paths),
-- 'mailroom-unsubscribe' (List-Unsubscribe). Forms:
--   bounce+<id>-<n>-<signature>@<bounce domain>        the return path of recipient n
--   unsubscribe+<id>-<n>-<signature>@<bounce domain>   List-Unsubscribe mailto of recipient n
--   <id>-<n>-<signature>                                the one-click URL's token
-- The message-level form of the previous release (bounce+<id>-<signature>) is still accepted, so
-- bounces of mail already sent arrive; it names a recipient only when the message had one.
-- Positions are stable: erasure (sql/07_erasure.sql) replaces an erased recipient in place by a
-- keyed hash, never removes it, so a position names the same recipient for the message's life;
-- an erased position names nobody, and a claim leaves it out (sql/33_outbound_claim.sql).

CREATE OR REPLACE FUNCTION mailroom_internal._envelope(p_to text[], p_cc text[], p_bcc text[])
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_all text[] := coalesce(p_to, '{}') || coalesce(p_cc, '{}') || coalesce(p_bcc, '{}');
    v_out text[] := '{}';
BEGIN
    -- every exact address once, in the order to, cc, bcc (the sender's RCPT list). A loop in
    -- PL/pgSQL: the SQL form (DISTINCT ON over unnest) was planned at every call, 210 us of
    -- each claimed message; a message has a few recipients (at most outbound.max_recipients)
    FOR i IN 1..coalesce(cardinality(v_all), 0) LOOP
        IF array_position(v_out, v_all[i]) IS NULL THEN  -- (NULL-safe, as DISTINCT was)
            v_out := v_out || v_all[i];
        END IF;
    END LOOP;
    RETURN v_out;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._envelope(text[], text[], text[]) IS
'Internal: the envelope recipients of a message (to, cc, bcc, each exact address once, in order); a signed address names a position in it.';

CREATE OR REPLACE FUNCTION mailroom_internal._recipient_signature(p_purpose text, p_message_id bigint, p_recipient integer, p_key bytea)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN encode(
        substring(
            mailroom_internal._hmac(
                convert_to(p_purpose || ':' || p_message_id::text || '-' || p_recipient::text, 'UTF8'), p_key, 'sha256'
            )
            FROM 1 FOR 8
        ),
        'hex'
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._recipient_signature(text, bigint, integer, bytea) IS
'Internal: the signature of a per-recipient address (purpose mailroom-verp or mailroom-unsubscribe; truncated HMAC-SHA256, 16 hex characters).';

CREATE OR REPLACE FUNCTION mailroom_internal._message_bounce_domain(p_sender_id bigint)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the sender's bounce domain, else the setting's; NULL: no VERP
    RETURN mailroom_internal._bounce_domain_name(coalesce(
        (SELECT s.bounce_domain FROM mailroom.senders AS s WHERE s.id = p_sender_id),
        (SELECT t.value FROM mailroom.settings AS t WHERE t.name = 'outbound.bounce_domain')
    ));
END;
$$;

COMMENT ON FUNCTION mailroom_internal._message_bounce_domain(bigint) IS
'Internal: the bounce domain of a sender''s mail (its own, else the setting outbound.bounce_domain), NULL: no VERP.';

-- The return paths themselves, from a bounce domain and the VERP key read by the caller: the Citus
-- claim (sql/citus/20_queue.sql) reads them once a claim, where every read of a reference table is a
-- statement of its own on the coordinator.
CREATE OR REPLACE FUNCTION mailroom_internal._verp_paths(
    p_message_id bigint, p_recipients integer, p_domain text, p_key bytea
)
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- one return path per envelope recipient, NULL without a bounce domain
    IF p_domain IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN ARRAY(
        SELECT 'bounce+' || p_message_id::text || '-' || n::text || '-'
            || mailroom_internal._recipient_signature('mailroom-verp', p_message_id, n, p_key) || '@' || p_domain
        FROM generate_series(1, p_recipients) AS n
        ORDER BY n
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._verp_paths(bigint, integer, text, bytea) IS
'Internal: the VERP envelope senders of a message under a bounce domain and key (_return_paths reads them), NULL without a domain.';

CREATE OR REPLACE FUNCTION mailroom_internal._return_paths(p_message_id bigint, p_sender_id bigint, p_recipients integer)
RETURNS text[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_domain text := mailroom_internal._message_bounce_domain(p_sender_id);
    v_key bytea;
BEGIN
    IF v_domain IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT k.key INTO v_key FROM mailroom.verp_key AS k WHERE k.singleton;
    RETURN mailroom_internal._verp_paths(p_message_id, p_recipients, v_domain, v_key);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._return_paths(bigint, bigint, integer) IS
'Internal: the VERP envelope senders of a message, one per envelope recipient (bounce+<id>-<n>-<signature>@<bounce domain>), NULL without a bounce domain.';

CREATE OR REPLACE FUNCTION mailroom_internal._signed_recipient(p_address text)
RETURNS TABLE (message_id bigint, recipient integer, purpose text, address text)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_address text := mailroom_internal._normalize_address(p_address);
    v_p text[];
    v_id bigint;
    v_n integer;
    v_purpose text;
    v_sig text;
    v_envelope text[];
BEGIN
    -- What a signed address names, when its signature is right and its message exists: the
    -- message, the recipient's envelope position and address (NULL for a message-level return
    -- path of a message with several recipients), and the purpose ('bounce' for a return path,
    -- 'unsubscribe'). No row otherwise: a bad signature and an unknown message look the same.
    -- Also takes a bare one-click token (<id>-<n>-<signature>) as 'unsubscribe'. Signatures are
    -- compared in constant time.
    IF v_address IS NULL OR length(v_address) > 320 THEN
        RETURN;
    END IF;
    v_p := regexp_match(v_address, '^(bounce|unsubscribe)\+([1-9][0-9]{0,17})-([1-9][0-9]{0,3})-([0-9a-f]{16})@([^@]+)$');
    IF v_p IS NOT NULL THEN
        IF NOT mailroom_internal._is_bounce_domain(v_p[5]) THEN
            RETURN;
        END IF;
        v_purpose := v_p[1];
        v_id := v_p[2]::bigint;
        v_n := v_p[3]::integer;
        v_sig := v_p[4];
    ELSE
        v_p := regexp_match(v_address, '^([1-9][0-9]{0,17})-([1-9][0-9]{0,3})-([0-9a-f]{16})$');
        IF v_p IS NOT NULL THEN
            v_purpose := 'unsubscribe';
            v_id := v_p[1]::bigint;
            v_n := v_p[2]::integer;
            v_sig := v_p[3];
        ELSE
            -- the message-level return path of the previous release
            v_p := regexp_match(v_address, '^bounce\+([1-9][0-9]{0,17})-([0-9a-f]{16})@([^@]+)$');
            IF v_p IS NULL OR NOT mailroom_internal._is_bounce_domain(v_p[3]) THEN
                RETURN;
            END IF;
            v_id := v_p[1]::bigint;
            IF NOT mailroom_internal._ct_equal(convert_to(v_p[2], 'UTF8'), convert_to(mailroom_internal._verp_signature(v_id), 'UTF8')) THEN
                RETURN;
            END IF;
            SELECT mailroom_internal._envelope(m.to_addrs, m.cc_addrs, m.bcc_addrs) INTO v_envelope
            FROM mailroom.outbound_messages AS m WHERE m.id = v_id;
            IF v_envelope IS NULL THEN
                RETURN;
            END IF;
            message_id := v_id;
            purpose := 'bounce';
            recipient := CASE WHEN cardinality(v_envelope) = 1 THEN 1 END;
            address := CASE WHEN cardinality(v_envelope) = 1 THEN v_envelope[1] END;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    IF NOT mailroom_internal._ct_equal(
        convert_to(v_sig, 'UTF8'),
        convert_to(
            mailroom_internal._recipient_signature(
                'mailroom-' || CASE WHEN v_purpose = 'bounce' THEN 'verp' ELSE v_purpose END, v_id, v_n,
                (SELECT k.key FROM mailroom.verp_key AS k WHERE k.singleton)
            ),
            'UTF8'
        )
    ) THEN
        RETURN;
    END IF;
    SELECT mailroom_internal._envelope(m.to_addrs, m.cc_addrs, m.bcc_addrs) INTO v_envelope
    FROM mailroom.outbound_messages AS m WHERE m.id = v_id;
    IF v_envelope IS NULL OR v_n > cardinality(v_envelope) THEN
        RETURN;
    END IF;
    -- an erased recipient (sql/07_erasure.sql: replaced in place, so every other position still
    -- names its own recipient) is nobody: its return path and link name no one
    IF mailroom_internal._is_erased_recipient(v_envelope[v_n]) THEN
        RETURN;
    END IF;
    message_id := v_id;
    recipient := v_n;
    purpose := v_purpose;
    address := v_envelope[v_n];
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._signed_recipient(text) IS
'Internal: the message, envelope position, purpose (bounce, unsubscribe) and address a signed address or one-click token names; no row when forged or its message is gone.';

CREATE OR REPLACE FUNCTION mailroom_internal._is_feedback_address(p_address text)
RETURNS boolean
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the configured address ARF complaint reports arrive at (outbound.feedback_address); PL/pgSQL
    -- for the reason given at _is_verp_address (every RCPT asks)
    RETURN coalesce(
        mailroom_internal._normalize_address(p_address) = mailroom_internal._normalize_address(
            nullif(btrim(mailroom.setting('outbound.feedback_address')), '')
        ),
        false
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._is_feedback_address(text) IS
'Internal: whether an address is the configured feedback (ARF complaint) address, outbound.feedback_address.';

CREATE OR REPLACE FUNCTION mailroom_internal._spend_signature(
    p_message_id bigint, p_recipient integer, p_address text, p_reason text
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_new boolean;
BEGIN
    -- A signature suppresses its recipient at most once per reason: the first time it is used for
    -- that reason the address is added (_add_suppression's rules), every later time nothing
    -- happens (a replayed report after an admin removed the entry). True when it suppressed.
    INSERT INTO mailroom.spent_signatures (message_id, recipient, reason, spent_at)
    VALUES (p_message_id, p_recipient, p_reason, mailroom.clock())
    ON CONFLICT DO NOTHING
    RETURNING true INTO v_new;
    IF v_new IS NULL THEN
        RETURN false;
    END IF;
    PERFORM mailroom_internal._add_suppression(p_address, p_reason, NULL, p_message_id);
    RETURN true;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._spend_signature(bigint, integer, text, text) IS
'Internal: suppress the recipient a signature names with a reason, the first time only (spent_signatures); true when it did.';

CREATE OR REPLACE FUNCTION mailroom_internal._recipient_position(p_to text[], p_cc text[], p_bcc text[], p_address text)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- where an address is among a message's recipients (to[1], cc[2], bcc[1]): never the address
    SELECT format('%s[%s]', k.kind, a.n)
    FROM (VALUES (1, 'to', p_to), (2, 'cc', p_cc), (3, 'bcc', p_bcc)) AS k (ord, kind, addrs)
    CROSS JOIN LATERAL unnest(k.addrs) WITH ORDINALITY AS a (address, n)
    WHERE mailroom_internal._normalize_address(a.address) = mailroom_internal._normalize_address(p_address)
    ORDER BY k.ord, a.n
    LIMIT 1;
$$;

COMMENT ON FUNCTION mailroom_internal._recipient_position(text[], text[], text[], text) IS
'Internal: the position of an address among a message''s recipients (to[1], cc[2], bcc[1]), NULL if not one.';

CREATE OR REPLACE FUNCTION mailroom.check_bounce_recipient(
    p_address text,
    p_size bigint DEFAULT null,
    p_sink boolean DEFAULT false
)
RETURNS TABLE (verdict text, address text, reply text)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- The RCPT verdict of `mailroom inbox serve`: a signed address at a bounce domain (a return
    -- path bounce+…, an unsubscribe address unsubscribe+…) is 'bounce' when it is valid, else
    -- 'unknown' (bad signature, unknown message: the same answer); the feedback address
    -- (outbound.feedback_address) is 'bounce'; any other address gets check_recipient's verdict
    -- (ok, unknown, deleted, ...), after the inbox of an unknown address on a catch-all domain, or
    -- in the sink (p_sink: the server's --sink, or the setting inbox.sink), was created
    -- (sql/24_catchall.sql). A refusing verdict comes with the SMTP reply the server sends
    -- (mailroom.error_codes). VOLATILE for that creation; PL/pgSQL, so its plans are kept.
    IF mailroom_internal._is_feedback_address(p_address) THEN
        verdict := 'bounce';
        address := mailroom_internal._normalize_address(p_address);
        reply := NULL;
        RETURN NEXT;
        RETURN;
    END IF;
    IF mailroom_internal._is_verp_address(p_address) THEN
        verdict := CASE WHEN EXISTS (SELECT 1 FROM mailroom_internal._signed_recipient(p_address)) THEN 'bounce' ELSE 'unknown' END;
        address := mailroom_internal._normalize_address(p_address);
        reply := mailroom_internal._verdict_reply(verdict);
        RETURN NEXT;
        RETURN;
    END IF;
    -- an inbox's injected fault at RCPT comes with its own reply (sql/24_faults.sql)
    RETURN QUERY
    SELECT c.verdict, c.address, coalesce(c.reply, mailroom_internal._verdict_reply(c.verdict))
    FROM mailroom_internal._check_recipient_fault(p_address, p_size, p_sink) AS c;
END;
$$;

COMMENT ON FUNCTION mailroom.check_bounce_recipient(text, bigint, boolean) IS
'RCPT-stage verdict of the inbound server: bounce for a valid signed address (a VERP return path, an unsubscribe address) or the feedback address, unknown for a forged one, else check_recipient''s verdict (an unknown address on a catch-all domain, or any with the sink on (p_sink or inbox.sink), gets its inbox first); with the SMTP reply of a refusing verdict.';

GRANT EXECUTE ON FUNCTION mailroom.check_bounce_recipient(text, bigint, boolean) TO mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom_internal._complaint_type(p_report jsonb)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- An ARF report (RFC 5965) is a complaint when its Feedback-Type says the recipient objects
    -- (abuse, fraud, virus); not-spam, auth-failure and the others are other feedback. NULL: not
    -- an ARF report.
    SELECT CASE
        WHEN NOT (p_report ? 'feedback_type') THEN NULL
        WHEN lower(btrim(p_report ->> 'feedback_type')) IN ('abuse', 'fraud', 'virus') THEN 'complaint'
        ELSE 'other'
    END;
$$;

COMMENT ON FUNCTION mailroom_internal._complaint_type(jsonb) IS
'Internal: what an ARF report means: complaint (Feedback-Type abuse, fraud, virus), other, NULL when it is no ARF report.';

CREATE OR REPLACE FUNCTION mailroom.record_bounce(p_return_path text, p_reports jsonb)
RETURNS TABLE (message_id bigint, outcome text, reports integer, suppressed integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_feedback boolean := mailroom_internal._is_feedback_address(p_return_path);
    v_id bigint;
    v_n integer;
    v_purpose text;
    v_rcpt text;
    v_now timestamptz := mailroom.clock();
    v_log_max integer := mailroom.setting('outbound.error_log_max_chars')::integer;
    v_to text[];
    v_cc text[];
    v_bcc text[];
    v_lines text[] := '{}';
    v_outcomes text[] := '{}';
    v_suppressed integer := 0;
    v_stamp text := to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
    v_outcome text;
    v_pos text;
    v_bounce record;  -- the first bounce report (hard or soft): what a message.bounced webhook says
    r record;
    s record;
BEGIN
    IF NOT v_feedback THEN
        SELECT g.message_id, g.recipient, g.purpose, g.address INTO v_id, v_n, v_purpose, v_rcpt
        FROM mailroom_internal._signed_recipient(p_return_path) AS g;
        IF v_id IS NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR360',
                MESSAGE = 'not a valid bounce address (unknown message or bad signature)';
        END IF;
    END IF;
    IF p_reports IS NULL OR jsonb_typeof(p_reports) <> 'array' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR361',
            MESSAGE = 'bounce reports must be a JSON array (empty: the bounce could not be parsed)';
    END IF;

    IF v_feedback THEN
        -- The feedback address: each ARF complaint names the complained-about message by the
        -- signed addresses it quotes (Original-Mail-From, the original's Return-Path or
        -- List-Unsubscribe): the first valid one decides, never an unsigned address.
        FOR r IN
            SELECT e.v, mailroom_internal._complaint_type(e.v) AS kind
            FROM jsonb_array_elements(p_reports) WITH ORDINALITY AS e (v, n)
            WHERE e.n <= 100 AND jsonb_typeof(e.v) = 'object' AND e.v ? 'feedback_type'
            ORDER BY e.n
        LOOP
            SELECT g.* INTO s
            FROM jsonb_array_elements_text(
                CASE WHEN jsonb_typeof(r.v -> 'signed') = 'array' THEN r.v -> 'signed' ELSE '[]' END
            ) WITH ORDINALITY AS a (address, n)
            CROSS JOIN LATERAL mailroom_internal._signed_recipient(left(a.address, 400)) AS g
            WHERE a.n <= 10 AND g.recipient IS NOT NULL
            ORDER BY a.n
            LIMIT 1;
            IF s.message_id IS NULL THEN
                v_outcomes := v_outcomes || 'ignored'::text;
                CONTINUE;
            END IF;
            v_id := s.message_id;
            v_outcome := r.kind;
            IF r.kind = 'complaint' THEN
                IF mailroom_internal._spend_signature(s.message_id, s.recipient, s.address, 'complaint') THEN
                    v_suppressed := v_suppressed + 1;
                ELSE
                    v_outcome := 'spent';
                END IF;
            END IF;
            SELECT mailroom_internal._recipient_position(m.to_addrs, m.cc_addrs, m.bcc_addrs, s.address) INTO v_pos
            FROM mailroom.outbound_messages AS m WHERE m.id = s.message_id;
            INSERT INTO mailroom.outbound_bounces (message_id, received_at, outcome, recipient, action)
            VALUES (s.message_id, v_now, v_outcome, v_pos, 'feedback:' || left(lower(r.v ->> 'feedback_type'), 20));
            UPDATE mailroom.outbound_messages AS m
            SET error_log = right(
                concat_ws(E'\n', m.error_log, concat_ws(' ', v_stamp, 'feedback', v_outcome, v_pos)), v_log_max
            )
            WHERE m.id = s.message_id;
            v_outcomes := v_outcomes || v_outcome;
        END LOOP;
        RETURN QUERY
        SELECT
            v_id,
            coalesce(
                (
                    SELECT o.outcome FROM unnest(v_outcomes) AS o (outcome)
                    ORDER BY array_position(ARRAY['complaint', 'other', 'spent', 'ignored'], o.outcome)
                    LIMIT 1
                ),
                'unparsed'
            ),
            cardinality(v_outcomes),
            v_suppressed;
        RETURN;
    END IF;

    SELECT m.to_addrs, m.cc_addrs, m.bcc_addrs INTO v_to, v_cc, v_bcc
    FROM mailroom.outbound_messages AS m
    WHERE m.id = v_id;
    v_pos := mailroom_internal._recipient_position(v_to, v_cc, v_bcc, v_rcpt);

    IF v_purpose = 'unsubscribe' THEN
        -- mail to an unsubscribe address (RFC 2369 mailto): whatever it says, its recipient
        -- asked to be removed, once
        v_outcome := CASE
            WHEN mailroom_internal._spend_signature(v_id, v_n, v_rcpt, 'unsubscribe') THEN 'unsubscribe' ELSE 'spent'
        END;
        INSERT INTO mailroom.outbound_bounces (message_id, received_at, outcome, recipient, action)
        VALUES (v_id, v_now, v_outcome, v_pos, 'unsubscribe:mailto');
        UPDATE mailroom.outbound_messages AS m
        SET error_log = right(concat_ws(E'\n', m.error_log, concat_ws(' ', v_stamp, 'unsubscribe', v_outcome, v_pos)), v_log_max)
        WHERE m.id = v_id;
        RETURN QUERY SELECT v_id, v_outcome, 1, CASE WHEN v_outcome = 'unsubscribe' THEN 1 ELSE 0 END;
        RETURN;
    END IF;

    -- A return path names one recipient (v_rcpt; NULL for a message-level return path of a
    -- message with several): one decision per report (the first 100 objects). An ARF report
    -- (Feedback-Type abuse, fraud, virus) is a complaint about that recipient. A DSN report
    -- about anyone else is ignored (a recipient cannot get another suppressed); Action failed
    -- with a permanent status (5.x.x, else a 5yz reply code: the rule of finalize_messages) is a
    -- hard bounce; failed with anything else a soft bounce; delayed is noted; other actions are
    -- noted. A return path suppresses at most once per reason (a replay is 'spent').
    FOR r IN
        WITH rep AS (
            SELECT
                e.n,
                mailroom_internal._normalize_address(e.v ->> 'recipient') AS rcpt,
                mailroom_internal._complaint_type(e.v) AS feedback,
                -- one word (RFC 3464: failed, delayed, delivered, relayed, expanded); else NULL
                substring(lower(btrim(e.v ->> 'action')) FROM '^([a-z-]{1,20})$') AS action,
                CASE
                    WHEN btrim(e.v ->> 'status') ~ '^[245][.][0-9]{1,3}[.][0-9]{1,3}$' THEN btrim(e.v ->> 'status')
                END AS status,
                CASE WHEN btrim(e.v ->> 'smtp_code') ~ '^[2-5][0-9][0-9]$' THEN btrim(e.v ->> 'smtp_code')::integer END
                    AS code,
                left(e.v ->> 'diagnostic', 500) AS diagnostic
            FROM jsonb_array_elements(p_reports) WITH ORDINALITY AS e (v, n)
            WHERE e.n <= 100 AND jsonb_typeof(e.v) = 'object'
        )

        SELECT
            rep.*,
            CASE
                WHEN v_rcpt IS NULL THEN 'ignored'
                WHEN rep.feedback IS NOT NULL THEN rep.feedback
                WHEN rep.rcpt IS DISTINCT FROM mailroom_internal._normalize_address(v_rcpt) THEN 'ignored'
                WHEN rep.action = 'failed'
                    AND mailroom_internal._classify_outcome('reply', rep.code, rep.status) = 'permanent' THEN 'hard_bounce'
                WHEN rep.action = 'failed' THEN 'soft_bounce'
                WHEN rep.action = 'delayed' THEN 'delayed'
                ELSE 'other'
            END AS outcome
        FROM rep
        ORDER BY rep.n
    LOOP
        v_outcome := r.outcome;
        IF v_outcome IN ('hard_bounce', 'complaint') THEN
            IF mailroom_internal._spend_signature(v_id, v_n, v_rcpt, v_outcome) THEN
                v_suppressed := v_suppressed + 1;
            ELSE
                v_outcome := 'spent';
            END IF;
        END IF;
        INSERT INTO mailroom.outbound_bounces (
            message_id, received_at, outcome, recipient, action, status, smtp_code, diagnostic
        )
        VALUES (
            v_id, v_now, v_outcome, CASE WHEN v_outcome <> 'ignored' THEN v_pos END,
            coalesce(r.action, CASE WHEN r.feedback IS NOT NULL THEN 'feedback' END), r.status, r.code,
            mailroom.redact_pii(r.diagnostic)
        );
        v_outcomes := v_outcomes || v_outcome;
        IF r.outcome IN ('hard_bounce', 'soft_bounce') AND v_bounce IS NULL THEN
            SELECT r.outcome AS kind, r.code, r.status INTO v_bounce;
        END IF;
        IF v_outcome <> 'ignored' THEN
            v_lines := v_lines || concat_ws(
                ' ', v_stamp, 'bounce', v_outcome, v_pos, r.action, r.status,
                ': ' || regexp_replace(r.diagnostic, '[\r\n]+', ' ', 'g')
            );
        END IF;
    END LOOP;

    IF cardinality(v_outcomes) = 0 THEN
        -- nothing could be read from it: noted, so an operator sees that bounces arrive
        INSERT INTO mailroom.outbound_bounces (message_id, received_at, outcome)
        VALUES (v_id, v_now, 'unparsed');
        v_outcomes := ARRAY['unparsed'];
        v_lines := ARRAY[v_stamp || ' bounce unparsed'];
    END IF;

    IF cardinality(v_lines) > 0 THEN
        -- noted on the message; the error_log trigger redacts it (sql/31_outbound_redact.sql)
        UPDATE mailroom.outbound_messages AS m
        SET error_log = right(concat_ws(E'\n', m.error_log, array_to_string(v_lines, E'\n')), v_log_max)
        WHERE m.id = v_id;
    END IF;

    -- webhooks (sql/38_outbound_webhooks.sql): message.bounced for the endpoints of the message's
    -- sender, in this transaction; nothing is looked for while no sender has an endpoint
    IF v_bounce IS NOT NULL AND EXISTS (SELECT 1 FROM mailroom.webhook_endpoints AS w WHERE w.sender_id IS NOT NULL) THEN
        PERFORM mailroom_internal._webhook_bounced(v_id, v_bounce.kind, v_bounce.code, v_bounce.status);
    END IF;

    RETURN QUERY
    SELECT
        v_id,
        (
            SELECT o.outcome FROM unnest(v_outcomes) AS o (outcome)
            ORDER BY array_position(
                ARRAY['hard_bounce', 'complaint', 'soft_bounce', 'delayed', 'other', 'spent', 'ignored', 'unparsed'],
                o.outcome
            )
            LIMIT 1
        ),
        cardinality(v_outcomes),
        v_suppressed;
END;
$$;

COMMENT ON FUNCTION mailroom.record_bounce(text, jsonb) IS
'Record what arrived at a signed address: to a return path, a DSN report about its own recipient with failed + 5.x.x suppresses it (hard_bounce), an ARF complaint suppresses it (complaint), reports about others are ignored, [] is unparsed; mail to an unsubscribe address suppresses its recipient (unsubscribe); at the feedback address, each ARF complaint suppresses the recipient its quoted signed address names. A signature suppresses once per reason (a replay is spent). Errors: MR360 not a valid return path, MR361 reports not an array.';

GRANT EXECUTE ON FUNCTION mailroom.record_bounce(text, jsonb) TO mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom.set_sender_bounce_domain(p_sender text, p_domain text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_domain IS NOT NULL AND mailroom_internal._bounce_domain_name(p_domain) IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR362',
            MESSAGE = 'the bounce domain must be a domain name (NULL: use the setting outbound.bounce_domain)';
    END IF;
    UPDATE mailroom.senders AS s
    SET bounce_domain = mailroom_internal._bounce_domain_name(p_domain), updated_at = mailroom.clock()
    WHERE s.name = p_sender;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR363',
            MESSAGE = format('unknown sender %s', coalesce(quote_literal(left(p_sender, 64)), 'NULL'));
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom.set_sender_bounce_domain(text, text) IS
'Set a sender''s VERP bounce domain (NULL: the setting outbound.bounce_domain applies). Errors: MR362 not a domain name, MR363 unknown sender.';

GRANT EXECUTE ON FUNCTION mailroom.set_sender_bounce_domain(text, text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.record_refused_recipients(
    p_ids bigint[],
    p_claim_tokens bigint[],
    p_recipients text[],
    p_smtp_codes integer[],
    p_enhanced_codes text[]
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_n integer := coalesce(cardinality(p_ids), 0);
    v_suppressed integer := 0;
    r record;
BEGIN
    -- The relay refused recipients of a message at RCPT (synchronously) and the sender reports
    -- them, one element per refused recipient, before it finalizes the message (the claim token
    -- fences it: a message no longer processing under that token is skipped). A permanent reply
    -- (the rule of finalize_messages) is a hard bounce of that recipient; any other is noted. A
    -- recipient the message does not have is skipped. When every recipient was refused, the
    -- message's outcome is 'refused' and finalize_messages picks, from the rows recorded here under
    -- the claim token, the refusal that governs.
    IF p_ids IS NULL OR p_claim_tokens IS NULL OR p_recipients IS NULL
        OR cardinality(p_claim_tokens) <> v_n OR cardinality(p_recipients) <> v_n
        OR coalesce(cardinality(p_smtp_codes), v_n) <> v_n
        OR coalesce(cardinality(p_enhanced_codes), v_n) <> v_n
        OR v_n > 100000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR364',
            MESSAGE = 'refused recipient arrays must be non-NULL and of equal length (ids, claim tokens, recipients[, codes, enhanced codes]), at most 100000';
    END IF;
    FOR r IN
        SELECT
            m.id,
            m.claim_token,
            mailroom_internal._normalize_address(u.rcpt) AS rcpt,
            u.code,
            CASE WHEN u.enhanced ~ '^[245][.][0-9]{1,3}[.][0-9]{1,3}$' THEN u.enhanced END AS enhanced,
            p.pos
        FROM unnest(p_ids, p_claim_tokens, p_recipients, p_smtp_codes, p_enhanced_codes)
            WITH ORDINALITY AS u (id, claim_token, rcpt, code, enhanced, n)
        INNER JOIN mailroom.outbound_messages AS m
            ON m.id = u.id AND m.claim_token = u.claim_token AND m.status = 'processing'
        CROSS JOIN LATERAL (
            SELECT format('%s[%s]', k.kind, a.n) AS pos
            FROM (VALUES (1, 'to', m.to_addrs), (2, 'cc', m.cc_addrs), (3, 'bcc', m.bcc_addrs)) AS k (ord, kind, addrs)
            CROSS JOIN LATERAL unnest(k.addrs) WITH ORDINALITY AS a (address, n)
            WHERE mailroom_internal._normalize_address(a.address) = mailroom_internal._normalize_address(u.rcpt)
            ORDER BY k.ord, a.n
            LIMIT 1
        ) AS p
        WHERE m.id = any(p_ids)
        ORDER BY u.n
    LOOP
        IF mailroom_internal._classify_outcome('reply', r.code, r.enhanced) = 'permanent' THEN
            PERFORM mailroom_internal._add_suppression(r.rcpt, 'hard_bounce', NULL, r.id);
            v_suppressed := v_suppressed + 1;
            INSERT INTO mailroom.outbound_bounces (
                message_id, received_at, outcome, recipient, action, status, smtp_code, claim_token
            )
            VALUES (r.id, v_now, 'hard_bounce', r.pos, 'refused', r.enhanced, r.code, r.claim_token);
        ELSE
            INSERT INTO mailroom.outbound_bounces (
                message_id, received_at, outcome, recipient, action, status, smtp_code, claim_token
            )
            VALUES (r.id, v_now, 'soft_bounce', r.pos, 'refused', r.enhanced, r.code, r.claim_token);
        END IF;
    END LOOP;
    RETURN v_suppressed;
END;
$$;

COMMENT ON FUNCTION mailroom.record_refused_recipients(bigint[], bigint[], text[], integer[], text[]) IS
'Record recipients a relay refused at RCPT for claimed messages (fenced on the claim token): a permanent reply suppresses the recipient (hard_bounce), others are noted; returns how many were suppressed. Errors: MR364 arrays.';

GRANT EXECUTE ON FUNCTION mailroom.record_refused_recipients(bigint[], bigint[], text[], integer[], text[]) TO mailroom_sender;
