-- One-click unsubscribe (RFC 8058, RFC 2369) for bulk mail (docs/deliverability.md).
--
-- A message marked bulk at enqueue (enqueue_bulk_message; never mailroom's own activation or
-- recovery emails) carries, per recipient (one SMTP transaction each, like the return paths):
--   List-Unsubscribe: <https://<base>/unsubscribe/<id>-<n>-<signature>>, <mailto:unsubscribe+<id>-<n>-<signature>@<bounce domain>>
--   List-Unsubscribe-Post: List-Unsubscribe=One-Click          (only with the https link)
-- The token names the message and the recipient's envelope position, signed like the return
-- paths (sql/36_outbound_bounces.sql, purpose mailroom-unsubscribe). The HTTP face's POST calls
-- unsubscribe(); mail to the mailto address reaches record_bounce through `mailroom inbox serve`.
-- Either adds the recipient to the suppression list with reason unsubscribe, once.

CREATE OR REPLACE FUNCTION mailroom_internal._unsubscribe_base()
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the setting outbound.unsubscribe_base_url when it is an https URL without query or
    -- fragment (RFC 8058 requires https), without its trailing slash; else NULL
    SELECT rtrim(b.v, '/')
    FROM (SELECT btrim(mailroom.setting('outbound.unsubscribe_base_url')) AS v) AS b
    WHERE b.v ~ '^https://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$';
$$;

COMMENT ON FUNCTION mailroom_internal._unsubscribe_base() IS
'Internal: the https base of one-click unsubscribe links (outbound.unsubscribe_base_url), NULL when unset or not https.';

CREATE OR REPLACE FUNCTION mailroom_internal._list_unsubscribe(p_message_id bigint, p_sender_id bigint, p_recipients integer)
RETURNS text[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_base text := mailroom_internal._unsubscribe_base();
    v_domain text := mailroom_internal._message_bounce_domain(p_sender_id);
    v_key bytea;
BEGIN
    -- The List-Unsubscribe value of each envelope recipient (the https link, the mailto address,
    -- or both); NULL when neither the base URL nor a bounce domain is set.
    IF v_base IS NULL AND v_domain IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT k.key INTO v_key FROM mailroom.verp_key AS k WHERE k.singleton;
    RETURN ARRAY(
        SELECT concat_ws(
            ', ',
            '<' || v_base || '/unsubscribe/' || t.token || '>',
            '<mailto:unsubscribe+' || t.token || '@' || v_domain || '>'
        )
        FROM (
            SELECT
                n,
                p_message_id::text || '-' || n::text || '-'
                || mailroom_internal._recipient_signature('mailroom-unsubscribe', p_message_id, n, v_key) AS token
            FROM generate_series(1, p_recipients) AS n
        ) AS t
        ORDER BY t.n
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._list_unsubscribe(bigint, bigint, integer) IS
'Internal: the List-Unsubscribe header value of each envelope recipient of a bulk message (https one-click link and/or signed mailto), NULL without either.';

CREATE OR REPLACE FUNCTION mailroom.unsubscribe(p_token text, p_one_click text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
    v_n integer;
    v_rcpt text;
    v_done boolean;
    v_pos text;
BEGIN
    -- RFC 8058: a POST whose body has List-Unsubscribe=One-Click (p_one_click: the value of that
    -- form field) to the link of one recipient of one bulk message. The token's signature names
    -- both; the recipient is suppressed with reason unsubscribe the first time (true), a repeat
    -- does nothing (false) and is answered the same by the HTTP face.
    IF p_one_click IS DISTINCT FROM 'One-Click' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR384',
            MESSAGE = 'the request must carry List-Unsubscribe=One-Click (RFC 8058)';
    END IF;
    IF p_token IS NULL OR p_token !~ '^[1-9][0-9]{0,17}-[1-9][0-9]{0,3}-[0-9a-fA-F]{16}$' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR380',
            MESSAGE = 'not a valid unsubscribe token';
    END IF;
    SELECT g.message_id, g.recipient, g.address INTO v_id, v_n, v_rcpt
    FROM mailroom_internal._signed_recipient(p_token) AS g
    WHERE g.purpose = 'unsubscribe';
    IF v_id IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR380',
            MESSAGE = 'not a valid unsubscribe token';
    END IF;
    v_done := mailroom_internal._spend_signature(v_id, v_n, v_rcpt, 'unsubscribe');
    SELECT mailroom_internal._recipient_position(m.to_addrs, m.cc_addrs, m.bcc_addrs, v_rcpt) INTO v_pos
    FROM mailroom.outbound_messages AS m WHERE m.id = v_id;
    INSERT INTO mailroom.outbound_bounces (message_id, received_at, outcome, recipient, action)
    VALUES (v_id, mailroom.clock(), CASE WHEN v_done THEN 'unsubscribe' ELSE 'spent' END, v_pos, 'unsubscribe:one-click');
    RETURN v_done;
END;
$$;

COMMENT ON FUNCTION mailroom.unsubscribe(text, text) IS
'One-click unsubscribe (RFC 8058): p_one_click must be One-Click; the token names a message and a recipient, suppressed with reason unsubscribe the first time (true), a repeat changes nothing (false). Errors: MR380 not a valid token, MR384 not One-Click.';

GRANT EXECUTE ON FUNCTION mailroom.unsubscribe(text, text) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom_internal._mark_bulk(p_id bigint)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$
    -- an application's message becomes bulk (never one of mailroom's own token emails)
    UPDATE mailroom.outbound_messages AS m
    SET bulk = true
    WHERE m.id = p_id AND NOT m.bulk AND m.token_id IS NULL;
$$;

COMMENT ON FUNCTION mailroom_internal._mark_bulk(bigint) IS
'Internal: mark a just-queued application message bulk (List-Unsubscribe at claim); never a token email.';

CREATE OR REPLACE FUNCTION mailroom.enqueue_bulk_message(
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
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    -- enqueue_message, and the message is bulk: it leaves with List-Unsubscribe (one-click)
    v_id := mailroom.enqueue_message(
        p_sender, p_to, p_subject, p_text_body, p_html_body, p_cc, p_bcc, p_headers,
        p_idempotency_key, p_send_after, p_priority
    );
    PERFORM mailroom_internal._mark_bulk(v_id);
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom.enqueue_bulk_message(
    text, text[], text, text, text, text[], text[], jsonb, text, timestamptz, integer
) IS
'enqueue_message for bulk mail: the message is sent with List-Unsubscribe and List-Unsubscribe-Post (RFC 8058), signed per recipient. Errors: those of enqueue_message.';

GRANT EXECUTE ON FUNCTION mailroom.enqueue_bulk_message(
    text, text[], text, text, text, text[], text[], jsonb, text, timestamptz, integer
) TO mailroom_app;
