-- PII scrubbing for error_log: redact_pii replaces addresses, Message-IDs, anything in angle
-- brackets, quoted names and IP addresses with <redacted:HASH>, HASH being a keyed correlation
-- hash (HMAC-SHA256 under the redaction pepper of migration 0030). A trigger applies it to every
-- write of outbound_messages.error_log, whichever client writes it.

CREATE OR REPLACE FUNCTION mailroom._redaction_tag(p_value text)
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- Same value -> same tag: brackets, quotes and case are not part of the identity.
    SELECT '<redacted:'
        || left(
            encode(
                mailroom._hmac(
                    convert_to(lower(btrim(p_value, '<>"')), 'UTF8'),
                    p.pepper,
                    'sha256'
                ),
                'hex'
            ),
            16
        )
        || '>'
    FROM mailroom.redaction_pepper AS p;
$$;

CREATE OR REPLACE FUNCTION mailroom.redact_pii(p_text text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    -- leftmost-longest alternatives, tried at each position:
    --   <anything in angle brackets>  (addresses, Message-IDs, <Names>)
    --   "quoted strings"              (display names)
    --   local@domain / local@[literal] (bare addresses, any script)
    --   IPv6 (3+ colons or ::) and IPv4 addresses
    v_pattern constant text := concat_ws(
        '|',
        '<[^<>]*>',
        '"[^"\n]{1,200}"',
        '[^][[:space:]<>(),;:"@]+@\[[^]]*\]',
        '[^][[:space:]<>(),;:"@]+@[^][[:space:]<>(),;:"@]*[^][[:space:]<>(),;:"@.]',
        '\m[0-9A-Fa-f]{1,4}(:[0-9A-Fa-f]{0,4}){3,7}',
        '[0-9A-Fa-f]{0,4}::[0-9A-Fa-f:.]*[0-9A-Fa-f]',
        '\m[0-9]{1,3}([.][0-9]{1,3}){3}\M'
    );
    v_out text := p_text;
    v_start integer := 1;
    v_pos integer;
    v_match text;
    v_tag text;
BEGIN
    IF p_text IS NULL THEN
        RETURN NULL;
    END IF;
    LOOP
        v_pos := regexp_instr(v_out, v_pattern, v_start);
        EXIT WHEN v_pos = 0;
        v_match := regexp_substr(v_out, v_pattern, v_start);
        IF v_match ~ '^<redacted:[0-9a-f]{16}>$' THEN
            -- already scrubbed: keeps redact_pii idempotent
            v_start := v_pos + length(v_match);
        ELSE
            v_tag := mailroom._redaction_tag(v_match);
            v_out := left(v_out, v_pos - 1) || v_tag || substr(v_out, v_pos + length(v_match));
            v_start := v_pos + length(v_tag);
        END IF;
    END LOOP;
    RETURN v_out;
END;
$fn$;

COMMENT ON FUNCTION mailroom.redact_pii(text) IS
'Replace addresses, Message-IDs, <bracketed>/"quoted" names and IPs with <redacted:HASH> (keyed, stable).';

CREATE OR REPLACE FUNCTION mailroom.trg_outbound_redact_error_log()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    NEW.error_log := mailroom.redact_pii(NEW.error_log);
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER outbound_messages_redact_insert
BEFORE INSERT ON mailroom.outbound_messages
FOR EACH ROW
WHEN (new.error_log IS NOT null)
EXECUTE FUNCTION mailroom.trg_outbound_redact_error_log();

CREATE OR REPLACE TRIGGER outbound_messages_redact_update
BEFORE UPDATE OF error_log ON mailroom.outbound_messages
FOR EACH ROW
WHEN (new.error_log IS DISTINCT FROM old.error_log)
EXECUTE FUNCTION mailroom.trg_outbound_redact_error_log();

COMMENT ON FUNCTION mailroom._redaction_tag(text) IS
'Internal: the stable keyed tag <redacted:HASH> of one value (HMAC with the redaction pepper).';

-- _redaction_tag and redact_pii answer "what is the tag of this guess?", which is all the pepper
-- protects: only the owner runs them (through the error_log trigger, inside the SECURITY DEFINER
-- API). No runtime role may execute either or read mailroom.redaction_pepper.
REVOKE ALL ON FUNCTION mailroom._redaction_tag(text) FROM public;
REVOKE ALL ON FUNCTION mailroom.redact_pii(text) FROM public;
REVOKE ALL ON TABLE mailroom.redaction_pepper FROM public;

COMMENT ON FUNCTION mailroom.trg_outbound_redact_error_log() IS
'Trigger: pass every error_log write through mailroom.redact_pii, whichever client writes it.';
