-- Webhooks out (issue 44, item 8; docs/webhooks.md). A delivery is a row of outbound_messages of
-- kind 'webhook' (migration 0510): the one claim (sql/33, its Citus form sql/citus/20), finalize,
-- backoff (attempts² minutes), reaper, retention and queue verbs serve it. Its event type is the
-- row's subject, its JSON payload (at most webhooks.max_payload_bytes) its text_body, its
-- webhook-id ('msg_' + 32 hex digits, stable across attempts) its message_id. `mailroom send` signs
-- it (Standard Webhooks) with the endpoint's whsec_ secret, which only it can open.
--
-- Events are queued where they happen, in the same transaction: message.received by
-- deliver_message (sql/21) for an inbox of an API key's owner (one indexed look-up, only for inboxes
-- owned by a key's owner), inbox.expired by the expiry (trigger after_mailboxes_expired; on Citus
-- the expiry's seam, sql/citus/30_mailboxes.sql),
-- message.sent / message.failed by finalize_messages (sql/34) and message.bounced by record_bounce
-- (sql/36) for a sender's endpoints.
-- Errors: MR345 URL, MR346 event, MR347 too many endpoints, MR348 unknown endpoint, MR349 unknown
-- delivery, MR354 nothing to replay, MR355 unknown sender, MR356 unknown or revoked key id (MR313
-- without a sender key, sql/30).

CREATE OR REPLACE FUNCTION mailroom_internal._webhook_events(p_for text)
RETURNS text[]
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the events an endpoint may ask for: an API key's (its owner's inboxes), a sender's (its mail)
    SELECT CASE p_for
        WHEN 'key' THEN ARRAY['message.received', 'inbox.expired']
        WHEN 'sender' THEN ARRAY['message.sent', 'message.failed', 'message.bounced']
    END;
$$;

COMMENT ON FUNCTION mailroom_internal._webhook_events(text) IS
'Internal: the webhook events an endpoint of an API key (key) or of a sender (sender) may ask for.';

CREATE OR REPLACE FUNCTION mailroom_internal._add_webhook(
    p_key_id bigint, p_owner_id text, p_sender_id bigint, p_url text, p_events text[]
)
RETURNS TABLE (id bigint, secret text)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_for text := CASE WHEN p_key_id IS NOT NULL THEN 'key' ELSE 'sender' END;
    v_events text[];
    v_secret text;
    v_id bigint;
BEGIN
    IF p_url IS NULL OR length(p_url) > 2000 OR p_url !~* '^https?://[^/?#@\s]+([/?#]\S*)?$' THEN
        RAISE EXCEPTION USING ERRCODE = 'MR345', MESSAGE = 'a webhook URL must be an http or https URL of at most 2000 characters (no user info)';
    END IF;
    v_events := ARRAY(SELECT DISTINCT e FROM unnest(p_events) AS e ORDER BY e);
    IF cardinality(v_events) = 0 OR NOT (v_events <@ mailroom_internal._webhook_events(v_for)) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR346',
            MESSAGE = format('webhook events must be some of: %s', array_to_string(mailroom_internal._webhook_events(v_for), ', '));
    END IF;
    -- the bound, counted under the key's (or sender's) row lock so two registrations cannot pass it together
    IF p_key_id IS NOT NULL THEN
        PERFORM 1 FROM mailroom.api_keys AS k WHERE k.id = p_key_id FOR UPDATE;
    ELSE
        PERFORM 1 FROM mailroom.senders AS s WHERE s.id = p_sender_id FOR UPDATE;
    END IF;
    IF (
        SELECT count(*) FROM mailroom.webhook_endpoints AS w
        WHERE w.key_id = p_key_id OR w.sender_id = p_sender_id
    ) >= mailroom.setting('webhooks.max_endpoints_per_key')::integer THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR347',
            MESSAGE = format('at most %s webhook endpoints (webhooks.max_endpoints_per_key)', mailroom.setting('webhooks.max_endpoints_per_key'));
    END IF;
    -- Standard Webhooks: whsec_ + base64 of the key (24 random bytes); shown once, sealed at rest
    v_secret := 'whsec_' || encode(mailroom_internal._random_bytes(24), 'base64');
    INSERT INTO mailroom.webhook_endpoints AS w (key_id, owner_id, sender_id, url, events, secret_sealed, created_at)
    VALUES (p_key_id, p_owner_id, p_sender_id, p_url, v_events, mailroom_internal._seal_for_sender(v_secret), mailroom.clock())
    RETURNING w.id INTO v_id;
    RETURN QUERY SELECT v_id, v_secret;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._add_webhook(bigint, text, bigint, text, text[]) IS
