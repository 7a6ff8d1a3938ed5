-- Time columns of the outbound tables default to mailroom.clock(), never now(): a pinned clock
-- (tests, demos, a worker's PGOPTIONS) then governs every timestamp, whichever path inserts.
--
-- Why a default through mailroom._clock_default() rather than dropping the defaults: rows are
-- also inserted by clients outside the API (benchmarks, pgTAP fixtures), and a NOT NULL column
-- without a default would make each of them restate the rule. Why not DEFAULT mailroom.clock()
-- directly: on a fresh database every migration runs before the sql/ pass that creates
-- mailroom.clock(), so this migration cannot name it in a DEFAULT. A PL/pgSQL body is only
-- resolved when it runs, so _clock_default() can be created here, before mailroom.clock()
-- exists, and the default calls whatever mailroom.clock() the sql/ pass installs.
-- sql/00_clock.sql re-creates _clock_default() on every migrate (the same body); it
-- is created here too because the DEFAULT needs it now.
CREATE OR REPLACE FUNCTION mailroom._clock_default()
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN mailroom.clock();
END;
$$;

COMMENT ON FUNCTION mailroom._clock_default() IS
'Internal: mailroom.clock() for column defaults (resolved at call time, so a migration can use it before sql/ runs).';

ALTER TABLE mailroom.senders
ALTER COLUMN created_at SET DEFAULT mailroom._clock_default(),
ALTER COLUMN updated_at SET DEFAULT mailroom._clock_default();

ALTER TABLE mailroom.outbound_messages
ALTER COLUMN created_at SET DEFAULT mailroom._clock_default(),
ALTER COLUMN updated_at SET DEFAULT mailroom._clock_default();
