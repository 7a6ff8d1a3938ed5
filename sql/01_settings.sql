-- Reading and writing mailroom.settings.

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
            HINT = 'SELECT name FROM mailroom.settings lists the known settings';
    END IF;
    RETURN v_value;
END;
$$;

COMMENT ON FUNCTION mailroom.setting(text) IS
'Value of a setting; raises MR001 when the setting does not exist.';

GRANT EXECUTE ON FUNCTION mailroom.setting(text)
TO mailroom_app, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_monitor;

CREATE OR REPLACE FUNCTION mailroom.set_setting(p_name text, p_value text)
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_value IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = '22004',
            MESSAGE = format('setting %L cannot be NULL', p_name);
    END IF;
    UPDATE mailroom.settings SET value = p_value WHERE name = p_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR001',
            MESSAGE = format('unknown setting %L', p_name),
            HINT = 'SELECT name FROM mailroom.settings lists the known settings';
    END IF;
    RETURN p_value;
END;
$$;

COMMENT ON FUNCTION mailroom.set_setting(text, text) IS
'Change an existing setting; raises MR001 for an unknown name.';

GRANT EXECUTE ON FUNCTION mailroom.set_setting(text, text) TO mailroom_admin;