'Internal: register an endpoint (checked URL and events, the bound per key or sender), its whsec_ secret made, sealed, '
'and returned once. Errors: MR345, MR346, MR347; MR313 without a sender key.';

-- The payload (Standard Webhooks' shape: type, timestamp, data), bounded by webhooks.max_payload_bytes:
-- the text fields a sender's mail or a stranger chose (subject, from) are cut to fit.
CREATE OR REPLACE FUNCTION mailroom_internal._enqueue_webhook(p_endpoint_id bigint, p_event text, p_data jsonb)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := mailroom.clock();
    v_max integer := mailroom.setting('webhooks.max_payload_bytes')::integer;
    v_data jsonb := p_data;
    v_payload text;
    v_id bigint;
BEGIN
    v_payload := jsonb_build_object(
        'type', p_event, 'timestamp', to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), 'data', v_data
    )::text;
    IF octet_length(v_payload) > v_max THEN
        v_data := v_data || jsonb_build_object('subject', left(v_data ->> 'subject', 200), 'from', left(v_data ->> 'from', 200), 'truncated', true);
        v_data := jsonb_strip_nulls(v_data);
        v_payload := jsonb_build_object(
            'type', p_event, 'timestamp', to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), 'data', v_data
        )::text;
    END IF;
    INSERT INTO mailroom.outbound_messages AS m (
        kind, webhook_endpoint_id, sender_id, subject, text_body, message_id, idempotency_scope, created_at, updated_at
    )
    VALUES (
        'webhook', p_endpoint_id, NULL, p_event, left(v_payload, v_max),
        'msg_' || replace(pg_catalog.gen_random_uuid()::text, '-', ''), 'mailroom', v_now, v_now
    )
    RETURNING m.id INTO v_id;
    PERFORM pg_notify('mailroom_outbound', v_id::text);
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._enqueue_webhook(bigint, text, jsonb) IS
'Internal: queue one webhook delivery (kind webhook) of p_event with data p_data to an endpoint, its payload bounded '
'by webhooks.max_payload_bytes; NOTIFY mailroom_outbound (id); returns the outbound id.';

CREATE OR REPLACE FUNCTION mailroom_internal._webhook_to_owner(p_owner_id text, p_event text, p_data jsonb)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_endpoint bigint;
    v_count integer := 0;
BEGIN
    -- who gets an owner's event, written once for every owner event: the live endpoints of that owner's
    -- keys that ask for it. The key's own owner is asked too, not only the copy on the endpoint: an
    -- endpoint reaches its key's owner's mail alone, whatever became of the copy (the review of
    -- 2026-12-06: erasure renamed the key's owner, not the copy, and a later owner of that id had its
    -- mail sent to the old endpoint)
    FOR v_endpoint IN
        SELECT w.id FROM mailroom.webhook_endpoints AS w
        INNER JOIN mailroom.api_keys AS k ON w.key_id = k.id
        WHERE w.owner_id = p_owner_id AND k.owner_id = p_owner_id AND p_event = ANY (w.events) AND k.revoked_at IS NULL
        ORDER BY w.id
    LOOP
        PERFORM mailroom_internal._enqueue_webhook(v_endpoint, p_event, p_data);
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._webhook_to_owner(text, text, jsonb) IS
'Internal: queue p_event with p_data for every live endpoint of an owner''s keys that asks for it (message.received, inbox.expired); how many.';

