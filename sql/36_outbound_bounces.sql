-- Bounces (docs/bounces.md): VERP return paths for outbound mail and the bounce reports that
-- come back to them through `mailroom inbox serve`.
--
-- Return path: bounce+<outbound message id>-<signature>@<bounce domain>. The signature is the
-- first 64 bits of HMAC-SHA256('mailroom-verp:' || id) under mailroom.verp_key (migration 0095),
-- in lower-case hex (16 characters; local parts may be case-folded on the way back, the check
-- lower-cases first). The key is read only here, inside SECURITY DEFINER callers; no function
-- returns it.
-- The bounce domain is the sender's bounce_domain, else the setting outbound.bounce_domain;
-- neither: no VERP (claim_messages returns return_path NULL and the sender uses from_address).

CREATE OR REPLACE FUNCTION mailroom._bounce_domain_name(p_domain text)
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
    IF mailroom._is_domain_name(v_domain) THEN
        RETURN v_domain;
    END IF;
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION mailroom._bounce_domain_name(text) IS
'Internal: a bounce domain in lower case if it is a domain name, else NULL (an empty setting: no VERP).';

CREATE OR REPLACE FUNCTION mailroom._is_bounce_domain(p_domain text)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- a domain some return path may be on now: the setting's or a sender's
    SELECT coalesce(
        mailroom._bounce_domain_name(p_domain) = mailroom._bounce_domain_name(
            mailroom.setting('outbound.bounce_domain')
        )
        OR EXISTS (
            SELECT 1 FROM mailroom.senders AS s
            WHERE s.bounce_domain = mailroom._bounce_domain_name(p_domain)
        ),
        false
    );
$$;

COMMENT ON FUNCTION mailroom._is_bounce_domain(text) IS
'Internal: whether a domain is a bounce domain now (the setting outbound.bounce_domain or a sender''s bounce_domain).';

CREATE OR REPLACE FUNCTION mailroom._verp_signature(p_message_id bigint, p_key bytea)
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
            mailroom._hmac(convert_to('mailroom-verp:' || p_message_id::text, 'UTF8'), p_key, 'sha256')
            FROM 1 FOR 8
        ),
        'hex'
    );
END;
$$;

COMMENT ON FUNCTION mailroom._verp_signature(bigint, bytea) IS
'Internal: the VERP signature of an outbound message id under a key (truncated HMAC-SHA256, 16 hex characters).';

CREATE OR REPLACE FUNCTION mailroom._verp_signature(p_message_id bigint)
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT mailroom._verp_signature(p_message_id, k.key) FROM mailroom.verp_key AS k WHERE k.singleton;
$$;

COMMENT ON FUNCTION mailroom._verp_signature(bigint) IS
'Internal: the VERP signature of an outbound message id under mailroom.verp_key.';

CREATE OR REPLACE FUNCTION mailroom._return_path(p_message_id bigint, p_sender_id bigint)
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
    v_domain := mailroom._bounce_domain_name(v_domain);
    IF v_domain IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT k.key INTO v_key FROM mailroom.verp_key AS k WHERE k.singleton;
    RETURN 'bounce+' || p_message_id::text || '-' || mailroom._verp_signature(p_message_id, v_key) || '@' || v_domain;
END;
$$;

COMMENT ON FUNCTION mailroom._return_path(bigint, bigint) IS
'Internal: the VERP envelope sender of an outbound message (bounce+<id>-<signature>@<bounce domain>), NULL without a bounce domain.';

CREATE OR REPLACE FUNCTION mailroom._is_verp_address(p_address text)
RETURNS boolean
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- bounce+…@<a bounce domain>: such an address is a return path or nothing (never a mailbox)
    SELECT coalesce(
        a.address LIKE 'bounce+%@%'
        AND mailroom._is_bounce_domain(split_part(a.address, '@', 2))
        AND a.address NOT LIKE '%@%@%',
        false
    )
    FROM (SELECT mailroom._normalize_address(p_address) AS address) AS a;
$$;

COMMENT ON FUNCTION mailroom._is_verp_address(text) IS
'Internal: whether an address has the form of a return path (bounce+… at a bounce domain), valid or not.';

