-- Waiting for mail from SQL (test suites in psql and pgTAP, and the application): wait for the
-- newest matching message of an inbox, then pull the activation link or the code out of it.
-- Authorized like list_messages/read_message (session token or owner): a message id alone is a
-- guessable sequence number and must not open someone else's mail.
--
-- Two forms of the wait (docs/testing-signup.md, "What a wait holds"):
-- - wait_for_message, a function (pgTAP calls it inside its transaction): its statement holds one
--   snapshot, and its transaction the ACCESS SHARE locks on mailroom.messages and its partitions,
--   for the whole wait, so the wait is capped at 60 seconds (it pins xmin and makes partition DDL
--   wait that long at most);
-- - await_message, a procedure called as a top-level CALL: it commits after every poll (50 ms), so
--   between polls it holds no lock and no snapshot; it may wait up to 10 minutes.
-- find_message is one poll (no wait). The faces' wait (REST, SSE, MCP: docs/architecture.md, "The
-- wait") looks with http_wait_look (sql/29_http.sql) on the same _newest_message, and counts its
-- waits per server process against the caps wait_caps reads (wait_refused raises the refusal).
-- Errors: MR203/MR204/MR205/MR206 (authorization, as for reading), MR209 (message not in this
-- mailbox), MR212 (timed out), MR213 (timeout negative, NULL or over the cap), MR214 (nothing
-- yet and the transaction is not READ COMMITTED, so waiting could never see new mail), MR215
-- (no link or code matching in the message), MR251/MR252/MR253 (a server's wait caps, wait_refused).

CREATE OR REPLACE FUNCTION mailroom_internal._newest_message(
    p_mailbox bigint, p_subject_like text, p_after_id bigint DEFAULT null
)
RETURNS mailroom.messages
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT g.*
    FROM mailroom.messages AS g
    WHERE
        g.mailbox_id = p_mailbox
        AND (p_subject_like IS NULL OR g.subject LIKE p_subject_like)
        AND (p_after_id IS NULL OR g.id > p_after_id)
    ORDER BY g.received_at DESC, g.id DESC
    LIMIT 1;
$$;

COMMENT ON FUNCTION mailroom_internal._newest_message(bigint, text, bigint) IS
'Internal: the newest message of a mailbox whose subject is LIKE p_subject_like (NULL: any) and whose id is greater than p_after_id (NULL: any, the wait''s cursor); a NULL row when there is none.';

CREATE OR REPLACE FUNCTION mailroom.find_message(
    p_address text,
    p_session_token text,
    p_subject_like text DEFAULT null,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null
)
RETURNS bigint
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes;
BEGIN
    PERFORM mailroom_internal._caller_pattern(p_subject_like, 'like');
    v_box := mailroom_internal._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id);
    RETURN (mailroom_internal._newest_message(v_box.id, p_subject_like)).id;
END;
$$;

COMMENT ON FUNCTION mailroom.find_message(text, text, text, text, text) IS
'Id of the newest message of an open mailbox whose subject is LIKE p_subject_like (NULL: any), or NULL; no wait; authorized like list_messages; does not mark it read.';

GRANT EXECUTE ON FUNCTION mailroom.find_message(text, text, text, text, text) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom.wait_for_message(
    p_address text,
    p_session_token text,
    p_timeout interval,
    p_subject_like text DEFAULT null,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null,
    p_after_id bigint DEFAULT null
)
RETURNS TABLE (
    message_id bigint,
    received_at timestamptz,
    subject text,
    from_header text,
    envelope_from text,
    text_body text,
    html_body text
)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- The wait is counted in sleeps, not read from a clock: mailroom.clock() may be pinned (it
    -- would never move) and a rule may not read the wall clock itself. So the wait lasts at
    -- least p_timeout and at most p_timeout plus the time of the queries, never forever.
    c_step constant double precision := 0.05;
    v_box mailroom.mailboxes;
    v_message mailroom.messages;
    v_seconds double precision;
    v_rounds integer;
