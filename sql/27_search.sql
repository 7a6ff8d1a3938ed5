-- Full-text search of an inbox's messages: subject, From (the header and the envelope sender) and
-- the text (the text part, else the visible text of the HTML part).
--
-- The vector is a column of mailroom.messages (migration 0141), filled after delivery by
-- index_messages (called by `mailroom http serve` as it hears each delivery's NOTIFY), never in
-- deliver_message's statement: the accept path neither computes it nor maintains an index for it,
-- and filling it is a HOT update (the column is not indexed: a search reads one inbox, at most its
-- plan's message count, through messages_mailbox_received_idx). A message not filled yet (no HTTP
-- server running, or the NOTIFY missed) is matched with its vector computed on the fly, so a search
-- is never missing one. The configuration is 'simple' (no stemming: addresses, codes and names in
-- any language match as written); a query is websearch_to_tsquery syntax (words, "phrases", -not, or).
-- Errors: MR203-MR206 (authorization, as for reading), MR246 (a query without a searchable word).

CREATE OR REPLACE FUNCTION mailroom._message_search_vector(
    p_subject text,
    p_from_header text,
    p_envelope_from text,
    p_text_body text,
    p_html_body text
)
RETURNS tsvector
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_from text := left(coalesce(p_from_header, '') || ' ' || coalesce(p_envelope_from, ''), 2000);
BEGIN
    -- the addresses also as words (alice@example.com is one token to the parser: 'alice' and
    -- 'example' should find it too); the text is bounded so a huge body cannot fail the vector
    RETURN setweight(pg_catalog.to_tsvector('pg_catalog.simple', left(coalesce(p_subject, ''), 2000)), 'A')
        || setweight(pg_catalog.to_tsvector('pg_catalog.simple', v_from || ' ' || translate(v_from, '@.<>"', '     ')), 'B')
        || setweight(
            pg_catalog.to_tsvector(
                'pg_catalog.simple',
                left(coalesce(p_text_body, mailroom._html_to_text(left(p_html_body, 200000)), ''), 200000)
            ),
            'C'
        );
END;
$$;

COMMENT ON FUNCTION mailroom._message_search_vector(text, text, text, text, text) IS
'Internal: the search vector of a message (subject A, from B, text or the HTML''s visible text C; simple configuration, bounded input).';

CREATE OR REPLACE FUNCTION mailroom.index_messages(p_message_ids bigint[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_count integer;
BEGIN
    IF cardinality(p_message_ids) > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'at most 1000 message ids a call';
    END IF;
    -- rows another session is filling (or reading for update) are skipped: it does them
    WITH due AS (
        SELECT g.id, g.received_at
        FROM mailroom.messages AS g
        WHERE g.id = ANY(p_message_ids) AND g.search_vector IS NULL
        FOR UPDATE SKIP LOCKED
    )

    UPDATE mailroom.messages AS g
    SET search_vector = mailroom._message_search_vector(
        g.subject, g.from_header, g.envelope_from, g.text_body, g.html_body
    )
    FROM due
    WHERE g.id = due.id AND g.received_at = due.received_at;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom.index_messages(bigint[]) IS
'Fill the search vector of these delivered messages (at most 1000; those filled already or locked are skipped); returns how many.';

GRANT EXECUTE ON FUNCTION mailroom.index_messages(bigint[]) TO mailroom_http, mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom._search_mailbox(p_box mailroom.mailboxes, p_query text, p_limit integer)
RETURNS TABLE (
    message_id bigint,
    received_at timestamptz,
    from_header text,
    subject text,
    rank real
)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_query tsquery := pg_catalog.websearch_to_tsquery('pg_catalog.simple', left(coalesce(p_query, ''), 1000));
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 OR p_limit > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'p_limit must be between 1 and 1000';
    END IF;
    IF pg_catalog.numnode(v_query) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'MR246', MESSAGE = 'the search query has no word to search for';
    END IF;
    RETURN QUERY
    SELECT g.id, g.received_at, g.from_header, g.subject, pg_catalog.ts_rank(v.vector, v_query)
    FROM mailroom.messages AS g
    CROSS JOIN LATERAL (
        SELECT coalesce(
            g.search_vector,
            mailroom._message_search_vector(g.subject, g.from_header, g.envelope_from, g.text_body, g.html_body)
        ) AS vector
    ) AS v
    WHERE g.mailbox_id = p_box.id AND v.vector @@ v_query
    ORDER BY 5 DESC, g.received_at DESC, g.id DESC
    LIMIT p_limit;
END;
$$;

COMMENT ON FUNCTION mailroom._search_mailbox(mailroom.mailboxes, text, integer) IS
'Internal: the messages of one mailbox matching a websearch query, best first (MR246 when it has no word).';

CREATE OR REPLACE FUNCTION mailroom.search_messages(
    p_address text,
    p_session_token text,
    p_query text,
    p_owner_type text DEFAULT null,
    p_owner_id text DEFAULT null,
    p_limit integer DEFAULT 50
)
RETURNS TABLE (
    message_id bigint,
    received_at timestamptz,
    from_header text,
    subject text,
    rank real
)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY SELECT * FROM mailroom._search_mailbox(
        mailroom._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id), p_query, p_limit
    );
END;
$$;

COMMENT ON FUNCTION mailroom.search_messages(text, text, text, text, text, integer) IS
'Full-text search (websearch syntax) of an open mailbox''s messages by subject, from and text, best first; authorized like list_messages; MR246 for a query without a word.';

GRANT EXECUTE ON FUNCTION mailroom.search_messages(text, text, text, text, text, integer) TO mailroom_app;
