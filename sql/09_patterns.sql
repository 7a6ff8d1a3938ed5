-- Patterns a caller supplies (issue 34): checked as input before they run, in one place.
--
-- PostgreSQL's regular expressions run in time linear in the text for most patterns, but a
-- back-reference makes the engine backtrack (`(.*)(.*)(.*)\3\2\1$` over 400 characters ran for
-- minutes), and LIKE's `%` retries every position. So every pattern an API caller gives
-- (extract_code's p_pattern, extract_link's p_url_like, the p_subject_like of find_message,
-- wait_for_message, await_message and the HTTP long poll) goes through _caller_pattern first:
--   regex: at most 200 characters, no back-reference (\1 … \9), at most 8 quantifiers (* + ? {m,n}),
--          each repetition count at most 100;                                             MR010
--          and it compiles (the compiler's 2201B named);                                  MR034
--   like:  at most 200 characters, at most 8 % wildcards;                                 MR011
-- A statement timeout is the backstop (docs/deployment.md): the HTTP face and MCP set one per
-- transaction; a psql login sets its own.

CREATE OR REPLACE FUNCTION mailroom_internal._caller_pattern(p_pattern text, p_kind text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
PARALLEL RESTRICTED
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c_max_length constant integer := 200;
    c_max_quantifiers constant integer := 8;
    c_max_repeat constant integer := 100;
    v_len integer;
    v_i integer := 1;
    v_c text;
    v_quantifiers integer := 0;
    v_bound text;
    v_close integer;
    v_j integer;
BEGIN
    IF p_pattern IS NULL THEN
        RETURN null;
    END IF;
    v_len := length(p_pattern);
    IF p_kind = 'like' THEN
        IF v_len > c_max_length THEN
            RAISE EXCEPTION USING ERRCODE = 'MR011',
                MESSAGE = format('a LIKE pattern is at most %s characters (this one has %s)', c_max_length, v_len);
        END IF;
        -- every %, escaped (\%) or not: a bound on the retries, never too few
        IF length(p_pattern) - length(replace(p_pattern, '%', '')) > c_max_quantifiers THEN
            RAISE EXCEPTION USING ERRCODE = 'MR011',
                MESSAGE = format('a LIKE pattern has at most %s %% wildcards', c_max_quantifiers);
        END IF;
        RETURN p_pattern;
    END IF;
    IF p_kind IS DISTINCT FROM 'regex' THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'p_kind is regex or like';
    END IF;
    IF v_len > c_max_length THEN
        RAISE EXCEPTION USING ERRCODE = 'MR010',
            MESSAGE = format('a regular expression is at most %s characters (this one has %s)', c_max_length, v_len);
    END IF;
    -- One pass over at most 200 characters: escapes, quantifiers and repetition counts.
    WHILE v_i <= v_len LOOP
        v_c := substr(p_pattern, v_i, 1);
        IF v_c = '\' THEN
            v_c := substr(p_pattern, v_i + 1, 1);
            IF v_c BETWEEN '1' AND '9' THEN
                RAISE EXCEPTION USING ERRCODE = 'MR010',
                    MESSAGE = 'a regular expression may not use back-references (\1 to \9)';
            END IF;
            v_i := v_i + 2;
            CONTINUE;
        END IF;
        IF v_c = '[' THEN
            -- a bracket expression: its characters are literal (a ] right after [ or [^ is one of them)
            v_j := v_i + 1;
            IF substr(p_pattern, v_j, 1) = '^' THEN
                v_j := v_j + 1;
            END IF;
            IF substr(p_pattern, v_j, 1) = ']' THEN
                v_j := v_j + 1;
            END IF;
            v_close := strpos(substr(p_pattern, v_j), ']');
            IF v_close = 0 THEN
                EXIT;  -- unbalanced: the regex compiler refuses it (2201B)
            END IF;
            v_i := v_j + v_close;
            CONTINUE;
        END IF;
        IF v_c IN ('*', '+') OR (v_c = '?' AND v_i > 1 AND substr(p_pattern, v_i - 1, 1) <> '(') THEN
            -- a lazy quantifier (*? +? ?? }?) is one quantifier, not two
            IF NOT (v_c = '?' AND substr(p_pattern, v_i - 1, 1) IN ('*', '+', '?', '}')) THEN
                v_quantifiers := v_quantifiers + 1;
            END IF;
        ELSIF v_c = '{' THEN
            v_bound := substring(substr(p_pattern, v_i) FROM '^\{([0-9]*(,[0-9]*)?)\}');
            IF v_bound IS NOT NULL THEN
                v_quantifiers := v_quantifiers + 1;
                IF EXISTS (
                    SELECT 1 FROM unnest(string_to_array(v_bound, ',')) AS b (n)
                    WHERE b.n <> '' AND (length(b.n) > 3 OR b.n::integer > c_max_repeat)
                ) THEN
                    RAISE EXCEPTION USING ERRCODE = 'MR010',
                        MESSAGE = format('a repetition count in a regular expression is at most %s', c_max_repeat);
                END IF;
                v_i := v_i + length(v_bound) + 2;
                CONTINUE;
            END IF;
        END IF;
        v_i := v_i + 1;
    END LOOP;
    IF v_quantifiers > c_max_quantifiers THEN
        RAISE EXCEPTION USING ERRCODE = 'MR010',
            MESSAGE = format('a regular expression has at most %s quantifiers (this one has %s)',
                             c_max_quantifiers, v_quantifiers);
    END IF;
    -- within its bounds, it must compile: the compiler's 2201B is the caller's bad input, named (MR034)
    BEGIN
        PERFORM '' ~ p_pattern;
    EXCEPTION WHEN invalid_regular_expression THEN
        RAISE EXCEPTION USING ERRCODE = 'MR034',
            MESSAGE = format('not a valid regular expression: %s', sqlerrm);
    END;
    RETURN p_pattern;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._caller_pattern(text, text) IS
'Internal: a caller''s pattern (p_kind regex or like) checked before it runs, returned as given: at most 200 characters; a regex without back-references, with at most 8 quantifiers and repetition counts up to 100 (MR010), that compiles (MR034); a LIKE pattern with at most 8 % (MR011).';