CREATE OR REPLACE FUNCTION mailroom._verp_message_id(p_address text)
RETURNS bigint
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- The outbound message a return path names, when its signature is right and the message
    -- exists; else NULL (no difference between the two: nothing to probe). The signature is
    -- compared in constant time.
    SELECT m.id
    FROM (
        SELECT regexp_match(
            mailroom._normalize_address(p_address), '^bounce\+([1-9][0-9]{0,17})-([0-9a-f]{16})@([^@]+)$'
        ) AS p
    ) AS a
    INNER JOIN mailroom.outbound_messages AS m ON m.id = a.p[1]::bigint
    WHERE
        mailroom._is_bounce_domain(a.p[3])
        AND mailroom._ct_equal(
            convert_to(a.p[2], 'UTF8'), convert_to(mailroom._verp_signature(a.p[1]::bigint), 'UTF8')
        );
$$;

COMMENT ON FUNCTION mailroom._verp_message_id(text) IS
'Internal: the outbound message id of a valid return path (right signature, bounce domain, message exists), else NULL.';

CREATE OR REPLACE FUNCTION mailroom.check_bounce_recipient(
    p_address text,
    p_size bigint DEFAULT null
)
RETURNS TABLE (verdict text, address text, reply text)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- The RCPT verdict of `mailroom inbox serve`: a return path (bounce+… at a bounce domain) is
    -- 'bounce' when it is valid, else 'unknown' (bad signature, unknown message: the same
    -- answer); any other address gets check_recipient's verdict (ok, unknown, deleted, ...),
    -- after the inbox of an unknown address on a catch-all domain was created (sql/24_catchall.sql).
    -- A refusing verdict comes with the SMTP reply the server sends (mailroom.error_codes).
    -- VOLATILE for that creation; PL/pgSQL, so its plans are kept for the session.
    IF mailroom._is_verp_address(p_address) THEN
        verdict := CASE WHEN mailroom._verp_message_id(p_address) IS NOT NULL THEN 'bounce' ELSE 'unknown' END;
        address := mailroom._normalize_address(p_address);
        reply := mailroom._verdict_reply(verdict);
        RETURN NEXT;
        RETURN;
    END IF;
    RETURN QUERY
    SELECT c.verdict, c.address, mailroom._verdict_reply(c.verdict)
    FROM mailroom._check_recipient_or_claim(p_address, p_size) AS c;
END;
$$;

COMMENT ON FUNCTION mailroom.check_bounce_recipient(text, bigint) IS
'RCPT-stage verdict of the inbound server: bounce for a valid VERP return path, unknown for a forged one, else check_recipient''s verdict (an unknown address on a catch-all domain gets its inbox first); with the SMTP reply of a refusing verdict.';

