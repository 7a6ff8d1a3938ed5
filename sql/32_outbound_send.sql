-- Send over HTTP (issue 44, item 9; docs/http.md "Send", docs/security.md): POST /api/v1/send takes
-- Mailpit's request shape ({"From": {"Email", "Name"}, "To": [{"Email", "Name"}], "Cc": […], "Bcc":
-- ["address"], "ReplyTo": […], "Subject", "Text", "HTML", "Headers": {name: value}, "Attachments":
-- [{"Content", "Filename", "ContentType"}]} and mailroom's "Sender", a sender's name) as ONE jsonb
-- document, read here by name, and queues it through _enqueue_message (sql/32_outbound_enqueue.sql):
-- validated, suppressed, DKIM-signed, retried and finalized like any other message; the sender
-- builds the MIME (driver/mailroom/outbound/message.py). What a key may do is decided here:
--   * the key authorizes (MR240 none, MR241 unknown or revoked: _http_owner, sql/29_http.sql);
--   * it sends only through a sender granted to it (mailroom.api_key_senders; grant_api_key_sender,
--     `mailroom apikey grant-sender KEY_ID SENDER`): none, or not that one, MR374 (403); the sender
--     is "Sender", else the granted sender whose From address is From.Email, else the key's only one;
--   * every recipient must match send.allowed_recipients (empty, the default: none; MR021) and there
--     are at most send.max_recipients of them (MR377);
--   * one from the key's send.rate_per_key (MR020, 429 with Retry-After: sql/09_rates.sql, as release);
--   * a line break or control character in any header value (Subject, a Name, a Headers value): MR376;
--     a field it does not know, or of the wrong type: MR375 (never echoing a value);
--   * one line of mailroom.audit_log (action send: the key id, the outbound id, how many recipients).
-- The Idempotency-Key header is enqueue's idempotency key, per API key (scope app, key
-- 'send:<key id>:<its value>'): the same key answers the message it queued first, with no second
-- rate count or audit line. The names of addresses are checked, not written: the From line is the
-- sender's from_address, To and Cc are addresses (the outbound row holds no names).
-- Errors: MR374 no grant, MR375 shape, MR376 header injection, MR377 too many recipients, MR378 no
-- such key (the admin's grant), MR020 rate, MR021 recipient not allowed, MR240/MR241 credentials, and
-- those of _enqueue_message (MR301-MR309, MR318, MR385).

CREATE OR REPLACE FUNCTION mailroom_internal._send_header_value(p_field text, p_value jsonb, p_max integer)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- a string field of a send request that ends up in (or beside) a header: a string (MR375) of at
    -- most p_max characters, without a line break or control character but TAB (MR376)
    IF p_value IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) <> 'string' THEN
        RAISE EXCEPTION USING ERRCODE = 'MR375', MESSAGE = format('%s must be a string', p_field);
    END IF;
    IF (p_value #>> '{}') ~ mailroom_internal._header_breaking_chars() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR376',
            MESSAGE = format('%s holds a line break or a control character (TAB allowed): header injection refused',
                p_field);
    END IF;
    IF length(p_value #>> '{}') > p_max THEN
        RAISE EXCEPTION USING ERRCODE = 'MR375', MESSAGE = format('%s must be at most %s characters', p_field, p_max);
    END IF;
    RETURN p_value #>> '{}';
END;
$$;

COMMENT ON FUNCTION mailroom_internal._send_header_value(text, jsonb, integer) IS
'Internal: a header-bound string of a send request: MR375 not a string or over p_max characters, MR376 a line break or control character (TAB allowed).';

CREATE OR REPLACE FUNCTION mailroom_internal._send_addresses(p_doc jsonb, p_field text)
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_result text [] := '{}';
    v_item jsonb;
    v_n integer := 0;
    v_key text;
BEGIN
    -- To, Cc, Bcc, ReplyTo: a JSON array of {"Email", "Name"} objects or of address strings (Mailpit's
    -- Bcc); the addresses trimmed, in order. A Name is checked (_send_header_value), not kept.
    IF p_doc -> p_field IS NULL THEN
        RETURN v_result;
    END IF;
    IF jsonb_typeof(p_doc -> p_field) <> 'array' THEN
        RAISE EXCEPTION USING ERRCODE = 'MR375', MESSAGE = format('%s must be a JSON array', p_field);
    END IF;
    FOR v_item IN SELECT e.value FROM jsonb_array_elements(p_doc -> p_field) AS e LOOP
        v_n := v_n + 1;
        IF jsonb_typeof(v_item) = 'object' THEN
            SELECT k INTO v_key FROM jsonb_object_keys(v_item) AS k WHERE k NOT IN ('Email', 'Name') LIMIT 1;
            IF v_key IS NOT NULL OR jsonb_typeof(v_item -> 'Email') IS DISTINCT FROM 'string' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'MR375',
                    MESSAGE = format('%s[%s] must be {"Email": string, "Name": string} or an address', p_field, v_n);
            END IF;
            PERFORM mailroom_internal._send_header_value(format('%s[%s].Name', p_field, v_n), v_item -> 'Name', 200);
            v_result := v_result || btrim(v_item ->> 'Email');
        ELSIF jsonb_typeof(v_item) = 'string' THEN
            v_result := v_result || btrim(v_item #>> '{}');
        ELSE
            RAISE EXCEPTION USING
                ERRCODE = 'MR375',
                MESSAGE = format('%s[%s] must be {"Email": string, "Name": string} or an address', p_field, v_n);
        END IF;
    END LOOP;
    RETURN v_result;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._send_addresses(jsonb, text) IS
'Internal: the addresses of a send request''s field (To, Cc, Bcc, ReplyTo): an array of {"Email", "Name"} or of strings; MR375 another shape, MR376 a Name with a line break.';

CREATE OR REPLACE FUNCTION mailroom_internal._send_attachments(p_doc jsonb)
RETURNS jsonb
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_result jsonb := '[]';
    v_item jsonb;
    v_n integer := 0;
    v_key text;
BEGIN
    -- Mailpit's [{"Content": base64 (a data: URL's prefix dropped), "Filename", "ContentType"}] as
    -- enqueue's [{"name", "content_type", "content_base64"}] (checked there: MR385); no ContentType is
    -- application/octet-stream; an inline part (ContentID) is not supported (MR375)
    IF p_doc -> 'Attachments' IS NULL THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_doc -> 'Attachments') <> 'array' THEN
        RAISE EXCEPTION USING ERRCODE = 'MR375', MESSAGE = 'Attachments must be a JSON array';
    END IF;
    FOR v_item IN SELECT e.value FROM jsonb_array_elements(p_doc -> 'Attachments') AS e LOOP
        v_n := v_n + 1;
        IF jsonb_typeof(v_item) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = 'MR375', MESSAGE = format('Attachments[%s] must be an object', v_n);
        END IF;
        SELECT k INTO v_key FROM jsonb_object_keys(v_item) AS k
        WHERE k NOT IN ('Content', 'Filename', 'ContentType', 'ContentID') LIMIT 1;
        IF v_key IS NOT NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR375',
                MESSAGE = format('Attachments[%s]: %s is not a field (Content, Filename, ContentType)', v_n,
                    quote_literal(left(v_key, 40)));
        END IF;
        IF coalesce(v_item ->> 'ContentID', '') <> '' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR375',
                MESSAGE = format('Attachments[%s]: inline parts (ContentID) are not supported', v_n);
        END IF;
        IF jsonb_typeof(v_item -> 'Content') IS DISTINCT FROM 'string'
            OR jsonb_typeof(v_item -> 'Filename') IS DISTINCT FROM 'string'
            OR coalesce(jsonb_typeof(v_item -> 'ContentType'), 'string') <> 'string' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR375',
                MESSAGE = format('Attachments[%s] needs Content (base64) and Filename, strings', v_n);
        END IF;
        v_result := v_result || jsonb_build_object(
            'name', v_item ->> 'Filename',
            'content_type', coalesce(nullif(btrim(v_item ->> 'ContentType'), ''), 'application/octet-stream'),
            'content_base64', regexp_replace(v_item ->> 'Content', '^data:[^,]{0,200};base64,', '')
        );
    END LOOP;
    RETURN v_result;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._send_attachments(jsonb) IS