BEGIN
    -- 60 seconds at most: the statement's snapshot and the transaction's locks last the whole wait
    -- (await_message, which commits between polls, waits up to 10 minutes)
    IF p_timeout IS NULL OR p_timeout < interval '0' OR p_timeout > interval '60 seconds' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR213',
            MESSAGE = 'p_timeout must be between 0 and 60 seconds (CALL mailroom.await_message waits up to 10 minutes)';
    END IF;
    PERFORM mailroom_internal._caller_pattern(p_subject_like, 'like');
    v_box := mailroom_internal._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id);
    v_seconds := extract(EPOCH FROM p_timeout);
    v_rounds := ceil(v_seconds / c_step)::integer;

    FOR v_round IN 0..v_rounds LOOP
        IF v_round > 0 THEN
            -- An inbox deleted or expired during the wait ends it at once (MR206/MR205).
            v_box := mailroom_internal._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id);
        END IF;
        -- Under READ COMMITTED every statement of a VOLATILE function takes a fresh snapshot, so
        -- this query sees every message committed before it started.
        v_message := mailroom_internal._newest_message(v_box.id, p_subject_like, p_after_id);
        IF v_message.id IS NOT NULL THEN
            RETURN QUERY SELECT
                v_message.id, v_message.received_at, v_message.subject, v_message.from_header,
                v_message.envelope_from, v_message.text_body, v_message.html_body;
            RETURN;
        END IF;
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'MR214',
                MESSAGE = format(
                    'no matching message yet, and under %s this transaction would never see one: '
                    'call wait_for_message in READ COMMITTED',
                    current_setting('transaction_isolation')
                );
        END IF;
        EXIT WHEN v_round = v_rounds;
        PERFORM pg_sleep(least(c_step, v_seconds - v_round * c_step));
    END LOOP;
    RAISE EXCEPTION USING
        ERRCODE = 'MR212',
        MESSAGE = format('no matching message arrived within %s', p_timeout);
END;
$$;

COMMENT ON FUNCTION mailroom.wait_for_message(text, text, interval, text, text, text, bigint) IS
'Newest message of an open mailbox whose subject is LIKE p_subject_like (NULL: any) and whose id is greater than p_after_id (NULL: any; the cursor of a resend flow), waiting up to p_timeout (0 to 60 seconds, MR213; the wait holds one snapshot and its transaction''s locks) for one to be committed; MR212 on timeout, MR214 outside READ COMMITTED, MR205/MR206 as soon as the mailbox expires or is deleted; authorized like list_messages; does not mark it read.';

GRANT EXECUTE ON FUNCTION mailroom.wait_for_message(text, text, interval, text, text, text, bigint) TO mailroom_app;

CREATE OR REPLACE PROCEDURE mailroom.await_message(
    p_address text,
    p_session_token text,
    p_timeout interval,
    p_subject_like text DEFAULT null,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null,
    INOUT p_message_id bigint DEFAULT null
)
LANGUAGE plpgsql
AS $$
-- SECURITY INVOKER and without SET search_path: PostgreSQL refuses COMMIT in a procedure that has
-- either (as run_expiry). It runs with its caller's rights and only calls the SECURITY DEFINER
-- find_message (schema-qualified), which checks the mailbox on every poll (MR205/MR206 end the
-- wait at once). Called inside a transaction block, COMMIT is not allowed: use wait_for_message.
-- It repeats wait_for_message's timeout check and poll count rather than calling a helper:
-- internal helpers are executable by the owner only, and this runs as its caller.
DECLARE
    c_step constant double precision := 0.05;
    v_seconds double precision;
    v_rounds integer;
BEGIN
    IF p_timeout IS NULL OR p_timeout < interval '0' OR p_timeout > interval '10 minutes' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR213',
            MESSAGE = 'p_timeout must be between 0 and 10 minutes';
    END IF;
    v_seconds := extract(EPOCH FROM p_timeout);
    v_rounds := ceil(v_seconds / c_step)::integer;
    FOR v_round IN 0..v_rounds LOOP
        p_message_id := mailroom.find_message(p_address, p_session_token, p_subject_like, p_owner_type, p_owner_id);
        IF p_message_id IS NOT NULL THEN
            RETURN;
        END IF;
        -- end this poll's transaction: its locks and its snapshot do not outlive the poll
        COMMIT;
        EXIT WHEN v_round = v_rounds;
        PERFORM pg_catalog.pg_sleep(least(c_step, v_seconds - v_round * c_step));
        COMMIT;
    END LOOP;
    RAISE EXCEPTION USING
        ERRCODE = 'MR212',
        MESSAGE = format('no matching message arrived within %s', p_timeout);
END;
$$;

COMMENT ON PROCEDURE mailroom.await_message (text, text, interval, text, text, text, bigint) IS
'CALL form of wait_for_message: the id of the newest matching message (INOUT p_message_id), waiting up to p_timeout (0 to 10 minutes, MR213) and committing after every 50 ms poll, so the wait holds no lock and no snapshot between polls; MR212 on timeout; a top-level CALL only.';

