"""The foundation's SQL functions the driver calls (mailroom.db.contract): the error vocabulary, settings,
the clock, who listens (08_notify.sql), partitions and the last maintenance, queue health and worker heartbeats (sql/00_clock.sql,
01_settings.sql, 04_error_codes.sql, 05_partitions.sql, 06_queue_health.sql), erasure (07_erasure.sql), and the keyring
(15_keyring.sql: read by `db migrate`, db/keyring.py and `mailroom keys`)."""

from __future__ import annotations

from mailroom.db.contract import SqlFunction

error_codes = SqlFunction("error_codes", returns=("code", "kind", "meaning", "smtp_reply", "http_status"))
# the edge's refusals (sql/04_edge.sql): raised with their code, asked once per process (mailroom.api.edge)
edge_refusal = SqlFunction("edge_refusal", "p_refusal text, p_bound bigint = default")

setting = SqlFunction("setting", "p_name text", returns="text")
interval_setting = SqlFunction("interval_setting", "p_name text", returns="interval")
set_setting = SqlFunction("set_setting", "p_name text, p_value text", returns="text")

clock = SqlFunction("clock", returns="timestamptz")

# who listens (sql/08_notify.sql): the Listener registers after LISTEN, then waits out earlier writers
listen = SqlFunction("listen", "p_channels text[]")
unlisten = SqlFunction("unlisten")
await_writers = SqlFunction("await_writers", "p_timeout interval = default", returns="boolean")
pin_clock = SqlFunction("pin_clock", "p_at timestamptz, p_local boolean = default", returns="timestamptz")

queue_health = SqlFunction("queue_health", returns=("queue", "due", "oldest_due_age_seconds", "expired_leases"))
worker_health = SqlFunction("worker_health", returns=(
    "worker", "kind", "host", "listening", "heartbeat_age_seconds", "listener_age_seconds",
    "last_claim_age_seconds", "claimed", "started_at", "state", "stopped_at", "metrics_address", "serves",
))
worker_heartbeat = SqlFunction(
    "worker_heartbeat",
    "p_worker text, p_kind text, p_listening boolean, p_claimed integer = default, p_metrics_address text = default,"
    " p_serves text = default",
)

list_migrations = SqlFunction("list_migrations", returns=("version", "name", "sha256", "applied_at"))
# the one-time steps an upgrade leaves (sql/04_schema_version.sql): `db migrate` prints them
upgrade_steps = SqlFunction("upgrade_steps", "p_key_fingerprint text = default", returns=("step", "command", "reason"))
worker_stopped = SqlFunction("worker_stopped", "p_worker text, p_claimed integer = default", returns="boolean")
list_worker_kinds = SqlFunction("list_worker_kinds", returns=("kind", "command", "description"))

list_settings = SqlFunction("list_settings", returns=("name", "value", "kind", "min_value", "max_value", "description"))
job_runs = SqlFunction("job_runs", returns=("job", "last_run_at", "age_seconds", "last_summary", "runs"))
partition_status = SqlFunction("partition_status", returns=(
    "table_name", "partitions", "oldest_from", "newest_to", "ahead_seconds", "default_rows_estimate",
))

# the DKIM keys (sql/30_outbound_dkim.sql; public halves only): `mailroom outbound dkim list` and the doctor
list_dkim_keys = SqlFunction("list_dkim_keys", returns=(
    "domain", "selector", "algorithm", "public_key", "dns_name", "dns_value", "created_at",
))

erase_address = SqlFunction("erase_address", "p_address text, p_dry_run boolean = default", returns=("item", "affected"))

# moving from the original mailroom (sql/16_import.sql): `mailroom db import-seed`, one batch a call (admin)
import_seed_accounts = SqlFunction(
    "import_seed_accounts", "p_accounts jsonb, p_tokens jsonb, p_dispatched_up_to bigint", returns=("item", "affected"),
)

# the keyring (sql/15_keyring.sql): `mailroom keys …` (accounts/cli.py) and `db migrate`'s key import, mailroom_admin
rotate_signing_key = SqlFunction("rotate_signing_key", returns="integer")
retire_signing_key = SqlFunction("retire_signing_key", "p_id integer")
export_signing_key = SqlFunction("export_signing_key", "p_id integer = default", returns="bytea")
import_signing_key = SqlFunction("import_signing_key", "p_key bytea, p_active boolean = default", returns="integer")
# MAILROOM_SECRET_KEY at the start of collect and send (db/keyring.py): by its fingerprint
signing_key_state_of = SqlFunction("signing_key_state_of", "p_fingerprint text", returns="mailroom.signing_key_state")
list_signing_keys = SqlFunction(
    "list_signing_keys",
    returns=("id", "state", "origin", "fingerprint", "created_at", "state_changed_at", "last_exported_at"),
)
