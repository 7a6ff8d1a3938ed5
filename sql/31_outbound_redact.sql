-- PII scrubbing for error_log: redact_pii replaces addresses, Message-IDs, anything in angle
-- brackets, quoted names and IP addresses with <redacted:HASH>, HASH being a keyed correlation
-- hash (HMAC-SHA256 under the redaction pepper of migration 0030). A trigger applies it to every
-- write of outbound_messages.error_log, whichever client writes it.

CREATE OR REPLACE FUNCTION mailroom_internal._redaction_tag(p_value text)
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- Same value -> same tag: brackets, quotes and case are not part of the identity. The pepper
    -- is read by its key, so the lookup stays an index scan under enable_seqscan = off (which
    -- finalize_messages sets): a disabled sequential scan costs 1e10 and would be JIT-compiled
    -- for every tag.
    SELECT '<redacted:'
        || left(
            encode(
                mailroom_internal._hmac(
                    convert_to(lower(btrim(p_value, '<>"')), 'UTF8'),
                    p.pepper,
                    'sha256'
                ),
                'hex'
            ),
            16
        )
        || '>'
    FROM mailroom.redaction_pepper AS p
    WHERE p.singleton;
$$;

CREATE OR REPLACE FUNCTION mailroom_internal._pii_pattern()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
    -- What redact_pii replaces, as leftmost-longest alternatives (groups are non-capturing, so
    -- regexp_matches returns whole matches; no alternative matches the empty string):
    --   <anything in angle brackets>        addresses, Message-IDs, <Names>
    --   "quoted strings"                    display names
    --   local@[literal], local@domain       bare addresses, any script
    --   local AT domain                     obfuscated: %40, (at), [at] or " at " for @, and
    --                                       ".", (dot), [dot] or " dot " between labels, ending
    --                                       in an alphabetic top-level label
    --   IPv6 (3+ colons or ::), IPv4
    SELECT concat_ws(
        '|',
        '<[^<>]*>',
        '"[^"\n]{1,200}"',
        '[^][[:space:]<>(),;:"@]+@\[[^]]*\]',
        '[^][[:space:]<>(),;:"@]+@[^][[:space:]<>(),;:"@]*[^][[:space:]<>(),;:"@.]',
        '[[:alnum:]._%+-]+'
        || '(?:%40|[[:space:]]*[([][Aa][Tt][])][[:space:]]*|[[:space:]]+[Aa][Tt][[:space:]]+)'
        || '[[:alnum:]](?:[[:alnum:]-]*[[:alnum:]])?'
        || '(?:(?:[.]|[[:space:]]*[([][Dd][Oo][Tt][])][[:space:]]*|[[:space:]]+[Dd][Oo][Tt][[:space:]]+)'
        || '[[:alnum:]](?:[[:alnum:]-]*[[:alnum:]])?)*'
        || '(?:[.]|[[:space:]]*[([][Dd][Oo][Tt][])][[:space:]]*|[[:space:]]+[Dd][Oo][Tt][[:space:]]+)'
        || '[[:alpha:]]{2,}\M',
        '\m[0-9A-Fa-f]{1,4}(?::[0-9A-Fa-f]{0,4}){3,7}',
        '[0-9A-Fa-f]{0,4}::[0-9A-Fa-f:.]*[0-9A-Fa-f]',
        '\m[0-9]{1,3}(?:[.][0-9]{1,3}){3}\M'
    );
$fn$;

CREATE OR REPLACE FUNCTION mailroom_internal._pii_identity(p_match text)
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
    -- The value a match is tagged by: an obfuscated address (no @, no brackets or quotes) is
    -- tagged as the address it spells, so user(at)example(dot)com, user%40example.com and
    -- user@example.com share one tag. Anything else is tagged as it is.
    SELECT CASE
        WHEN p_match ~ '[@<>"]' THEN p_match
        ELSE regexp_replace(
            regexp_replace(
                p_match,
                '%40|[[:space:]]*[([][Aa][Tt][])][[:space:]]*|[[:space:]]+[Aa][Tt][[:space:]]+',
                '@'
            ),
            '[[:space:]]*[([][Dd][Oo][Tt][])][[:space:]]*|[[:space:]]+[Dd][Oo][Tt][[:space:]]+',
            '.',
            'g'
        )
    END;
$fn$;

CREATE OR REPLACE FUNCTION mailroom.redact_pii(p_text text)
RETURNS text
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    -- One pass, linear in the text: split it at the matches of _pii_pattern (the text between
    -- them: n + 1 pieces) and list the n matches in the same order; piece i is followed by
    -- match i. Each distinct match is tagged once; a match that already is a tag stays as it is,
    -- which keeps redact_pii idempotent.
    WITH hits AS (
        SELECT h.m[1] AS hit, h.n
        FROM regexp_matches(p_text, mailroom_internal._pii_pattern(), 'g') WITH ORDINALITY AS h (m, n)
    ),

    tags AS (
        SELECT
            d.hit,
            CASE
                WHEN d.hit ~ '^<redacted:[0-9a-f]{16}>$' THEN d.hit
                ELSE mailroom_internal._redaction_tag(mailroom_internal._pii_identity(d.hit))
            END AS tag
        FROM (SELECT DISTINCT h.hit FROM hits AS h) AS d
    )

    SELECT string_agg(s.piece || coalesce(t.tag, ''), '' ORDER BY s.n)
    FROM regexp_split_to_table(p_text, mailroom_internal._pii_pattern()) WITH ORDINALITY AS s (piece, n)
    LEFT JOIN hits AS h ON s.n = h.n
    LEFT JOIN tags AS t ON h.hit = t.hit
$fn$;

COMMENT ON FUNCTION mailroom.redact_pii(text) IS
'Replace addresses (also %40, (at), [at] and " at " spellings), Message-IDs, <bracketed>/"quoted" names and IPs with <redacted:HASH> (keyed, stable).';

CREATE OR REPLACE FUNCTION mailroom_internal.trg_outbound_redact_error_log()
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
EXECUTE FUNCTION mailroom_internal.trg_outbound_redact_error_log();

CREATE OR REPLACE TRIGGER outbound_messages_redact_update
BEFORE UPDATE OF error_log ON mailroom.outbound_messages
FOR EACH ROW
WHEN (new.error_log IS DISTINCT FROM old.error_log)
EXECUTE FUNCTION mailroom_internal.trg_outbound_redact_error_log();

COMMENT ON FUNCTION mailroom_internal._redaction_tag(text) IS
'Internal: the stable keyed tag <redacted:HASH> of one value (HMAC with the redaction pepper).';

COMMENT ON FUNCTION mailroom_internal._pii_pattern() IS
'Internal: the regular expression of everything redact_pii replaces (leftmost-longest alternatives).';

COMMENT ON FUNCTION mailroom_internal._pii_identity(text) IS
'Internal: the value a redact_pii match is tagged by (an obfuscated address as the address it spells).';

-- _redaction_tag and redact_pii answer "what is the tag of this guess?", which is all the pepper
-- protects: only the owner runs them (through the error_log trigger, inside the SECURITY DEFINER
-- API). No runtime role may execute either or read mailroom.redaction_pepper.
REVOKE ALL ON FUNCTION mailroom_internal._redaction_tag(text) FROM public;
REVOKE ALL ON FUNCTION mailroom.redact_pii(text) FROM public;
REVOKE ALL ON TABLE mailroom.redaction_pepper FROM public;

COMMENT ON FUNCTION mailroom_internal.trg_outbound_redact_error_log() IS
'Trigger: pass every error_log write through mailroom.redact_pii, whichever client writes it.';
