-- mailroom:as-migrator
-- The lock of `mailroom db migrate` (driver/mailroom/db/migrate.py, docs/upgrading.md): an empty
-- table that the runner creates before anything else and locks in SHARE UPDATE EXCLUSIVE mode for
-- the whole run. It replaces the runner's advisory lock, which any login on the server could take
-- and hold. Here it goes to mailroom_owner (on a database that predates it, the role running this
-- migration created it) and stays closed: no role but the owner has any privilege on it, so no
-- runtime role can lock it in a mode that conflicts, and a login without a mailroom role cannot
-- name it. Runs as the migrating role, which owns the table or is a member of mailroom_owner.

ALTER TABLE mailroom.migration_lock OWNER TO mailroom_owner;
REVOKE ALL ON mailroom.migration_lock FROM public;

COMMENT ON TABLE mailroom.migration_lock IS
'No rows. db migrate holds it in SHARE UPDATE EXCLUSIVE mode while it runs: one migrate at a time; only mailroom_owner can lock it.';