'Internal: a send request''s Attachments (Mailpit''s Content, Filename, ContentType) as enqueue''s [{"name", "content_type", "content_base64"}]; MR375 another shape or an inline part.';

CREATE OR REPLACE FUNCTION mailroom_internal._send_sender(p_key_id bigint, p_doc jsonb)
RETURNS mailroom.senders
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_name text;
    v_from text;
    v_sender mailroom.senders;
    v_grants integer;
BEGIN
    -- which granted sender a request sends through: "Sender" (by name), else the one whose From
    -- address is From.Email (the first by name when several are), else the key's only one. A sender
    -- that exists but is not granted and one that does not exist are the same MR374: a key learns
    -- nothing of senders it may not use.
    SELECT count(*) INTO v_grants FROM mailroom.api_key_senders AS g WHERE g.key_id = p_key_id;
    IF v_grants = 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR374',
            MESSAGE = 'this API key may send through no sender (an operator grants one: mailroom apikey grant-sender)';
    END IF;
    IF p_doc ? 'Sender' AND jsonb_typeof(p_doc -> 'Sender') <> 'string' THEN
        RAISE EXCEPTION USING ERRCODE = 'MR375', MESSAGE = 'Sender must be a string (a sender''s name)';
    END IF;
    v_name := p_doc ->> 'Sender';
    IF jsonb_typeof(p_doc -> 'From') = 'object' THEN
        IF EXISTS (SELECT 1 FROM jsonb_object_keys(p_doc -> 'From') AS k WHERE k NOT IN ('Email', 'Name'))
            OR jsonb_typeof(p_doc -> 'From' -> 'Email') IS DISTINCT FROM 'string' THEN
            RAISE EXCEPTION USING ERRCODE = 'MR375', MESSAGE = 'From must be {"Email": string, "Name": string}';
        END IF;
        PERFORM mailroom_internal._send_header_value('From.Name', p_doc -> 'From' -> 'Name', 200);
        v_from := lower(btrim(p_doc -> 'From' ->> 'Email'));
    ELSIF jsonb_typeof(p_doc -> 'From') = 'string' THEN
        v_from := lower(btrim(p_doc ->> 'From'));
    ELSIF p_doc ? 'From' THEN
        RAISE EXCEPTION USING ERRCODE = 'MR375', MESSAGE = 'From must be {"Email": string, "Name": string}';
    END IF;

    SELECT s.* INTO v_sender
    FROM mailroom.api_key_senders AS g
    INNER JOIN mailroom.senders AS s ON g.sender_id = s.id
    WHERE g.key_id = p_key_id
        AND (v_name IS NULL OR s.name = v_name)
        AND (v_name IS NOT NULL OR v_from IS NULL OR lower(s.from_address) = v_from)
        AND (v_name IS NOT NULL OR v_from IS NOT NULL OR v_grants = 1)
    ORDER BY s.name
    LIMIT 1;
    IF v_sender.id IS NULL AND v_name IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR374',
            MESSAGE = format('this API key may not send through sender %s (no grant)', quote_literal(left(v_name, 63)));
    ELSIF v_sender.id IS NULL AND v_from IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR374',
            MESSAGE = 'this API key may not send From that address: no sender granted to it has it';
    ELSIF v_sender.id IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR375',
            MESSAGE = 'this API key may send through several senders: name one (Sender) or its address (From)';
    END IF;
    IF v_name IS NOT NULL AND v_from IS NOT NULL AND lower(v_sender.from_address) <> v_from THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR375',
            MESSAGE = format('From must be the address of sender %s (or be left out)', quote_literal(v_sender.name));
    END IF;
    RETURN v_sender;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._send_sender(bigint, jsonb) IS
