-- The edge's refusals (issue 43, item 3): the HTTP face and MCP over HTTP refuse a request before any
-- route reads it (driver/mailroom/http/edge.py: a body over its route's bound, a NUL character, a
-- malformed path or query, a JSON body nested too deep). The edge decides that a request is refused;
-- this function says how: it raises the refusal's MR code with its one-line message, and the code's
-- row of mailroom.error_codes (migration 0450) gives its HTTP status. The edge asks once per process
-- and refusal, and keeps the answer.

CREATE OR REPLACE FUNCTION mailroom.edge_refusal(p_refusal text, p_bound bigint DEFAULT null)
RETURNS void
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    CASE p_refusal
        WHEN 'body_too_large' THEN
            RAISE EXCEPTION 'the request body is over % bytes, this route''s bound', coalesce(p_bound::text, 'the')
                USING ERRCODE = 'MR030';
        WHEN 'nul' THEN
            RAISE EXCEPTION 'the request holds a NUL character (%%00, or \u0000 in a JSON string), which no text may hold'
                USING ERRCODE = 'MR031';
        WHEN 'malformed' THEN
            RAISE EXCEPTION 'the path, query or form is not valid UTF-8 once percent-decoded'
                USING ERRCODE = 'MR032';
        WHEN 'json_depth' THEN
            RAISE EXCEPTION 'the JSON body nests deeper than % levels', coalesce(p_bound::text, 'the allowed')
                USING ERRCODE = 'MR033';
        ELSE
            RAISE EXCEPTION 'edge_refusal: no refusal named %', quote_literal(p_refusal)
                USING ERRCODE = '22023';
    END CASE;
END;
$$;

COMMENT ON FUNCTION mailroom.edge_refusal(text, bigint) IS
'The edge''s refusal of a request (body_too_large, nul, malformed, json_depth; p_bound: the bound passed), raised with its code. Errors: MR030, MR031, MR032, MR033.';

GRANT EXECUTE ON FUNCTION mailroom.edge_refusal(text, bigint) TO mailroom_http;
