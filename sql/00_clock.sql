-- The one clock every business rule reads, so tests and demos can pin time.

CREATE OR REPLACE FUNCTION mailroom.clock()
RETURNS timestamptz
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT coalesce(
        nullif(current_setting('mailroom.clock', true), '')::timestamptz,
        clock_timestamp()
    )
$$;

COMMENT ON FUNCTION mailroom.clock() IS
'Current time for business rules: the pinned mailroom.clock setting if set, else clock_timestamp().';

CREATE OR REPLACE FUNCTION mailroom.pin_clock(
    p_at timestamptz, p_local boolean DEFAULT true
)
RETURNS timestamptz
LANGUAGE sql
VOLATILE
AS $$
    SELECT set_config('mailroom.clock', p_at::text, p_local)::timestamptz
$$;

COMMENT ON FUNCTION mailroom.pin_clock(timestamptz, boolean) IS
'Pin mailroom.clock() to p_at for this transaction (or the session when p_local is false).';

CREATE OR REPLACE FUNCTION mailroom.unpin_clock(p_local boolean DEFAULT true)
RETURNS timestamptz
LANGUAGE sql
VOLATILE
AS $$
    SELECT set_config('mailroom.clock', '', p_local);
    SELECT mailroom.clock()
$$;

COMMENT ON FUNCTION mailroom.unpin_clock(boolean) IS
'Release a pinned clock so mailroom.clock() follows real time again; returns the time.';