'Internal: the sender a send request goes through: Sender, else the granted sender of From.Email, else the key''s only one; MR374 none granted (the same for an unknown one), MR375 ambiguous or a From that is not the named sender''s.';

CREATE OR REPLACE FUNCTION mailroom.http_send_message(
    p_key_digest bytea,
    p_message jsonb,
    p_idempotency_key text DEFAULT null
)
RETURNS jsonb
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_owner text := mailroom_internal._http_owner(null, p_key_digest);
    v_key_id bigint;
    v_doc jsonb := jsonb_strip_nulls(p_message);
    v_field text;
    v_sender mailroom.senders;
    v_to text [];
    v_cc text [];
    v_bcc text [];
    v_reply text [];
    v_all text [];
    v_address text;
    v_headers jsonb;
    v_header text;
    v_value jsonb;
    v_subject text;
    v_key text;
    v_id bigint;
BEGIN
    SELECT k.id INTO v_key_id FROM mailroom.api_keys AS k WHERE k.digest = p_key_digest AND k.revoked_at IS NULL;
    IF v_doc IS NULL OR jsonb_typeof(v_doc) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'MR375', MESSAGE = 'the body must be a JSON object';
    END IF;
    -- the grant first: a key without one learns nothing more
    v_sender := mailroom_internal._send_sender(v_key_id, v_doc);
    SELECT k INTO v_field FROM jsonb_object_keys(v_doc) AS k
    WHERE k NOT IN ('From', 'Sender', 'To', 'Cc', 'Bcc', 'ReplyTo', 'Subject', 'Text', 'HTML', 'Headers', 'Attachments')
    LIMIT 1;
    IF v_field IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR375',
            MESSAGE = format('%s is not a field of a send request (From, Sender, To, Cc, Bcc, ReplyTo, Subject, Text, '
                || 'HTML, Headers, Attachments)', quote_literal(left(v_field, 40)));
    END IF;
    IF p_idempotency_key IS NOT NULL AND p_idempotency_key !~ '^[!-~]{1,100}$' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR375',
            MESSAGE = 'Idempotency-Key must be 1-100 printable ASCII characters, no space';
    END IF;

    -- the header values (MR376 for a line break, whatever the field)
    v_subject := coalesce(mailroom_internal._send_header_value('Subject', v_doc -> 'Subject', 998), '');
    v_headers := coalesce(v_doc -> 'Headers', '{}');
    IF jsonb_typeof(v_headers) <> 'object' THEN
        RAISE EXCEPTION USING ERRCODE = 'MR375', MESSAGE = 'Headers must be a JSON object of name to string value';
    END IF;
    FOR v_header, v_value IN SELECT h.key, h.value FROM jsonb_each(v_headers) AS h LOOP
        PERFORM mailroom_internal._send_header_value(format('Headers[%s]', quote_literal(left(v_header, 40))),
            v_value, 998);
    END LOOP;
    FOREACH v_field IN ARRAY ARRAY['Text', 'HTML'] LOOP
        IF v_doc ? v_field AND jsonb_typeof(v_doc -> v_field) <> 'string' THEN
            RAISE EXCEPTION USING ERRCODE = 'MR375', MESSAGE = format('%s must be a string', v_field);
        END IF;
    END LOOP;

    -- the recipients: how many, then each allowed (a malformed one is _enqueue_message's MR303)
    v_to := mailroom_internal._send_addresses(v_doc, 'To');
    v_cc := mailroom_internal._send_addresses(v_doc, 'Cc');
    v_bcc := mailroom_internal._send_addresses(v_doc, 'Bcc');
    v_all := v_to || v_cc || v_bcc;
    IF cardinality(v_all) > mailroom.setting('send.max_recipients')::integer THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR377',
            MESSAGE = format('too many recipients: %s (send.max_recipients is %s)', cardinality(v_all),
                mailroom.setting('send.max_recipients'));
    END IF;
    FOREACH v_address IN ARRAY v_all LOOP
        IF mailroom_internal._is_valid_address(v_address) THEN
            PERFORM mailroom_internal._require_recipient_allowed('send.allowed_recipients', v_address);
        END IF;
    END LOOP;
    -- ReplyTo: a Reply-To header of its addresses (not recipients: no allow-list)
    v_reply := mailroom_internal._send_addresses(v_doc, 'ReplyTo');
    IF cardinality(v_reply) > 0 THEN
        IF EXISTS (SELECT 1 FROM jsonb_object_keys(v_headers) AS k WHERE lower(k) = 'reply-to') THEN
            RAISE EXCEPTION USING ERRCODE = 'MR375', MESSAGE = 'ReplyTo and a Reply-To header together';
        END IF;
        FOR v_n IN 1 .. cardinality(v_reply) LOOP
            IF NOT mailroom_internal._is_valid_address(v_reply[v_n]) THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'MR375',
                    MESSAGE = format('ReplyTo[%s] is not a valid email address', v_n);
            END IF;
        END LOOP;
        v_headers := v_headers || jsonb_build_object('Reply-To', array_to_string(v_reply, ', '));
    END IF;

    -- the same Idempotency-Key of this key: the message it queued, no second count
    IF p_idempotency_key IS NOT NULL THEN
        v_key := 'send:' || v_key_id || ':' || p_idempotency_key;
        SELECT m.id INTO v_id
        FROM mailroom.outbound_idempotency_keys AS k
        INNER JOIN mailroom.outbound_messages AS m ON k.message_id = m.id
        WHERE k.scope = 'app' AND k.key = v_key;
    END IF;
    IF v_id IS NULL THEN
        PERFORM mailroom_internal._take_rate('send.key', 'k' || v_key_id, 'send.rate_per_key');
        v_id := mailroom_internal._enqueue_message(
            'app', v_sender.name, v_to, v_subject, v_doc ->> 'Text', v_doc ->> 'HTML', v_cc, v_bcc, v_headers,
            v_key, p_attachments => mailroom_internal._send_attachments(v_doc)
        );
        PERFORM mailroom_internal._audit('send', v_key_id, 'api', v_owner, null, null, v_id, cardinality(v_all));
    END IF;
    RETURN (
        SELECT jsonb_build_object(
            'ID', m.id::text, 'outbound_id', m.id, 'message_id', m.message_id, 'sender', s.name
        )
        FROM mailroom.outbound_messages AS m
        INNER JOIN mailroom.senders AS s ON m.sender_id = s.id
        WHERE m.id = v_id
    );
END;
$$;

COMMENT ON FUNCTION mailroom.http_send_message(bytea, jsonb, text) IS
'POST /api/v1/send: queue a message (Mailpit''s request shape, one jsonb document) through a sender granted to the API key, to send.allowed_recipients, within send.rate_per_key and send.max_recipients, one audit line; p_idempotency_key per key; {"ID", "outbound_id", "message_id", "sender"}. Errors: MR374 (403), MR375, MR376, MR377 (400), MR020 (429), MR021 (403), MR240, MR241 (401), MR301-MR309, MR318, MR385.';

GRANT EXECUTE ON FUNCTION mailroom.http_send_message(bytea, jsonb, text) TO mailroom_http;

-- the operator's grants (`mailroom apikey grant-sender`, `revoke-sender`, `senders`)

CREATE OR REPLACE FUNCTION mailroom_internal._send_grant_ids(
    p_key_id bigint,
    p_sender text,
    p_live boolean,
    OUT key_id bigint,
    OUT sender_id bigint
)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    SELECT k.id INTO key_id FROM mailroom.api_keys AS k
    WHERE k.id = p_key_id AND (NOT p_live OR k.revoked_at IS NULL);
    IF key_id IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR378',
            MESSAGE = format('no %sAPI key %s', CASE WHEN p_live THEN 'live ' ELSE '' END, coalesce(p_key_id::text, 'NULL'));
    END IF;
    SELECT s.id INTO sender_id FROM mailroom.senders AS s WHERE s.name = p_sender;
    IF sender_id IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR301',
            MESSAGE = format('unknown sender %s', coalesce(quote_literal(left(p_sender, 63)), 'NULL'));
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._send_grant_ids(bigint, text, boolean) IS
'Internal: the ids of an API key (p_live: not revoked) and a sender by name; MR378 no such key, MR301 unknown sender.';

CREATE OR REPLACE FUNCTION mailroom.grant_api_key_sender(p_key_id bigint, p_sender text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids record := mailroom_internal._send_grant_ids(p_key_id, p_sender, true);
BEGIN
    INSERT INTO mailroom.api_key_senders (key_id, sender_id, granted_at)
    VALUES (v_ids.key_id, v_ids.sender_id, mailroom.clock())
    ON CONFLICT (key_id, sender_id) DO NOTHING;
    RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION mailroom.grant_api_key_sender(bigint, text) IS
'Let an API key send over HTTP (POST /api/v1/send) through a sender; false if it could already. Errors: MR378 no live key, MR301 unknown sender.';

GRANT EXECUTE ON FUNCTION mailroom.grant_api_key_sender(bigint, text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.revoke_api_key_sender(p_key_id bigint, p_sender text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids record := mailroom_internal._send_grant_ids(p_key_id, p_sender, false);
BEGIN
    DELETE FROM mailroom.api_key_senders AS g WHERE g.key_id = v_ids.key_id AND g.sender_id = v_ids.sender_id;
    RETURN FOUND;
END;
$$;

COMMENT ON FUNCTION mailroom.revoke_api_key_sender(bigint, text) IS
'Take back an API key''s grant of a sender at once (its next send through it is MR374); false if it had none. Errors: MR378 no such key, MR301 unknown sender.';

GRANT EXECUTE ON FUNCTION mailroom.revoke_api_key_sender(bigint, text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.list_api_key_senders(p_key_id bigint DEFAULT null)
RETURNS TABLE (key_id bigint, owner_id text, sender text, from_address text, granted_at timestamptz)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT g.key_id, k.owner_id, s.name, s.from_address, g.granted_at
    FROM mailroom.api_key_senders AS g
    INNER JOIN mailroom.api_keys AS k ON g.key_id = k.id
    INNER JOIN mailroom.senders AS s ON g.sender_id = s.id
    WHERE p_key_id IS NULL OR g.key_id = p_key_id
    ORDER BY g.key_id, s.name;
END;
$$;

COMMENT ON FUNCTION mailroom.list_api_key_senders(bigint) IS
'The senders each API key (or one) may send through over HTTP: key id, its owner, the sender''s name and From address, when granted.';

GRANT EXECUTE ON FUNCTION mailroom.list_api_key_senders(bigint) TO mailroom_admin;