GRANT EXECUTE ON PROCEDURE mailroom.await_message(text, text, interval, text, text, text, bigint) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom_internal._readable_message(
    p_address text,
    p_session_token text,
    p_message_id bigint,
    p_owner_type text,
    p_owner_id text
)
RETURNS mailroom.messages
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_box mailroom.mailboxes;
    v_message mailroom.messages;
BEGIN
    v_box := mailroom_internal._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id);
    SELECT * INTO v_message
    FROM mailroom.messages AS g
    WHERE g.id = p_message_id AND g.mailbox_id = v_box.id;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR209',
            MESSAGE = format('message %s not found in this mailbox', coalesce(p_message_id::text, 'NULL'));
    END IF;
    RETURN v_message;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._readable_message(text, text, bigint, text, text) IS
'Internal: one message of an open mailbox the caller may read (MR203-MR206 as _authorize_mailbox, MR209 if not in it).';

CREATE OR REPLACE FUNCTION mailroom_internal._html_to_text(p_html text)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT replace(replace(replace(replace(replace(
        regexp_replace(
            regexp_replace(p_html, '<(style|script)\M.*?</\1\s*>', ' ', 'gi'),
            '<[^>]*>', ' ', 'g'
        ),
        '&nbsp;', ' '), '&lt;', '<'), '&gt;', '>'), '&quot;', '"'), '&amp;', '&');
$$;

COMMENT ON FUNCTION mailroom_internal._html_to_text(text) IS
'Internal: the visible text of an HTML body (style and script dropped, tags to spaces, the five common entities decoded), for extract_code.';

