-- Checks of the mail itself (issue 35 item 3, docs/checks.md): the HTML compatibility check, the
-- link check and the spam score. Each request of GET …/messages/{id}/checks/{check} is ONE call of
-- http_message_check, which authorizes it as every http_* function does, decides whether the check
-- may run here (the server's switch travels as p_enabled, off unless told: MR280 link check off,
-- MR281 spam check off, both 503; the HTML check needs no switch) and returns only what that check
-- reads: the HTML part (html), the HTML and text parts (links), the raw bytes as received (spam;
-- bounded by the plan's size limit, which refused anything larger at delivery). The fetching and
-- the analysis are the HTTP face's, after this call, within its bounds. Never marks the message read.
-- Each call takes one from the API key's rate checks.rate_per_key (60/min) and one from the inbox's
-- checks.rate_per_inbox (20/min): over either, MR020 (HTTP 429 with Retry-After; sql/09_rates.sql).
-- The link check's ports (setting checks.link_ports, migration 0440) travel with what it reads.

CREATE OR REPLACE FUNCTION mailroom_internal._link_ports()
RETURNS integer[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_value text := mailroom.setting('checks.link_ports');
    v_ports integer[];
BEGIN
    IF v_value ~ '^\s*[0-9]{1,5}(\s*,\s*[0-9]{1,5})*\s*$' THEN
        v_ports := ARRAY(
            SELECT DISTINCT p::integer
            FROM pg_catalog.regexp_split_to_table(pg_catalog.btrim(v_value), '\s*,\s*') AS p
            ORDER BY 1
        );
    END IF;
    IF v_ports IS NULL OR v_ports[1] < 1 OR v_ports[pg_catalog.cardinality(v_ports)] > 65535 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR284',
            MESSAGE = 'setting checks.link_ports must be comma-separated port numbers from 1 to 65535',
            HINT = 'SELECT mailroom.set_setting(''checks.link_ports'', ''80,443'')';
    END IF;
    RETURN v_ports;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._link_ports() IS
'Internal: the ports the link check asks (setting checks.link_ports), sorted, each once; MR284 when it is not a list of ports 1-65535.';

CREATE OR REPLACE FUNCTION mailroom.http_message_check(
    p_address text,
    p_session_token text,
    p_key_digest bytea,
    p_message_id bigint,
    p_check text,
    p_enabled boolean DEFAULT false
)
RETURNS TABLE (html_body text, text_body text, raw bytea, link_ports integer[])
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_who record := mailroom_internal._http_who(p_address, p_session_token, p_key_digest);
    v_message mailroom.messages;
BEGIN
    IF p_check IS NULL OR p_check NOT IN ('html', 'links', 'spam') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR283',
            MESSAGE = format('unknown check %s: html, links or spam', coalesce(quote_literal(left(p_check, 40)), 'NULL'));
    END IF;
    v_message := mailroom_internal._readable_message(p_address, p_session_token, p_message_id, v_who.owner_type, v_who.owner_id);
    -- one from the API key's rate and one from the inbox's (sql/09_rates.sql; MR020, 429)
    IF v_who.owner_id IS NOT NULL THEN
        PERFORM mailroom_internal._take_rate('checks.key',
            'k' || (SELECT k.id FROM mailroom.api_keys AS k WHERE k.digest = p_key_digest), 'checks.rate_per_key');
    END IF;
    PERFORM mailroom_internal._take_rate('checks.inbox', v_message.mailbox_id::text, 'checks.rate_per_inbox');
    IF p_check = 'links' AND NOT coalesce(p_enabled, false) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR280',
            MESSAGE = 'the link check is off on this server: start it with --link-check (mailroom http serve, or mailroom run --http-port N)';
    END IF;
    IF p_check = 'spam' AND NOT coalesce(p_enabled, false) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR281',
            MESSAGE = 'the spam check is off on this server: run SpamAssassin''s spamd (Debian: apt install spamd; it listens on 127.0.0.1:783) and start the server with --spamd 127.0.0.1:783 (mailroom http serve, or mailroom run --http-port N)';
    END IF;
    IF p_check = 'html' AND coalesce(v_message.html_body, '') = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR282',
            MESSAGE = format('message %s has no HTML part to check', p_message_id);
    END IF;
    html_body := CASE WHEN p_check IN ('html', 'links') THEN v_message.html_body END;
    text_body := CASE WHEN p_check = 'links' THEN v_message.text_body END;
    raw := CASE WHEN p_check = 'spam' THEN v_message.raw END;
    link_ports := CASE WHEN p_check = 'links' THEN mailroom_internal._link_ports() END;
    RETURN NEXT;
END;
$$;

COMMENT ON FUNCTION mailroom.http_message_check(text, text, bytea, bigint, text, boolean) IS
'GET …/messages/{id}/checks/{html,links,spam}: what the check reads (HTML part; HTML and text, with the ports it may ask; raw bytes), not marking it read, within checks.rate_per_key and checks.rate_per_inbox (MR020, 429); MR280/MR281 when the server runs no such check, MR282 no HTML part, MR283 unknown check, MR284 a bad checks.link_ports.';

GRANT EXECUTE ON FUNCTION mailroom.http_message_check(text, text, bytea, bigint, text, boolean) TO mailroom_http;
