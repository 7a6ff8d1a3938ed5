-- mailroom:as-migrator
-- Keys, tokens, codes and SMTP passwords reach the server only as bind parameters, never in
-- statement text. A server that logs statements (log_statement = all, log_min_duration_statement
-- >= 0) also logs bind parameters unless log_parameter_max_length is 0: set it for this database.
-- Setting it needs a superuser or `GRANT SET ON PARAMETER log_parameter_max_length` (PostgreSQL
-- 15); without that the migration says so and goes on, and `mailroom doctor` reports whether the
-- server's logging would write parameters (docs/security.md).

DO $log$
BEGIN
    EXECUTE format('ALTER DATABASE %I SET log_parameter_max_length = 0', current_database());
    EXECUTE format('ALTER DATABASE %I SET log_parameter_max_length_on_error = 0', current_database());
EXCEPTION
    WHEN insufficient_privilege THEN
        RAISE NOTICE USING
            MESSAGE = 'mailroom: could not set log_parameter_max_length = 0 for this database',
            HINT = 'A superuser runs: ALTER DATABASE ' || quote_ident(current_database())
            || ' SET log_parameter_max_length = 0 (or sets it in postgresql.conf); mailroom doctor checks it.';
END;
$log$;
