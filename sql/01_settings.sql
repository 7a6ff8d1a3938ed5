-- Reading and writing mailroom.settings. A write is checked against the setting's kind and
-- bounds (columns kind, min_value, max_value): a bad value is refused when it is set, with a
-- message naming the rule, rather than failing a worker later on a cast.

CREATE OR REPLACE FUNCTION mailroom.setting(p_name text)
RETURNS text
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_value text;
BEGIN
    SELECT s.value INTO v_value FROM mailroom.settings AS s WHERE s.name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR001',
            MESSAGE = format('unknown setting %L', p_name),
            HINT = 'SELECT name FROM mailroom.list_settings() lists the known settings';
    END IF;
    RETURN v_value;
END;
$$;

COMMENT ON FUNCTION mailroom.setting(text) IS
'Value of a setting; raises MR001 when the setting does not exist.';

GRANT EXECUTE ON FUNCTION mailroom.setting(text)
TO mailroom_app, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_monitor, mailroom_http;

-- Several settings in one read, in the order asked (a function that needs many: on Citus each read
-- of the settings, a reference table, is a statement of its own on the coordinator); an unknown name
-- raises setting()'s MR001.
CREATE OR REPLACE FUNCTION mailroom_internal._settings(p_names text[])
RETURNS text[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_values text[];
    v_missing text;
BEGIN
    SELECT array_agg(s.value ORDER BY n.o), min(n.name) FILTER (WHERE s.name IS NULL)
    INTO v_values, v_missing
    FROM unnest(p_names) WITH ORDINALITY AS n (name, o)
    LEFT JOIN mailroom.settings AS s ON n.name = s.name;
    IF v_missing IS NOT NULL THEN
        PERFORM mailroom.setting(v_missing);
    END IF;
    RETURN v_values;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._settings(text[]) IS
'Internal: the values of several settings in one read, in the order given; an unknown one raises MR001 (setting()).';

-- The rule of each kind; min_value / max_value are inclusive and either may be NULL (unbounded).
--   interval, integer, number: the value parses as that type and lies within the bounds
--     (number: not NaN or infinite)
--   boolean: the value parses as a boolean
--   text: any text whose length in characters lies within the bounds
--   name: letters, digits, '.', '_', '-', starting with a letter or digit, length within bounds
--   domain: a domain name, by the domain part of the shared address rule
--   url: http:// or https://, a host name or [IPv6] literal, an optional port and path; no
--     user info, query, fragment or white space; at most max_value characters
--   rate: "N/min" or "N/h" (sql/09_rates.sql), N within the bounds
--   globs: comma-separated address globs (sql/09_rates.sql), at most max_value characters
-- Only numbers, intervals and booleans are quoted back in the message; the text kinds state
-- the rule without repeating the value.
CREATE OR REPLACE FUNCTION mailroom_internal._check_setting_value(
    p_name text, p_kind text, p_min text, p_max text, p_value text
)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ok boolean;
    v_rule text;
    v_len integer := char_length(p_value);
BEGIN
    CASE p_kind
        WHEN 'interval' THEN
            v_rule := 'an interval';
            BEGIN
                v_ok := (p_min IS NULL OR p_value::interval >= p_min::interval)
                    AND (p_max IS NULL OR p_value::interval <= p_max::interval);
            EXCEPTION
                WHEN data_exception THEN
                    v_ok := false;
            END;
        WHEN 'integer' THEN
            v_rule := 'an integer';
            BEGIN
                v_ok := (p_min IS NULL OR p_value::bigint >= p_min::bigint)
                    AND (p_max IS NULL OR p_value::bigint <= p_max::bigint);
            EXCEPTION
                WHEN data_exception THEN
                    v_ok := false;
            END;
        WHEN 'number' THEN
            v_rule := 'a number';
            BEGIN
                v_ok := p_value::numeric NOT IN ('NaN', 'Infinity', '-Infinity')
                    AND (p_min IS NULL OR p_value::numeric >= p_min::numeric)
                    AND (p_max IS NULL OR p_value::numeric <= p_max::numeric);
            EXCEPTION
                WHEN data_exception THEN
                    v_ok := false;
            END;
        WHEN 'boolean' THEN
            BEGIN
                v_ok := p_value::boolean IS NOT NULL;
            EXCEPTION
                WHEN data_exception THEN
                    v_ok := false;
            END;
            IF NOT v_ok THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'MR003',
                    MESSAGE = format('setting %s must be a boolean (true or false), got %L',
                        p_name, left(p_value, 40));
            END IF;
            RETURN;
        WHEN 'text', 'name' THEN
            v_ok := (p_min IS NULL OR v_len >= p_min::integer)
                AND (p_max IS NULL OR v_len <= p_max::integer)
                AND (p_kind = 'text' OR p_value ~ '^[A-Za-z0-9][A-Za-z0-9._-]*$');
            IF NOT v_ok THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'MR003',
                    MESSAGE = format('setting %s must be %s of %s to %s characters%s',
                        p_name,
                        CASE p_kind WHEN 'text' THEN 'text' ELSE 'a name' END,
                        coalesce(p_min, '0'), coalesce(p_max, 'any number of'),
                        CASE p_kind WHEN 'name' THEN
                            ' (letters, digits, ".", "_" or "-", starting with a letter or digit)'
                        ELSE '' END);
            END IF;
            RETURN;
        WHEN 'domain' THEN
            IF NOT mailroom_internal._is_valid_address('postmaster@' || p_value) THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'MR003',
                    MESSAGE = format('setting %s must be a domain name (dot-separated labels of letters, '
                        || 'digits and "-", at most 253 characters)', p_name);
            END IF;
            RETURN;
        WHEN 'url' THEN
            IF p_value !~ '^https?://([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[^\s?#]*)?$'
                OR (p_max IS NOT NULL AND v_len > p_max::integer) THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'MR003',
                    MESSAGE = format('setting %s must be an http:// or https:// URL without user info, '
                        || 'query or fragment%s', p_name,
                        CASE WHEN p_max IS NOT NULL THEN format(', at most %s characters', p_max) ELSE '' END);
            END IF;
            RETURN;
        WHEN 'rate' THEN
            -- "N/min" or "N/h" (sql/09_rates.sql); N within the bounds
            v_ok := p_value ~ '^[0-9]{1,9}/(min|h)$'
                AND (p_min IS NULL OR split_part(p_value, '/', 1)::bigint >= p_min::bigint)
                AND (p_max IS NULL OR split_part(p_value, '/', 1)::bigint <= p_max::bigint);
            IF NOT v_ok THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'MR003',
                    MESSAGE = format('setting %s must be a rate "N/min" or "N/h" with N from %s to %s, got %L',
                        p_name, coalesce(p_min, '0'), coalesce(p_max, 'any'), left(p_value, 40));
            END IF;
            RETURN;
        WHEN 'globs' THEN
            -- comma-separated address globs (sql/09_rates.sql): each without white space or quotes,
            -- at most 254 characters and 8 "*"; the whole within max_value characters
            v_ok := (p_max IS NULL OR v_len <= p_max::integer)
                AND NOT EXISTS (
                    SELECT 1 FROM regexp_split_to_table(p_value, ',') AS g (item)
                    WHERE btrim(g.item) <> ''
                        AND (btrim(g.item) ~ '[\s"<>(),;]' OR length(btrim(g.item)) > 254
                            OR length(btrim(g.item)) - length(replace(btrim(g.item), '*', '')) > 8)
                );
            IF NOT v_ok THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'MR003',
                    MESSAGE = format('setting %s must be comma-separated address globs (such as *@example.com; '
                        || '"*" any run of characters), each at most 254 characters with at most 8 "*"%s',
                        p_name, CASE WHEN p_max IS NOT NULL THEN format(', %s characters in all', p_max) ELSE '' END);
            END IF;
            RETURN;
        ELSE
            RAISE EXCEPTION USING
                ERRCODE = 'MR004',
                MESSAGE = format('setting %s declares no kind, so it cannot be checked or changed', p_name),
                HINT = 'A migration sets its kind (and bounds) in mailroom.settings.';
    END CASE;
    IF NOT v_ok THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR003',
            MESSAGE = format('setting %s must be %s%s, got %L',
                p_name, v_rule,
                CASE
                    WHEN p_min IS NOT NULL AND p_max IS NOT NULL THEN format(' between %s and %s', p_min, p_max)
                    WHEN p_min IS NOT NULL THEN format(' of at least %s', p_min)
                    WHEN p_max IS NOT NULL THEN format(' of at most %s', p_max)
                    ELSE ''
                END,
                left(p_value, 40));
    END IF;
END;
$$;

COMMENT ON FUNCTION mailroom_internal._check_setting_value(text, text, text, text, text) IS
'Internal: raise MR003 unless the value is of the kind and within the bounds given (MR004 for no kind).';

CREATE OR REPLACE FUNCTION mailroom.set_setting(p_name text, p_value text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    s mailroom.settings;
BEGIN
    SELECT * INTO s FROM mailroom.settings AS x WHERE x.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR001',
            MESSAGE = format('unknown setting %L', p_name),
            HINT = 'SELECT name FROM mailroom.list_settings() lists the known settings';
    END IF;
    IF p_value IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = '22004',
            MESSAGE = format('setting %s cannot be NULL', p_name);
    END IF;
    PERFORM mailroom_internal._check_setting_value(s.name, s.kind, s.min_value, s.max_value, p_value);
    UPDATE mailroom.settings AS x SET value = p_value WHERE x.name = p_name;
    RETURN p_value;
END;
$$;

COMMENT ON FUNCTION mailroom.set_setting(text, text) IS
'Change an existing setting after checking the value against its kind and bounds; MR001 unknown name, MR003 bad value, MR004 setting without a kind, 22004 NULL.';

GRANT EXECUTE ON FUNCTION mailroom.set_setting(text, text) TO mailroom_admin;

CREATE OR REPLACE FUNCTION mailroom.interval_setting(p_name text)
RETURNS interval
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- set_setting checked the value against its kind, so an interval setting always casts
    RETURN mailroom.setting(p_name)::interval;
END;
$$;

COMMENT ON FUNCTION mailroom.interval_setting(text) IS
'Value of an interval setting as an interval (a worker reads its lease or period typed); raises MR001 when the setting does not exist.';

GRANT EXECUTE ON FUNCTION mailroom.interval_setting(text)
TO mailroom_app, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_monitor;

CREATE OR REPLACE FUNCTION mailroom.list_settings()
RETURNS TABLE (name text, value text, kind text, min_value text, max_value text, description text)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    -- No setting holds a secret (keys are passed by their callers; the peppers live in tables of
    -- their own), so whoever may read one setting may list them all.
    SELECT s.name, s.value, s.kind, s.min_value, s.max_value, s.description
    FROM mailroom.settings AS s
    ORDER BY s.name
$$;

COMMENT ON FUNCTION mailroom.list_settings() IS
'Every setting: name, value, kind and bounds (what set_setting accepts), description.';

GRANT EXECUTE ON FUNCTION mailroom.list_settings()
TO mailroom_app, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_monitor, mailroom_admin;
