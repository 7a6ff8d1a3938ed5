-- The static claim statement (0114) meets keys that never travel (0128): _claim no longer takes a
-- key (the relay password comes back sealed for the sender), so its keyed form goes; sql/33
-- creates the new one. The generated _claim_cached of the keyless claim goes too (0114 dropped the
-- keyed one): the claim is static SQL.
DROP FUNCTION IF EXISTS mailroom._claim(timestamptz, integer, text, interval, bytea, boolean);
DROP FUNCTION IF EXISTS mailroom._claim_cached(timestamptz, integer, text, interval);
