-- The one clock every business rule reads, so tests and demos can pin time.

CREATE OR REPLACE FUNCTION mailroom.clock()
RETURNS timestamptz
LANGUAGE sql
STABLE
PARALLEL SAFE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce(
        nullif(current_setting('mailroom.clock', true), '')::timestamptz,
        clock_timestamp()
    )
$$;

COMMENT ON FUNCTION mailroom.clock() IS
'Current time for business rules: the pinned mailroom.clock setting if set, else clock_timestamp().';

GRANT EXECUTE ON FUNCTION mailroom.clock()
TO mailroom_app, mailroom_collector, mailroom_sender, mailroom_inbound, mailroom_monitor;

CREATE OR REPLACE FUNCTION mailroom.pin_clock(
    p_at timestamptz, p_local boolean DEFAULT true
)
RETURNS timestamptz
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT set_config('mailroom.clock', p_at::text, p_local)::timestamptz
$$;

COMMENT ON FUNCTION mailroom.pin_clock(timestamptz, boolean) IS
'Pin mailroom.clock() to p_at for this transaction (or the session when p_local is false).';

GRANT EXECUTE ON FUNCTION mailroom.pin_clock(timestamptz, boolean) TO mailroom_timekeeper;

CREATE OR REPLACE FUNCTION mailroom.unpin_clock(p_local boolean DEFAULT true)
RETURNS timestamptz
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT set_config('mailroom.clock', '', p_local);
    SELECT mailroom.clock()
$$;

COMMENT ON FUNCTION mailroom.unpin_clock(boolean) IS
'Release a pinned clock so mailroom.clock() follows real time again; returns the time.';

GRANT EXECUTE ON FUNCTION mailroom.unpin_clock(boolean) TO mailroom_timekeeper;
