-- The one clock every business rule reads, so tests and demos can pin time.
-- Anyone may SET the mailroom.clock parameter (a custom setting cannot be restricted), so the
-- clock honours a pin only for a login role that is a member of mailroom_timekeeper: an
-- application role cannot move time to revive an expired token or mailbox.

CREATE OR REPLACE FUNCTION mailroom_internal._may_pin_clock(p_role name)
RETURNS boolean
LANGUAGE sql
STABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE
        WHEN pg_catalog.to_regrole('mailroom_timekeeper') IS NULL
            OR pg_catalog.to_regrole(pg_catalog.quote_ident(p_role)) IS NULL
            THEN FALSE
        ELSE pg_catalog.pg_has_role(p_role, 'mailroom_timekeeper', 'MEMBER')
    END;
$$;

COMMENT ON FUNCTION mailroom_internal._may_pin_clock(name) IS
'Internal: true when the role is a member of mailroom_timekeeper (directly, through other roles, or as a superuser).';

CREATE OR REPLACE FUNCTION mailroom.clock()
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_pin text := pg_catalog.current_setting('mailroom.clock', true);
BEGIN
    IF v_pin IS NULL OR v_pin = '' THEN
        RETURN pg_catalog.clock_timestamp();
    END IF;
    -- session_user: the login role (current_user is the owner inside definer functions, and a
    -- SET ROLE does not change who logged in)
    IF mailroom_internal._may_pin_clock(session_user) THEN
        RETURN v_pin::timestamptz;
    END IF;
    RETURN pg_catalog.clock_timestamp();
END;
$$;

COMMENT ON FUNCTION mailroom.clock() IS
'Current time for business rules: the pinned mailroom.clock setting when the login role is a member of mailroom_timekeeper, else clock_timestamp().';

GRANT EXECUTE ON FUNCTION mailroom.clock()
TO mailroom_app, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_monitor, mailroom_http;

CREATE OR REPLACE FUNCTION mailroom.pin_clock(
    p_at timestamptz, p_local boolean DEFAULT true
)
RETURNS timestamptz
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_at IS NULL OR p_local IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = '22004',
            MESSAGE = 'pin_clock: the time and p_local must not be NULL';
    END IF;
    IF NOT mailroom_internal._may_pin_clock(session_user) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'MR005',
            MESSAGE = format('role %s may not pin the clock', session_user),
            HINT = 'GRANT mailroom_timekeeper to the login role of a test or demo.';
    END IF;
    RETURN pg_catalog.set_config('mailroom.clock', p_at::text, p_local)::timestamptz;
END;
$$;

COMMENT ON FUNCTION mailroom.pin_clock(timestamptz, boolean) IS
'Pin mailroom.clock() to p_at for this transaction (or the session when p_local is false); MR005 unless the login role is a mailroom_timekeeper.';

GRANT EXECUTE ON FUNCTION mailroom.pin_clock(timestamptz, boolean) TO mailroom_timekeeper;

CREATE OR REPLACE FUNCTION mailroom.unpin_clock(p_local boolean DEFAULT true)
RETURNS timestamptz
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.set_config('mailroom.clock', '', coalesce(p_local, true));
    SELECT mailroom.clock()
$$;

COMMENT ON FUNCTION mailroom.unpin_clock(boolean) IS
'Release a pinned clock so mailroom.clock() follows real time again; returns the time.';

GRANT EXECUTE ON FUNCTION mailroom.unpin_clock(boolean) TO mailroom_timekeeper;

CREATE OR REPLACE FUNCTION mailroom_internal._clock_default()
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The default of the outbound tables' created_at / updated_at (migration 0062, which also
    -- creates it, before this file exists on a fresh database): resolved when a row is inserted.
    RETURN mailroom.clock();
END;
$$;

COMMENT ON FUNCTION mailroom_internal._clock_default() IS
'Internal: mailroom.clock() for column defaults (resolved at call time, so a migration can use it before sql/ runs).';

CREATE OR REPLACE FUNCTION mailroom_internal._later(p_at timestamptz, p_delay interval)
RETURNS timestamptz
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- p_at + p_delay, the delay counted in seconds. timestamptz + interval is only STABLE, because
    -- an interval's days and months depend on the time zone; a number of seconds does not, so
    -- this is truly IMMUTABLE, which Citus requires of anything inside CASE in a statement that
    -- writes a table in its metadata (finalize_messages, the domain backoff; docs/scale.md).
    SELECT p_at + make_interval(secs => extract(EPOCH FROM p_delay)::double precision);
$$;

COMMENT ON FUNCTION mailroom_internal._later(timestamptz, interval) IS
'Internal: p_at plus p_delay counted in seconds (a day is 86,400 s whatever the time zone); IMMUTABLE.';