GRANT EXECUTE ON FUNCTION mailroom.check_bounce_recipient(text, bigint) TO mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom.record_bounce(p_return_path text, p_reports jsonb)
RETURNS TABLE (message_id bigint, outcome text, reports integer, suppressed integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint := mailroom._verp_message_id(p_return_path);
    v_now timestamptz := mailroom.clock();
    v_log_max integer := mailroom.setting('outbound.error_log_max_chars')::integer;
    v_to text[];
    v_cc text[];
    v_bcc text[];
    v_lines text[] := '{}';
    v_outcomes text[] := '{}';
    v_suppressed integer := 0;
    v_stamp text := to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"');
    r record;
BEGIN
    IF v_id IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR360',
            MESSAGE = 'not a valid bounce address (unknown message or bad signature)';
    END IF;
    IF p_reports IS NULL OR jsonb_typeof(p_reports) <> 'array' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR361',
            MESSAGE = 'bounce reports must be a JSON array (empty: the bounce could not be parsed)';
    END IF;
    SELECT m.to_addrs, m.cc_addrs, m.bcc_addrs INTO v_to, v_cc, v_bcc
    FROM mailroom.outbound_messages AS m
    WHERE m.id = v_id;

    -- One decision per report (the first 100 objects): a recipient that is not one of the
    -- message's is ignored (a forged report suppresses nobody); Action failed with a permanent
    -- status (5.x.x, else a 5yz reply code: the rule of finalize_messages) is a hard bounce;
    -- failed with anything else a soft bounce; delayed is noted; other actions are noted.
    FOR r IN
        WITH rep AS (
            SELECT
                e.n,
                mailroom._normalize_address(e.v ->> 'recipient') AS rcpt,
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
        ),

        rcpts AS (
            SELECT k.ord, format('%s[%s]', k.kind, a.n) AS pos, mailroom._normalize_address(a.address) AS address
            FROM (VALUES (1, 'to', v_to), (2, 'cc', v_cc), (3, 'bcc', v_bcc)) AS k (ord, kind, addrs)
            CROSS JOIN LATERAL unnest(k.addrs) WITH ORDINALITY AS a (address, n)
        )

        SELECT
            rep.*,
            p.pos,
            CASE
                WHEN p.pos IS NULL THEN 'ignored'
                WHEN rep.action = 'failed'
                    AND mailroom._classify_outcome('reply', rep.code, rep.status) = 'permanent' THEN 'hard_bounce'
                WHEN rep.action = 'failed' THEN 'soft_bounce'
                WHEN rep.action = 'delayed' THEN 'delayed'
                ELSE 'other'
            END AS outcome
        FROM rep
        LEFT JOIN LATERAL (
            SELECT x.pos FROM rcpts AS x WHERE x.address = rep.rcpt ORDER BY x.ord, x.pos LIMIT 1
        ) AS p ON true
        ORDER BY rep.n
    LOOP
        IF r.outcome = 'hard_bounce' THEN
            PERFORM mailroom._add_suppression(r.rcpt, 'hard_bounce', NULL, v_id);
            v_suppressed := v_suppressed + 1;
        END IF;
        INSERT INTO mailroom.outbound_bounces (
            message_id, received_at, outcome, recipient, action, status, smtp_code, diagnostic
        )
        VALUES (
            v_id, v_now, r.outcome, r.pos, r.action, r.status, r.code, mailroom.redact_pii(r.diagnostic)
        );
        v_outcomes := v_outcomes || r.outcome;
        IF r.outcome <> 'ignored' THEN
            v_lines := v_lines || concat_ws(
                ' ', v_stamp, 'bounce', r.outcome, r.pos, r.action, r.status,
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

    RETURN QUERY
    SELECT
        v_id,
        (
            SELECT o.outcome FROM unnest(v_outcomes) AS o (outcome)
            ORDER BY array_position(
                ARRAY['hard_bounce', 'soft_bounce', 'delayed', 'other', 'ignored', 'unparsed'], o.outcome
            )
            LIMIT 1
        ),
        cardinality(v_outcomes),
        v_suppressed;
END;
$$;

COMMENT ON FUNCTION mailroom.record_bounce(text, jsonb) IS
'Record a parsed bounce sent to a VERP return path: per report, failed + 5.x.x suppresses the recipient (hard_bounce), delayed and 4.x.x are noted; foreign recipients are ignored, [] is unparsed. Errors: MR360 not a valid return path, MR361 reports not an array.';

GRANT EXECUTE ON FUNCTION mailroom.record_bounce(text, jsonb) TO mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom.set_sender_bounce_domain(p_sender text, p_domain text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_domain IS NOT NULL AND mailroom._bounce_domain_name(p_domain) IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR362',
            MESSAGE = 'the bounce domain must be a domain name (NULL: use the setting outbound.bounce_domain)';
    END IF;
    UPDATE mailroom.senders AS s
    SET bounce_domain = mailroom._bounce_domain_name(p_domain), updated_at = mailroom.clock()
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
            mailroom._normalize_address(u.rcpt) AS rcpt,
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
            WHERE mailroom._normalize_address(a.address) = mailroom._normalize_address(u.rcpt)
            ORDER BY k.ord, a.n
            LIMIT 1
        ) AS p
        WHERE m.id = any(p_ids)
        ORDER BY u.n
    LOOP
        IF mailroom._classify_outcome('reply', r.code, r.enhanced) = 'permanent' THEN
            PERFORM mailroom._add_suppression(r.rcpt, 'hard_bounce', NULL, r.id);
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
