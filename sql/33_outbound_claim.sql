-- claim_messages: one statement turns up to p_limit due rows into processing under a lease
-- (FOR UPDATE SKIP LOCKED over the partial index outbound_messages_due_idx) and returns them
-- with their relay settings; the SMTP password is decrypted only when the caller passes the key.

CREATE OR REPLACE FUNCTION mailroom._claim_statement()
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    -- $1 now, $2 limit, $3 worker, $4 lease, $5 key. Run with EXECUTE, so every call is
    -- planned with the actual LIMIT and clock (a cached generic plan costs LIMIT $2 blind and
    -- can flip to a seq scan + sort on a big queue). _explain_claim shows the same text's plan.
    SELECT $q$
WITH due AS (
    SELECT m.id
    FROM mailroom.outbound_messages AS m
    WHERE
        m.status = 'queued'
        -- due: never tried or its retry time has come; the coalesce twin says the same on
        -- the index expression of outbound_messages_due_idx and bounds the index scan
        AND (m.next_retry_at IS NULL OR m.next_retry_at <= $1)
        AND coalesce(m.next_retry_at, '-infinity'::timestamptz) <= $1
    ORDER BY coalesce(m.next_retry_at, '-infinity'::timestamptz), m.id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
),

claimed AS (
    UPDATE mailroom.outbound_messages AS m
    SET
        status = 'processing',
        claimed_by = $3,
        claim_token = nextval('mailroom.outbound_claim_token_seq'),
        claimed_at = $1,
        lease_expires_at = $1 + $4,
        updated_at = $1
    FROM due
    WHERE m.id = due.id
    RETURNING m.*
),

relays AS MATERIALIZED (
    -- one decryption per sender, not per message
    SELECT
        s.id,
        s.name,
        s.from_address,
        s.smtp_host,
        s.smtp_port,
        s.smtp_security,
        s.smtp_username,
        mailroom._smtp_password(s.smtp_password_encrypted, $5, s.name) AS smtp_password,
        s.smtp_password_encrypted IS NOT NULL AS smtp_password_set
    FROM mailroom.senders AS s
    WHERE s.id IN (SELECT c.sender_id FROM claimed AS c)
)

SELECT
    c.id,
    c.claim_token,
    c.attempts,
    c.message_id,
    r.name,
    r.from_address,
    c.to_addrs,
    c.cc_addrs,
    c.bcc_addrs,
    c.subject,
    c.text_body,
    c.html_body,
    c.headers,
    c.created_at,
    c.possibly_sent,
    r.smtp_host,
    r.smtp_port,
    r.smtp_security,
    r.smtp_username,
    r.smtp_password,
    r.smtp_password_set,
    -- the VERP envelope sender (sql/26_bounces.sql), NULL without a bounce domain
    mailroom._return_path(c.id, c.sender_id) AS return_path
FROM claimed AS c
INNER JOIN relays AS r ON c.sender_id = r.id
ORDER BY c.id
$q$::text;
$fn$;

CREATE OR REPLACE FUNCTION mailroom.claim_messages(
    p_limit integer,
    p_worker text,
    p_key bytea DEFAULT null,
    p_lease interval DEFAULT null
)
RETURNS TABLE (
    id bigint,
    claim_token bigint,
    attempts integer,
    message_id text,
    sender_name text,
    from_address text,
    to_addrs text[],
    cc_addrs text[],
    bcc_addrs text[],
    subject text,
    text_body text,
    html_body text,
    headers jsonb,
    created_at timestamptz,
    possibly_sent boolean,
    smtp_host text,
    smtp_port integer,
    smtp_security text,
    smtp_username text,
    smtp_password text,
    smtp_password_set boolean,
    return_path text
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_lease interval;
BEGIN
    IF p_limit IS NULL OR p_limit NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR320',
            MESSAGE = format('claim limit must be between 1 and 10000, got %s', coalesce(p_limit::text, 'NULL'));
    END IF;
    IF p_worker IS NULL OR length(p_worker) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR321',
            MESSAGE = 'worker name must be 1-200 characters';
    END IF;
    v_lease := coalesce(p_lease, mailroom.setting('outbound.lease')::interval);
    IF v_lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR322',
            MESSAGE = format('lease must be positive, got %s', v_lease);
    END IF;
    PERFORM mailroom._check_outbound_key(p_key);

    RETURN QUERY EXECUTE mailroom._claim_statement()
    USING v_now, p_limit, p_worker, v_lease, p_key;
END;
$$;

COMMENT ON FUNCTION mailroom.claim_messages(integer, text, bytea, interval) IS
'Claim up to p_limit due queued messages (SKIP LOCKED) under a lease; returns them with relay settings.';

GRANT EXECUTE ON FUNCTION mailroom.claim_messages(integer, text, bytea, interval) TO mailroom_sender;

CREATE OR REPLACE FUNCTION mailroom._explain_claim(p_limit integer DEFAULT 100)
RETURNS SETOF text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- EXPLAIN without ANALYZE: plans the exact claim statement, changes nothing.
    RETURN QUERY EXECUTE 'EXPLAIN ' || mailroom._claim_statement()
    USING mailroom.clock(), p_limit, 'explain', interval '5 minutes', NULL::bytea;
END;
$$;

COMMENT ON FUNCTION mailroom._claim_statement() IS
'Internal: text of the claim statement, run with EXECUTE so each call is planned with its real LIMIT.';

COMMENT ON FUNCTION mailroom._explain_claim(integer) IS
'Internal: EXPLAIN of the exact claim statement (pgTAP checks it uses the partial index).';