CREATE OR REPLACE FUNCTION mailroom_internal._webhook_to_sender(p_sender_id bigint, p_event text, p_data jsonb)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_endpoint bigint;
    v_count integer := 0;
BEGIN
    -- who gets a sender's event, written once for every sender event: that sender's endpoints asking for it
    FOR v_endpoint IN
        SELECT w.id FROM mailroom.webhook_endpoints AS w
        WHERE w.sender_id = p_sender_id AND p_event = ANY (w.events)
        ORDER BY w.id
    LOOP
        PERFORM mailroom_internal._enqueue_webhook(v_endpoint, p_event, p_data);
        v_count := v_count + 1;
    END LOOP;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._webhook_to_sender(bigint, text, jsonb) IS
'Internal: queue p_event with p_data for every endpoint of a sender that asks for it (message.sent, message.failed, message.bounced); how many.';

CREATE OR REPLACE FUNCTION mailroom_internal._webhook_message_received(
    p_owner_id text, p_address text, p_message_id bigint, p_received_at timestamptz, p_size bigint, p_parsed jsonb
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- deliver_message calls it only when the inbox's owner has an endpoint (its one look-up)
    RETURN mailroom_internal._webhook_to_owner(p_owner_id, 'message.received', jsonb_build_object(
        'address', p_address,
        'message_id', p_message_id,
        'received_at', p_received_at,
        'size_bytes', p_size,
        'from', left(p_parsed ->> 'from_header', 2000),
        'subject', left(p_parsed ->> 'subject', 2000)
    ));
END;
$$;

COMMENT ON FUNCTION mailroom_internal._webhook_message_received(text, text, bigint, timestamptz, bigint, jsonb) IS
'Internal (deliver_message): queue message.received for every live endpoint of the inbox owner''s keys that asks for it.';

CREATE OR REPLACE FUNCTION mailroom_internal._webhook_inbox_expired(
    p_owner_id text, p_address text, p_expires_at timestamptz, p_message_count integer
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- inbox.expired for an API key's inbox the expiry just closed: one indexed look-up by owner
    RETURN mailroom_internal._webhook_to_owner(p_owner_id, 'inbox.expired', jsonb_build_object(
        'address', p_address, 'expires_at', p_expires_at, 'message_count', p_message_count
    ));
END;
$$;

COMMENT ON FUNCTION mailroom_internal._webhook_inbox_expired(text, text, timestamptz, integer) IS
'Internal: queue inbox.expired for the live endpoints of an expired inbox''s owner that ask for it (the trigger '
'after_mailboxes_expired; on Citus the expiry''s seam, sql/citus/30_mailboxes.sql).';

CREATE OR REPLACE FUNCTION mailroom_internal.trg_mailboxes_expired()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- the trigger's WHEN: an API key's inbox stopped being active, not deleted
    PERFORM mailroom_internal._webhook_inbox_expired(NEW.owner_id, NEW.address, NEW.expires_at, NEW.message_count);
    RETURN NULL;
END;
$$;

COMMENT ON FUNCTION mailroom_internal.trg_mailboxes_expired() IS
'Internal (trigger after_mailboxes_expired): queue inbox.expired for the endpoints of the owner of an API key''s inbox that expired.';

-- only an UPDATE naming is_active fires it (delivery's UPDATE of message_count does not), and only
-- for the expiry of a key's inbox. On Citus it is dropped (sql/citus/10_distribute.sql).
CREATE OR REPLACE TRIGGER after_mailboxes_expired
AFTER UPDATE OF is_active ON mailroom.mailboxes
FOR EACH ROW
WHEN (
    old.is_active AND NOT new.is_active AND new.deleted_at IS null
    AND new.owner_id IS NOT null AND new.owner_type IN ('api', 'mcp')
)
EXECUTE FUNCTION mailroom_internal.trg_mailboxes_expired();

CREATE OR REPLACE FUNCTION mailroom_internal._webhook_outcomes(p_rows jsonb[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row jsonb;
    v_count integer := 0;
BEGIN
    -- finalize_messages (sql/34): one row per mail that ended (sent or failed), with what the
    -- event says; no recipient address goes in a payload
    FOREACH v_row IN ARRAY coalesce(p_rows, '{}') LOOP
        v_count := v_count + mailroom_internal._webhook_to_sender(
            (v_row ->> 'sender_id')::bigint,
            CASE v_row ->> 'status' WHEN 'sent' THEN 'message.sent' ELSE 'message.failed' END,
            jsonb_build_object(
                'outbound_id', (v_row ->> 'id')::bigint,
                'message_id', v_row ->> 'message_id',
                'status', v_row ->> 'status',
                'attempts', (v_row ->> 'attempts')::integer,
                'smtp_code', (v_row ->> 'smtp_code')::integer,
                'enhanced_code', v_row ->> 'enhanced_code',
                'sent_at', v_row -> 'sent_at'
            )
        );
    END LOOP;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._webhook_outcomes(jsonb[]) IS
'Internal (finalize_messages): queue message.sent or message.failed for the endpoints of each ended mail''s sender.';

CREATE OR REPLACE FUNCTION mailroom_internal._webhook_bounced(
    p_message_id bigint, p_kind text, p_smtp_code integer, p_status text
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- record_bounce (sql/36): a bounce report for a message of a sender with an endpoint asking for it
    RETURN coalesce((
        SELECT mailroom_internal._webhook_to_sender(m.sender_id, 'message.bounced', jsonb_build_object(
            'outbound_id', p_message_id, 'bounce', p_kind, 'smtp_code', p_smtp_code, 'status', p_status
        ))
        FROM mailroom.outbound_messages AS m
        WHERE m.id = p_message_id AND m.sender_id IS NOT null
    ), 0);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._webhook_bounced(bigint, text, integer, text) IS
'Internal (record_bounce): queue message.bounced for the endpoints of the bounced message''s sender.';

-- ---------------------------------------------------------------------------------------------
-- The operator's functions (mailroom webhook …)

CREATE OR REPLACE FUNCTION mailroom.add_webhook(
    p_url text,
    p_events text[],
    p_key_id bigint DEFAULT null,
    p_sender text DEFAULT null
)
RETURNS TABLE (id bigint, secret text)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_owner text;
    v_sender bigint;
BEGIN
    IF (p_key_id IS NULL) = (p_sender IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'MR348', MESSAGE = 'a webhook endpoint belongs to an API key or to a sender: name one';
    END IF;
    IF p_key_id IS NOT NULL THEN
        SELECT k.owner_id INTO v_owner FROM mailroom.api_keys AS k WHERE k.id = p_key_id AND k.revoked_at IS NULL;
        IF v_owner IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'MR356', MESSAGE = 'unknown or revoked API key id';
        END IF;
    ELSE
        SELECT s.id INTO v_sender FROM mailroom.senders AS s WHERE s.name = p_sender;
        IF v_sender IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'MR355', MESSAGE = 'unknown sender';
        END IF;
    END IF;
    RETURN QUERY SELECT a.id, a.secret FROM mailroom_internal._add_webhook(p_key_id, v_owner, v_sender, p_url, p_events) AS a;
END;
$$;

COMMENT ON FUNCTION mailroom.add_webhook(text, text[], bigint, text) IS
'Register a webhook endpoint for an API key (events message.received, inbox.expired) or a sender (message.sent, '
'message.failed, message.bounced); returns its id and its whsec_ secret, shown once (stored sealed for the sender key). '
'Errors: MR345 URL, MR346 events, MR347 too many, MR348 neither or both owners, MR356 key, MR355 sender, MR313 no sender key.';

GRANT EXECUTE ON FUNCTION mailroom.add_webhook(text, text[], bigint, text) TO mailroom_admin;

-- What an endpoint row shows: never its secret.
CREATE OR REPLACE FUNCTION mailroom_internal._webhook_json(p_endpoint mailroom.webhook_endpoints)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN jsonb_build_object(
        'id', p_endpoint.id,
        'url', p_endpoint.url,
        'events', to_jsonb(p_endpoint.events),
        'created_at', p_endpoint.created_at,
        'queued', (
            SELECT count(*) FROM mailroom.outbound_messages AS m
            WHERE m.kind = 'webhook' AND m.webhook_endpoint_id = p_endpoint.id AND m.status IN ('queued', 'processing')
        )
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._webhook_json(mailroom.webhook_endpoints) IS
'Internal: an endpoint as the API answers it (id, url, events, created_at, deliveries queued); never its secret.';

CREATE OR REPLACE FUNCTION mailroom.list_webhooks(p_key_id bigint DEFAULT null)
RETURNS TABLE (id bigint, key_id bigint, owner_id text, sender text, url text, events text[], queued bigint, created_at timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT
        w.id, w.key_id, w.owner_id, s.name, w.url, w.events,
        (mailroom_internal._webhook_json(w) ->> 'queued')::bigint,
        w.created_at
    FROM mailroom.webhook_endpoints AS w
    LEFT JOIN mailroom.senders AS s ON w.sender_id = s.id
    WHERE p_key_id IS NULL OR w.key_id = p_key_id
    ORDER BY w.id;
END;
$$;

COMMENT ON FUNCTION mailroom.list_webhooks(bigint) IS
'The webhook endpoints (of one API key, or all): id, key, owner, sender, URL, events, deliveries queued; never a secret.';

GRANT EXECUTE ON FUNCTION mailroom.list_webhooks(bigint) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.remove_webhook(p_id bigint)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM mailroom.webhook_endpoints AS w WHERE w.id = p_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MR348', MESSAGE = 'unknown webhook endpoint';
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom.remove_webhook(bigint) IS
'Remove a webhook endpoint and its secret; its queued deliveries fail at their next claim. Errors: MR348 unknown endpoint.';

GRANT EXECUTE ON FUNCTION mailroom.remove_webhook(bigint) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom_internal._webhook_deliveries(p_endpoint_id bigint, p_limit integer)
RETURNS TABLE (
    id bigint, event text, webhook_id text, status text, attempts integer, possibly_sent boolean,
    last_status integer, next_retry_at timestamptz, created_at timestamptz, sent_at timestamptz, attempt_log text
)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- newest first; the attempt log is error_log (redacted by its trigger, sql/31)
    RETURN QUERY
    SELECT
        m.id, m.subject, m.message_id, m.status::text, m.attempts, m.possibly_sent, m.last_smtp_code,
        m.next_retry_at, m.created_at, m.sent_at, m.error_log
    FROM mailroom.outbound_messages AS m
    WHERE m.kind = 'webhook' AND m.webhook_endpoint_id = p_endpoint_id
    ORDER BY m.id DESC
    LIMIT least(greatest(coalesce(p_limit, 50), 1), 1000);
END;
$$;

COMMENT ON FUNCTION mailroom_internal._webhook_deliveries(bigint, integer) IS
'Internal: an endpoint''s deliveries, newest first, with their attempts (status, HTTP status, the attempt log).';

CREATE OR REPLACE FUNCTION mailroom.webhook_deliveries(p_endpoint_id bigint, p_limit integer DEFAULT null)
RETURNS TABLE (
    id bigint, event text, webhook_id text, status text, attempts integer, possibly_sent boolean,
    last_status integer, next_retry_at timestamptz, created_at timestamptz, sent_at timestamptz, attempt_log text
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mailroom.webhook_endpoints AS w WHERE w.id = p_endpoint_id) THEN
        RAISE EXCEPTION USING ERRCODE = 'MR348', MESSAGE = 'unknown webhook endpoint';
    END IF;
    RETURN QUERY SELECT * FROM mailroom_internal._webhook_deliveries(p_endpoint_id, p_limit);
END;
$$;

COMMENT ON FUNCTION mailroom.webhook_deliveries(bigint, integer) IS
'An endpoint''s deliveries (newest first, at most p_limit, default 50): event, webhook-id, status, attempts, whether '
'possibly delivered twice, last HTTP status, next try, the attempt log. Errors: MR348 unknown endpoint.';

GRANT EXECUTE ON FUNCTION mailroom.webhook_deliveries(bigint, integer) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom_internal._replay_webhook(p_delivery_id bigint, p_key_id bigint)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_status mailroom.outbound_status;
    v_id bigint;
BEGIN
    -- a delivery of an endpoint (of the key, when p_key_id is given) queued again, due now, with a
    -- fresh attempt budget and the same webhook-id (a replay is the same message, sent again)
    SELECT m.status INTO v_status
    FROM mailroom.outbound_messages AS m
    INNER JOIN mailroom.webhook_endpoints AS w ON m.webhook_endpoint_id = w.id
    WHERE m.id = p_delivery_id AND m.kind = 'webhook' AND (p_key_id IS NULL OR w.key_id = p_key_id)
    FOR UPDATE OF m;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MR349', MESSAGE = 'unknown webhook delivery';
    END IF;
    IF v_status NOT IN ('sent', 'failed', 'cancelled') THEN
        RAISE EXCEPTION USING ERRCODE = 'MR354', MESSAGE = format('the webhook delivery is %s: nothing to replay', v_status);
    END IF;
    UPDATE mailroom.outbound_messages AS m
    SET
        status = 'queued', attempts = 0, next_retry_at = NULL, sent_at = NULL,
        error_log = concat_ws(E'\n', m.error_log, to_char(mailroom.clock() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') || ' replayed'),
        updated_at = mailroom.clock()
    WHERE m.id = p_delivery_id
    RETURNING m.id INTO v_id;
    PERFORM pg_notify('mailroom_outbound', v_id::text);
    RETURN v_id;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._replay_webhook(bigint, bigint) IS
'Internal: queue a sent, failed or cancelled webhook delivery again (same webhook-id, due now, attempts from 0). Errors: MR349, MR354.';

CREATE OR REPLACE FUNCTION mailroom.replay_webhook(p_delivery_id bigint)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom_internal._replay_webhook(p_delivery_id, NULL);
END;
$$;

COMMENT ON FUNCTION mailroom.replay_webhook(bigint) IS
'Queue a webhook delivery again (same webhook-id, due now, attempts from 0); returns its id. Errors: MR349 unknown '
'delivery, MR354 still queued or being delivered.';

GRANT EXECUTE ON FUNCTION mailroom.replay_webhook(bigint) TO mailroom_admin;

-- ---------------------------------------------------------------------------------------------
-- The HTTP face (/api/v1/webhooks, an API key's own endpoints; the answers are JSON documents)

CREATE OR REPLACE FUNCTION mailroom_internal._webhook_key(p_key_digest bytea)
RETURNS mailroom.api_keys
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key mailroom.api_keys;
BEGIN
    -- MR240 without a key, MR241 for an unknown or revoked one (sql/29_http.sql, sql/28_api_keys.sql)
    PERFORM mailroom_internal._http_owner(NULL, p_key_digest);
    SELECT * INTO v_key FROM mailroom.api_keys AS k WHERE k.digest = p_key_digest AND k.revoked_at IS NULL;
    RETURN v_key;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._webhook_key(bytea) IS
'Internal: the live API key of a request (MR240 none, MR241 unknown or revoked).';

CREATE OR REPLACE FUNCTION mailroom.http_add_webhook(p_key_digest bytea, p_url text, p_events text[])
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key mailroom.api_keys := mailroom_internal._webhook_key(p_key_digest);
    v_added record;
BEGIN
    SELECT a.id, a.secret INTO v_added
    FROM mailroom_internal._add_webhook(v_key.id, v_key.owner_id, NULL, p_url, p_events) AS a;
    RETURN (
        SELECT mailroom_internal._webhook_json(w) || jsonb_build_object('secret', v_added.secret)
        FROM mailroom.webhook_endpoints AS w WHERE w.id = v_added.id
    );
END;
$$;

COMMENT ON FUNCTION mailroom.http_add_webhook(bytea, text, text[]) IS
'POST /api/v1/webhooks: register an endpoint of the API key (message.received, inbox.expired of its owner''s inboxes); '
'the answer holds its whsec_ secret, shown once. Errors: MR240, MR241, MR345, MR346, MR347, MR313.';

GRANT EXECUTE ON FUNCTION mailroom.http_add_webhook(bytea, text, text[]) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_list_webhooks(p_key_digest bytea)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key mailroom.api_keys := mailroom_internal._webhook_key(p_key_digest);
BEGIN
    RETURN coalesce((
        SELECT jsonb_agg(mailroom_internal._webhook_json(w) ORDER BY w.id)
        FROM mailroom.webhook_endpoints AS w WHERE w.key_id = v_key.id
    ), '[]'::jsonb);
END;
$$;

COMMENT ON FUNCTION mailroom.http_list_webhooks(bytea) IS
'GET /api/v1/webhooks: the API key''s endpoints (never their secrets). Errors: MR240, MR241.';

GRANT EXECUTE ON FUNCTION mailroom.http_list_webhooks(bytea) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_remove_webhook(p_key_digest bytea, p_id bigint)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key mailroom.api_keys := mailroom_internal._webhook_key(p_key_digest);
BEGIN
    DELETE FROM mailroom.webhook_endpoints AS w WHERE w.id = p_id AND w.key_id = v_key.id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MR348', MESSAGE = 'unknown webhook endpoint';
    END IF;
    RETURN jsonb_build_object('id', p_id, 'removed', true);
END;
$$;

COMMENT ON FUNCTION mailroom.http_remove_webhook(bytea, bigint) IS
'DELETE /api/v1/webhooks/{id}: remove one of the API key''s endpoints. Errors: MR240, MR241, MR348 not the key''s.';

GRANT EXECUTE ON FUNCTION mailroom.http_remove_webhook(bytea, bigint) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_webhook_deliveries(p_key_digest bytea, p_id bigint, p_limit integer DEFAULT null)
RETURNS jsonb
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key mailroom.api_keys := mailroom_internal._webhook_key(p_key_digest);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM mailroom.webhook_endpoints AS w WHERE w.id = p_id AND w.key_id = v_key.id) THEN
        RAISE EXCEPTION USING ERRCODE = 'MR348', MESSAGE = 'unknown webhook endpoint';
    END IF;
    RETURN coalesce((
        SELECT jsonb_agg(to_jsonb(d) ORDER BY d.id DESC)
        FROM mailroom_internal._webhook_deliveries(p_id, p_limit) AS d
    ), '[]'::jsonb);
END;
$$;

COMMENT ON FUNCTION mailroom.http_webhook_deliveries(bytea, bigint, integer) IS
'GET /api/v1/webhooks/{id}/deliveries: the endpoint''s deliveries with their attempts, newest first. Errors: MR240, MR241, MR348.';

GRANT EXECUTE ON FUNCTION mailroom.http_webhook_deliveries(bytea, bigint, integer) TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.http_replay_webhook(p_key_digest bytea, p_delivery_id bigint)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key mailroom.api_keys := mailroom_internal._webhook_key(p_key_digest);
BEGIN
    RETURN jsonb_build_object('id', mailroom_internal._replay_webhook(p_delivery_id, v_key.id), 'status', 'queued');
END;
$$;

COMMENT ON FUNCTION mailroom.http_replay_webhook(bytea, bigint) IS
'POST /api/v1/webhooks/deliveries/{id}/replay: queue one of the key''s deliveries again (same webhook-id). Errors: MR240, MR241, MR349, MR354.';

GRANT EXECUTE ON FUNCTION mailroom.http_replay_webhook(bytea, bigint) TO mailroom_http;
