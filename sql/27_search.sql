-- Search of an inbox's messages a user can guess (issue 35): words matched as prefixes (and, from
-- 3 characters, anywhere inside a word), qualifiers, addresses and domains by their parts.
--
-- The vector is a column of mailroom.messages (migration 0141), filled after delivery by
-- index_messages (called by `mailroom http serve` as it hears each delivery's NOTIFY), never in
-- deliver_message's statement: the accept path neither computes it nor maintains an index for it,
-- and filling it is a HOT update (the column is not indexed: a search reads one inbox, at most its
-- plan's message count, through messages_mailbox_received_idx). A message not filled yet (no HTTP
-- server running, or the NOTIFY missed), or filled by an older definition of the vector
-- (search_version <> _search_vector_version()), is matched with its vector computed on the fly (a
-- first-definition one completed with what it lacks: _search_vector_from_v1), so a search is never
-- missing one and is right while reindex_messages rebuilds the old ones in the background (batches,
-- SKIP LOCKED; the maintenance worker, `mailroom maintain --every`, calls it). The configuration is
-- 'simple' (no stemming: addresses, codes and names in any language match as written).
--
-- The vector: subject A, From (header and envelope sender) B, text C (the text part, else the
-- HTML's visible text), the recipient (envelope_to) D; an address also as its local part, its
-- domain and each parent domain (billing@shop.example.org: billing, shop.example.org, example.org).
--
-- The query (at most 1,000 characters, MR225; at most 16 terms, MR226), parsed in one pass by
-- _search_terms; every term must match (AND), `or` between two terms makes either do:
--   word       any word of subject, From or text starting with it; from 3 characters, containing it
--              (`pine` finds pineapple, `voic` invoice); `word*` is a prefix only
--   "a phrase" these words in this order (subject, From or text)
--   -term      the term must not match (any kind below too)
--   from:x to:x subject:x   the word or "phrase" in that field only
--   is:read is:unread has:attachment tag:x before:YYYY-MM-DD after:YYYY-MM-DD (UTC days; before is
--              strictly before the day, after is from the day on); another value: MR227
-- Substring matching reads the lexemes of the inbox's vectors (strpos, no pattern: nothing of the
-- query becomes a LIKE or a regular expression), one inbox at a time. tag:x matches a message with
-- the tag x (sql/22_marks.sql, plus-addressing). Errors: MR203-MR206 (authorization, as for reading), MR246 (nothing to
-- search for), MR225-MR227 (above), MR218 (a best-first page's cursor, its last message, is gone).
-- Pages: best first then newest by id; the next page is what ranks after the previous page's last
-- message (p_before_id: its rank for this query, then its id: a keyset, however the inbox grows).

CREATE OR REPLACE FUNCTION mailroom_internal._search_vector_version()
RETURNS smallint
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    -- raise it with any change of _message_search_vector: stored vectors of an older one are
    -- searched on the fly and rebuilt by reindex_messages
    SELECT 2::smallint
$$;

COMMENT ON FUNCTION mailroom_internal._search_vector_version() IS
'Internal: the definition of the search vector (messages.search_version of a vector made by it).';

CREATE OR REPLACE FUNCTION mailroom_internal._address_words(p_text text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- each address of the text (bounded) by its parts: the local part, the domain and each parent
    -- domain of at least two labels (billing@shop.example.org: billing shop.example.org example.org)
    RETURN (
        SELECT coalesce(pg_catalog.string_agg(w.word, ' '), '')
        FROM pg_catalog.regexp_matches(
            pg_catalog.lower(left(coalesce(p_text, ''), 2000)), '([^\s<>"(),;:@]+)@([^\s<>"(),;:@]+)', 'g'
        ) AS m (parts)
        CROSS JOIN LATERAL (SELECT pg_catalog.string_to_array(rtrim(m.parts[2], '.'), '.') AS labels) AS d
        CROSS JOIN LATERAL (
            SELECT m.parts[1] AS word
            UNION ALL
            SELECT pg_catalog.array_to_string(d.labels[i:], '.')
            FROM pg_catalog.generate_series(1, greatest(cardinality(d.labels) - 1, 1)) AS i
        ) AS w
    );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._address_words(text) IS
'Internal: the addresses of a text by their parts (local part, domain, each parent domain), space-separated, for the search vector.';

CREATE OR REPLACE FUNCTION mailroom_internal._message_search_vector(
    p_subject text,
    p_from_header text,
    p_envelope_from text,
    p_text_body text,
    p_html_body text,
    p_envelope_to text
)
RETURNS tsvector
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_from text := left(coalesce(p_from_header, '') || ' ' || coalesce(p_envelope_from, ''), 2000);
    v_to text := left(coalesce(p_envelope_to, ''), 2000);
BEGIN
    -- the addresses also as words (alice@example.com is one token to the parser: 'alice',
    -- 'example' and 'example.com' should find it too); the text is bounded so a huge body cannot
    -- fail the vector. Any change here raises _search_vector_version().
    RETURN setweight(pg_catalog.to_tsvector('pg_catalog.simple', left(coalesce(p_subject, ''), 2000)), 'A')
        || setweight(
            pg_catalog.to_tsvector(
                'pg_catalog.simple',
                v_from || ' ' || translate(v_from, '@.<>"', '     ') || ' ' || mailroom_internal._address_words(v_from)
            ),
            'B'
        )
        || setweight(
            pg_catalog.to_tsvector(
                'pg_catalog.simple',
                left(coalesce(p_text_body, mailroom_internal._html_to_text(left(p_html_body, 200000)), ''), 200000)
            ),
            'C'
        )
        || setweight(
            pg_catalog.to_tsvector('pg_catalog.simple', v_to || ' ' || mailroom_internal._address_words(v_to)), 'D'
        );
END;
$$;

COMMENT ON FUNCTION mailroom_internal._message_search_vector(text, text, text, text, text, text) IS
'Internal: the search vector of a message (subject A, from B, text or the HTML''s visible text C, recipient D; addresses also by their parts; simple configuration, bounded input).';

CREATE OR REPLACE FUNCTION mailroom_internal._search_vector_from_v1(
    p_vector tsvector,
    p_from_header text,
    p_envelope_from text,
    p_envelope_to text
)
RETURNS tsvector
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- a vector of the first definition (search_version NULL: subject A, from B, text C) lacks only
    -- the addresses' parts (B) and the recipient (D): those short strings are added and the text
    -- is not read again, so a search stays fast until reindex_messages has rebuilt the row
    RETURN p_vector
        || setweight(pg_catalog.to_tsvector(
            'pg_catalog.simple',
            mailroom_internal._address_words(left(coalesce(p_from_header, '') || ' ' || coalesce(p_envelope_from, ''), 2000))
        ), 'B')
        || setweight(pg_catalog.to_tsvector(
            'pg_catalog.simple',
            left(coalesce(p_envelope_to, ''), 2000) || ' ' || mailroom_internal._address_words(p_envelope_to)
        ), 'D');
END;
$$;

COMMENT ON FUNCTION mailroom_internal._search_vector_from_v1(tsvector, text, text, text) IS
'Internal: a search vector of the first definition completed to the current one (the addresses'' parts, the recipient), for a search before reindex_messages rebuilds it.';

CREATE OR REPLACE FUNCTION mailroom.index_messages(p_message_ids bigint[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_version constant smallint := mailroom_internal._search_vector_version();
    v_count integer;
BEGIN
    IF cardinality(p_message_ids) > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'at most 1000 message ids a call';
    END IF;
    -- rows another session is filling (or reading for update) are skipped: it does them
    WITH due AS (
        SELECT g.id, g.received_at
        FROM mailroom.messages AS g
        WHERE
            g.id = ANY(p_message_ids)
            AND (g.search_vector IS NULL OR g.search_version IS DISTINCT FROM c_version)
        FOR UPDATE SKIP LOCKED
    )

    UPDATE mailroom.messages AS g
    SET
        search_vector = mailroom_internal._message_search_vector(
            g.subject, g.from_header, g.envelope_from, g.text_body, g.html_body, g.envelope_to
        ),
        search_version = c_version
    FROM due
    WHERE g.id = due.id AND g.received_at = due.received_at;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END;
$$;

COMMENT ON FUNCTION mailroom.index_messages(bigint[]) IS
'Fill the search vector of these delivered messages (at most 1000; those filled already by this definition, or locked, are skipped); returns how many.';

GRANT EXECUTE ON FUNCTION mailroom.index_messages(bigint[]) TO mailroom_http, mailroom_inbound;

CREATE OR REPLACE FUNCTION mailroom.reindex_messages(p_batch integer DEFAULT 1000)
RETURNS TABLE (walked integer, rebuilt integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_version constant smallint := mailroom_internal._search_vector_version();
    v_after bigint;
    v_last bigint;
BEGIN
    IF p_batch IS NULL OR p_batch < 1 OR p_batch > 10000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'p_batch must be between 1 and 10000';
    END IF;
    -- one walker at a time: another one holds the cursor, this call has nothing to do
    SELECT CASE WHEN r.version = c_version THEN r.after_id ELSE 0 END INTO v_after
    FROM mailroom.search_reindex AS r
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        walked := 0;
        rebuilt := 0;
        RETURN NEXT;
        RETURN;
    END IF;
    -- the next p_batch ids (the primary key of each partition, in id order)
    SELECT max(n.id), count(*) INTO v_last, walked
    FROM (
        SELECT g.id FROM mailroom.messages AS g WHERE g.id > v_after ORDER BY g.id LIMIT p_batch
    ) AS n;
    IF v_last IS NULL THEN
        UPDATE mailroom.search_reindex SET version = c_version, after_id = v_after;
        rebuilt := 0;
        RETURN NEXT;
        RETURN;
    END IF;
    -- rows being filled by index_messages (or locked by anyone) are skipped: a search computes
    -- their vector on the fly, and index_messages fills them
    WITH due AS (
        SELECT g.id, g.received_at
        FROM mailroom.messages AS g
        WHERE
            g.id > v_after AND g.id <= v_last
            AND (g.search_vector IS NULL OR g.search_version IS DISTINCT FROM c_version)
        FOR UPDATE SKIP LOCKED
    )

    UPDATE mailroom.messages AS g
    SET
        search_vector = mailroom_internal._message_search_vector(
            g.subject, g.from_header, g.envelope_from, g.text_body, g.html_body, g.envelope_to
        ),
        search_version = c_version
    FROM due
    WHERE g.id = due.id AND g.received_at = due.received_at;
    GET DIAGNOSTICS rebuilt = ROW_COUNT;
    UPDATE mailroom.search_reindex SET version = c_version, after_id = v_last;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom.reindex_messages(integer) IS
'Walk the next p_batch messages (id order, from a cursor) and rebuild the search vectors missing or made by an older definition (SKIP LOCKED); walked 0: at the end.';

GRANT EXECUTE ON FUNCTION mailroom.reindex_messages(integer) TO mailroom_http, mailroom_inbound, mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom_internal._search_terms(p_query text)
RETURNS mailroom.search_term[]
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_max_length constant integer := 1000;
    c_max_terms constant integer := 16;
    v_terms mailroom.search_term[] := '{}';
    v_t mailroom.search_term;
    v_m text[];
    v_qual text;
    v_value text;
    v_quoted boolean;
    v_count integer := 0;
    v_grp integer := 0;
    v_join boolean := false;
    v_lexemes text[];
BEGIN
    IF length(p_query) > c_max_length THEN
        RAISE EXCEPTION USING ERRCODE = 'MR225',
            MESSAGE = format('a search query is at most %s characters (this one has %s)', c_max_length, length(p_query));
    END IF;
    -- one pass of a fixed pattern: [-][qualifier:]("a phrase"|word)
    FOR v_m IN
        SELECT m.parts
        FROM pg_catalog.regexp_matches(
            coalesce(p_query, ''), '(-?)(?:([A-Za-z]+):)?("[^"]*"?|[^\s"]+)', 'g'
        ) AS m (parts)
    LOOP
        v_qual := lower(v_m[2]);
        v_value := v_m[3];
        v_quoted := left(v_value, 1) = '"';
        IF v_m[1] = '' AND v_qual IS NULL AND NOT v_quoted AND lower(v_value) = 'or' THEN
            v_join := cardinality(v_terms) > 0;
            CONTINUE;
        END IF;
        IF v_qual IS NOT NULL AND v_qual NOT IN ('from', 'to', 'subject', 'is', 'has', 'tag', 'before', 'after') THEN
            -- not a qualifier (code:123, https://…): a word as written
            v_value := v_m[2] || ':' || v_value;
            v_qual := null;
            v_quoted := false;
        END IF;
        v_count := v_count + 1;
        IF v_count > c_max_terms THEN
            RAISE EXCEPTION USING ERRCODE = 'MR226',
                MESSAGE = format('a search query has at most %s terms', c_max_terms);
        END IF;
        v_t := ROW(CASE WHEN v_join THEN v_grp ELSE v_grp + 1 END, v_m[1] = '-', null, null, null, false, null, null);
        IF v_qual = 'is' AND lower(v_value) IN ('read', 'unread') THEN
            v_t.kind := lower(v_value);
        ELSIF v_qual = 'has' AND lower(v_value) IN ('attachment', 'attachments') THEN
            v_t.kind := 'attachment';
        ELSIF v_qual = 'tag' THEN
            v_t.kind := 'tag';
            v_t.lexemes := ARRAY[lower(trim(BOTH '"' FROM v_value))];
        ELSIF v_qual IN ('before', 'after') AND v_value ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' THEN
            BEGIN
                v_t.at := v_value::date::timestamp AT TIME ZONE 'UTC';
            EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format THEN
                RAISE EXCEPTION USING ERRCODE = 'MR227',
                    MESSAGE = format('%s: takes a date YYYY-MM-DD (this one is not a day)', v_qual);
            END;
            v_t.kind := v_qual;
        ELSIF v_qual IN ('is', 'has', 'before', 'after') THEN
            RAISE EXCEPTION USING ERRCODE = 'MR227',
                MESSAGE = format('%s: takes %s', v_qual, CASE v_qual
                    WHEN 'is' THEN 'read or unread' WHEN 'has' THEN 'attachment' ELSE 'a date YYYY-MM-DD'
                END);
        ELSE
            v_t.weights := CASE v_qual WHEN 'from' THEN 'b' WHEN 'to' THEN 'd' WHEN 'subject' THEN 'a' ELSE 'abc' END;
            IF v_quoted THEN
                IF trim(BOTH '" ' FROM v_value) = '' THEN
                    CONTINUE;
                END IF;
                v_t.kind := 'phrase';
                v_t.phrase := pg_catalog.phraseto_tsquery('pg_catalog.simple', trim(BOTH '"' FROM v_value));
                IF pg_catalog.numnode(v_t.phrase) = 0 THEN
                    CONTINUE;
                END IF;
            ELSE
                v_t.kind := 'word';
                v_t.prefix := right(v_value, 1) = '*';
                v_lexemes := pg_catalog.tsvector_to_array(
                    pg_catalog.to_tsvector('pg_catalog.simple', rtrim(v_value, '*'))
                );
                IF cardinality(v_lexemes) = 0 THEN
                    CONTINUE;
                END IF;
                -- every lexeme as a prefix in these weights ('pine':*ABC; a binary search) …
                v_t.phrase := (
                    SELECT pg_catalog.string_agg(
                        format('''%s'':*%s', replace(replace(l.lexeme, '\', '\\'), '''', ''''''), upper(v_t.weights)),
                        ' & '
                    )::tsquery
                    FROM unnest(v_lexemes) AS l (lexeme)
                );
                -- … or, unless word* or a lexeme is shorter than 3 characters, each inside one: the
                -- needles strpos looks for in the text of the stripped vector ('pineapple' 'shop' …)
                IF NOT v_t.prefix AND NOT EXISTS (
                    SELECT 1 FROM unnest(v_lexemes) AS l (lexeme)
                    WHERE length(l.lexeme) < 3 OR l.lexeme ~ '[''\\]'
                ) THEN
                    v_t.lexemes := v_lexemes;
                END IF;
            END IF;
        END IF;
        v_terms := v_terms || v_t;
        v_grp := v_t.grp;
        v_join := false;
    END LOOP;
    IF cardinality(v_terms) = 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'MR246', MESSAGE = 'the search query has no word to search for';
    END IF;
    RETURN v_terms;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._search_terms(text) IS
'Internal: a search query parsed in one pass into its terms (words, phrases, qualifiers, -negation, or); MR225 too long, MR226 too many terms, MR227 a qualifier''s value, MR246 nothing to search for.';

CREATE OR REPLACE FUNCTION mailroom_internal._search_mailboxes(
    p_box_ids bigint[],
    p_query text,
    p_limit integer,
    p_before_id bigint DEFAULT null,
    p_newest_first boolean DEFAULT false
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
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_version constant smallint := mailroom_internal._search_vector_version();
    v_terms mailroom.search_term[];
    v_t mailroom.search_term;
    v_vector boolean;
    v_shared boolean;
    v_rank tsquery;
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 OR p_limit > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'p_limit must be between 1 and 1000';
    END IF;
    v_terms := mailroom_internal._search_terms(p_query);
    -- best first, a page's cursor is its last message: the next page ranks after it (its rank for this
    -- query, then its id). A cursor gone from these inboxes ranks nowhere: MR218, start again.
    IF p_before_id IS NOT NULL AND NOT p_newest_first AND NOT EXISTS (
        SELECT 1 FROM mailroom.messages AS c WHERE c.id = p_before_id AND c.mailbox_id = ANY(p_box_ids)
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR218',
            MESSAGE = 'the message this search page ends with is gone: search again from the first page';
    END IF;
    v_vector := EXISTS (SELECT 1 FROM unnest(v_terms) AS t WHERE t.kind IN ('word', 'phrase'));
    -- two words or more that may be looked for as substrings in subject, From and text: the text
    -- of those lexemes is made once a message (for one, only when its prefix did not match)
    v_shared := (
        SELECT count(*) FROM unnest(v_terms) AS t WHERE t.kind = 'word' AND t.lexemes IS NOT NULL AND t.weights = 'abc'
    ) > 1;
    -- the rank: any of the words and phrases wanted (subject weighs most)
    FOREACH v_t IN ARRAY v_terms LOOP
        IF v_t.kind IN ('word', 'phrase') AND NOT v_t.negated THEN
            v_rank := CASE WHEN v_rank IS NULL THEN v_t.phrase ELSE v_rank || v_t.phrase END;
        END IF;
    END LOOP;
    -- Newest first by id (p_newest_first: the owner's all-mail list), or best first then newest by id;
    -- ids, not received_at: in one inbox they are taken under its row lock, so they are the order mail
    -- was stored in, and the order drop_oldest lets it go in (sql/21_delivery.sql). The rank is
    -- computed for the matches and for the cursor, whose rank the keyset compares with.
    RETURN QUERY
    SELECT k.id, k.received_at, k.from_header, k.subject, k.rank
    FROM (
        SELECT c.*, max(c.rank) FILTER (WHERE c.id = p_before_id) OVER () AS cursor_rank
        FROM (
            SELECT g.id, g.received_at, g.from_header, g.subject, m.hit,
                coalesce(pg_catalog.ts_rank(v.vector, v_rank), 0)::real AS rank
            FROM mailroom.messages AS g
            CROSS JOIN LATERAL (
                SELECT CASE
                    WHEN NOT v_vector THEN null
                    WHEN g.search_vector IS NOT NULL AND g.search_version = c_version THEN g.search_vector
                    WHEN g.search_vector IS NOT NULL AND g.search_version IS NULL AND c_version = 2 THEN
                        mailroom_internal._search_vector_from_v1(g.search_vector, g.from_header, g.envelope_from, g.envelope_to)
                    ELSE mailroom_internal._message_search_vector(
                        g.subject, g.from_header, g.envelope_from, g.text_body, g.html_body, g.envelope_to
                    )
                END AS vector
                OFFSET 0  -- computed once a row, not at each use (the planner would inline the expression)
            ) AS v
            CROSS JOIN LATERAL (
                SELECT CASE WHEN v_shared THEN pg_catalog.strip(pg_catalog.ts_filter(v.vector, '{a,b,c}'))::text END AS words
                OFFSET 0
            ) AS w
            CROSS JOIN LATERAL (
                -- no group of terms (terms joined by or) without a term that holds
                SELECT NOT EXISTS (
                    SELECT 1
                    FROM unnest(v_terms) AS t
                    GROUP BY t.grp
                    HAVING NOT bool_or(
                        CASE t.kind
                            -- a prefix of a word of these weights (a binary search of the sorted lexemes),
                            -- else each lexeme inside one: strpos in the text of the stripped vector
                            WHEN 'word' THEN v.vector @@ t.phrase OR (
                                t.lexemes IS NOT NULL
                                AND (
                                    SELECT bool_and(strpos(f.lexemes, l.needle) > 0)
                                    FROM (
                                        SELECT coalesce(
                                            CASE WHEN t.weights = 'abc' THEN w.words END,
                                            pg_catalog.strip(pg_catalog.ts_filter(
                                                v.vector, pg_catalog.string_to_array(t.weights, null)::"char"[]
                                            ))::text
                                        ) AS lexemes
                                    ) AS f
                                    CROSS JOIN unnest(t.lexemes) AS l (needle)
                                )
                            )
                            WHEN 'phrase' THEN
                                pg_catalog.ts_filter(v.vector, pg_catalog.string_to_array(t.weights, null)::"char"[]) @@ t.phrase
                            WHEN 'read' THEN g.is_read
                            WHEN 'unread' THEN NOT g.is_read
                            WHEN 'attachment' THEN pg_catalog.jsonb_array_length(g.attachments) > 0
                            WHEN 'before' THEN g.received_at < t.at
                            WHEN 'after' THEN g.received_at >= t.at
                            WHEN 'tag' THEN t.lexemes[1] = ANY(g.tags)
                            ELSE false
                        END IS DISTINCT FROM t.negated
                    )
                ) AS hit
                OFFSET 0
            ) AS m
            WHERE
                g.mailbox_id = ANY(p_box_ids)
                AND (p_before_id IS NULL OR NOT p_newest_first OR g.id < p_before_id)
                AND (m.hit OR (g.id = p_before_id AND NOT p_newest_first))
        ) AS c
    ) AS k
    WHERE
        k.hit
        AND (p_before_id IS NULL OR p_newest_first OR (k.rank, k.id) < (k.cursor_rank, p_before_id))
    ORDER BY CASE WHEN p_newest_first THEN 0 ELSE k.rank END DESC, k.id DESC
    LIMIT p_limit;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._search_mailboxes(bigint[], text, integer, bigint, boolean) IS
'Internal: the messages of these mailboxes matching a search query (words as prefixes or substrings, qualifiers, phrases, -negation, or), best first then newest by id (or newest first by id: p_newest_first), at most p_limit, after the page ending at p_before_id (keyset; MR218 if that message is gone from a best-first search).';

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
    RETURN QUERY SELECT * FROM mailroom_internal._search_mailboxes(
        ARRAY[(mailroom_internal._authorize_mailbox(p_address, p_session_token, p_owner_type, p_owner_id)).id],
        p_query,
        p_limit
    );
END;
$$;

COMMENT ON FUNCTION mailroom.search_messages(text, text, text, text, text, integer) IS
'Search an open mailbox''s messages (words as prefixes/substrings, from: to: subject: is: has: tag: before: after:, "phrases", -not, or; docs/inboxes.md): every match up to p_limit, best first; authorized like list_messages.';

GRANT EXECUTE ON FUNCTION mailroom.search_messages(text, text, text, text, text, integer) TO mailroom_app;
