-- Foundation: the mailroom schema, pgcrypto, the migrations ledger and settings.
-- Applied once by `mailroom db migrate` (or by hand through `mailroom db migrate --print`).

CREATE SCHEMA IF NOT EXISTS mailroom;

CREATE EXTENSION IF NOT EXISTS pgcrypto WITH SCHEMA public;

CREATE TABLE IF NOT EXISTS mailroom.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    sha256 text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE mailroom.schema_migrations IS
'Applied migrations: version, file name, sha256 of the file, when.';

CREATE TABLE mailroom.settings (
    name text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$'),
    value text NOT NULL,
    description text NOT NULL DEFAULT ''
);

COMMENT ON TABLE mailroom.settings IS
'Runtime configuration of business rules (TTLs, limits, retry policy). '
'Never holds keys: signing and encryption keys are passed in by callers.';