CREATE OR REPLACE FUNCTION mailroom_internal._message_link(p_message mailroom.messages, p_url_like text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_link text;
BEGIN
    -- The text part: http(s) URLs up to white space or a delimiter, without trailing punctuation.
    SELECT u.url INTO v_link
    FROM (
        SELECT
            regexp_replace(m.hit[1], '[.,;:!?)\]''"]+$', '') AS url,
            m.n
        FROM regexp_matches(coalesce(p_message.text_body, ''), '(https?://[^\s<>"]+)', 'gi')
            WITH ORDINALITY AS m (hit, n)
    ) AS u
    WHERE p_url_like IS NULL OR u.url LIKE p_url_like
    ORDER BY u.n
    LIMIT 1;
    IF v_link IS NULL THEN
        -- Else the HTML part: the http(s) hrefs, in document order, with &amp; decoded.
        SELECT u.url INTO v_link
        FROM (
            SELECT
                replace(btrim(coalesce(m.hit[1], m.hit[2], m.hit[3])), '&amp;', '&') AS url,
                m.n
            FROM regexp_matches(
                coalesce(p_message.html_body, ''),
                'href\s*=\s*(?:"([^"]*)"|''([^'']*)''|([^\s>"'']+))', 'gi'
            ) WITH ORDINALITY AS m (hit, n)
        ) AS u
        WHERE
            u.url ~* '^https?://'
            AND (p_url_like IS NULL OR u.url LIKE p_url_like)
        ORDER BY u.n
        LIMIT 1;
    END IF;
    RETURN v_link;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._message_link(mailroom.messages, text) IS
'Internal: the first http(s) link of a stored message LIKE p_url_like (NULL: any), from the text part, else the HTML hrefs; NULL when none (extract_link, http_read_message, mcp_read_message).';

CREATE OR REPLACE FUNCTION mailroom.extract_link(
    p_address text,
    p_session_token text,
    p_message_id bigint,
    p_url_like text DEFAULT null,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null
)
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_message mailroom.messages;
    v_link text;
BEGIN
    PERFORM mailroom_internal._caller_pattern(p_url_like, 'like');
    v_message := mailroom_internal._readable_message(p_address, p_session_token, p_message_id, p_owner_type, p_owner_id);
    v_link := mailroom_internal._message_link(v_message, p_url_like);
    IF v_link IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR215',
            MESSAGE = format('no link%s in message %s',
                             CASE WHEN p_url_like IS NULL THEN '' ELSE ' matching the pattern' END,
                             p_message_id);
    END IF;
    RETURN v_link;
END;
$$;

COMMENT ON FUNCTION mailroom.extract_link(text, text, bigint, text, text, text) IS
'First http(s) link of a message LIKE p_url_like (NULL: any): from the text part, else from the HTML hrefs; MR215 when there is none; authorized like read_message (MR209), does not mark it read.';

GRANT EXECUTE ON FUNCTION mailroom.extract_link(text, text, bigint, text, text, text) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom_internal._message_code(p_message mailroom.messages, p_pattern text)
RETURNS text[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_hit text [] := regexp_match(coalesce(p_message.text_body, ''), p_pattern);
BEGIN
    IF v_hit IS NULL THEN
        v_hit := regexp_match(coalesce(mailroom_internal._html_to_text(p_message.html_body), ''), p_pattern);
    END IF;
    RETURN v_hit;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._message_code(mailroom.messages, text) IS
'Internal: the first match (regexp_match''s array) of the regular expression p_pattern in a stored message''s text part, else its HTML''s visible text; NULL when none (the caller bounds the pattern: _caller_pattern).';

CREATE OR REPLACE FUNCTION mailroom.extract_code(
    p_address text,
    p_session_token text,
    p_message_id bigint,
    p_pattern text DEFAULT '\m\d{5}\M',
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null
)
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_message mailroom.messages;
    v_hit text [];
BEGIN
    IF p_pattern IS NULL OR p_pattern = '' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'p_pattern must be a non-empty regular expression';
    END IF;
    PERFORM mailroom_internal._caller_pattern(p_pattern, 'regex');
    v_message := mailroom_internal._readable_message(p_address, p_session_token, p_message_id, p_owner_type, p_owner_id);
    v_hit := mailroom_internal._message_code(v_message, p_pattern);
    IF v_hit IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR215',
            MESSAGE = format('no code matching the pattern in message %s', p_message_id);
    END IF;
    -- A pattern with a capture group returns the group, else the whole match.
    RETURN v_hit[1];
END;
$$;

COMMENT ON FUNCTION mailroom.extract_code(text, text, bigint, text, text, text) IS
'First match of the regular expression p_pattern (default a 5-digit word; its first group if it has one) in a message: the text part, else the visible text of the HTML part; MR215 when none; MR010 for a pattern past the bounds (200 characters, no back-reference, 8 quantifiers); authorized like read_message (MR209).';

GRANT EXECUTE ON FUNCTION mailroom.extract_code(text, text, bigint, text, text, text) TO mailroom_app;

CREATE OR REPLACE FUNCTION mailroom.wait_caps()
RETURNS TABLE (kind text, per_credential integer, total integer, per_client integer)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- the numbers a server process counts its waits against (the counting is the process's)
    SELECT
        'wait',
        mailroom.setting('wait.max_per_credential')::integer,
        mailroom.setting('wait.max_total')::integer,
        mailroom.setting('wait.max_per_client')::integer
    UNION ALL
    SELECT
        'events',
        mailroom.setting('events.max_per_credential')::integer,
        mailroom.setting('events.max_total')::integer,
        mailroom.setting('events.max_per_client')::integer
$$;

COMMENT ON FUNCTION mailroom.wait_caps() IS
'The caps of a server process''s waits (kind wait: REST long polls and MCP wait_for_message; kind events: SSE streams): per API key or session token, in total, and per client address (settings wait.* and events.*).';

GRANT EXECUTE ON FUNCTION mailroom.wait_caps() TO mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.wait_refused(p_kind text, p_scope text)
RETURNS void
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_what text := CASE p_kind WHEN 'wait' THEN 'waits' WHEN 'events' THEN 'event streams' END;
BEGIN
    -- the refusal of a wait over a cap the server counted (wait_caps): the code, its words and
    -- Retry-After (DETAIL, seconds) are SQL's, as every refusal
    IF v_what IS NULL OR p_scope IS NULL OR p_scope NOT IN ('credential', 'total', 'client') THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'p_kind must be wait or events, p_scope credential, client or total';
    END IF;
    IF p_scope = 'credential' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR251',
            MESSAGE = format('too many %s for this credential on this server (%s.max_per_credential), try again',
                             v_what, p_kind),
            DETAIL = '1';
    END IF;
    IF p_scope = 'client' THEN
        -- one client address's, whatever its credentials (anonymous inboxes each have a token of their own)
        RAISE EXCEPTION USING
            ERRCODE = 'MR253',
            MESSAGE = format('too many %s from this client address on this server (%s.max_per_client), try again',
                             v_what, p_kind),
            DETAIL = '1';
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'MR252',
        MESSAGE = format('too many %s on this server (%s.max_total), try again', v_what, p_kind),
        DETAIL = '1';
END;
$$;

COMMENT ON FUNCTION mailroom.wait_refused(text, text) IS
'Raise the refusal of a wait (p_kind wait) or event stream (events) over a server''s cap (wait_caps): MR251 for p_scope credential, MR253 for client (its address), MR252 for total, DETAIL the seconds to retry after (1).';

GRANT EXECUTE ON FUNCTION mailroom.wait_refused(text, text) TO mailroom_http;
