"""Test harness: a throwaway cluster per run, migrated databases, pg_prove, pytest.

    python -m mailroom.testing pgtap [FILE ...]   pgTAP files (default tests/pgtap/*.sql)
    python -m mailroom.testing used               `db verify` on a used database (the demo and a data generator)
    python -m mailroom.testing all [PYTEST ARGS]  pg_prove on one cluster and pytest (one worker per core,
                                                  each with a cluster of its own) side by side,
                                                  then `db verify` on a used database
        --fast-paths-off-pass   then tests/http, tests/mcp and tests/outbound again with MAILROOM_FAST_PATHS=off
    python -m mailroom.testing snapshot           rewrite tests/db/schema.snapshot from a fresh migrate

pytest reuses the cluster named by MAILROOM_TEST_CLUSTER_HOME when set (see tests/conftest.py).
`PgBouncer` puts a real PgBouncer in transaction mode in front of a test cluster.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from mailroom.core.errors import UserError
from mailroom.core.fastpaths import ENV as FAST_PATHS_ENV
from mailroom.db import cluster as embedded
from mailroom.db.connect import connect
from mailroom.db.files import checkout_root
from mailroom.db.migrate import migrate

CLUSTER_ENV = "MAILROOM_TEST_CLUSTER_HOME"

# `all --fast-paths-off-pass`: the suites run a second time on the public paths (MAILROOM_FAST_PATHS=off),
# as psycopg runs its suite on both of its implementations (docs/architecture.md, Private internals)
FAST_PATHS_OFF_FLAG = "--fast-paths-off-pass"
FAST_PATHS_OFF_SUITES = ("tests/http", "tests/mcp", "tests/outbound")
# ...but for the page driven in Chromium (tests/http/test_browser*.py): what it renders and runs is the
# same on both paths (the API answers it reads are the REST suite's, compared path by path by
# tests/http/test_http_fast_paths.py), and a browser costs the second pass about 40 s of CI's budget
FAST_PATHS_OFF_IGNORE = ("--ignore-glob=tests/http/test_browser*.py",)


def start_cluster(prefix: str = "mailroom-test-") -> embedded.Cluster:
    """A new cluster in a fresh temporary directory, tuned for tests (no fsync)."""
    home = Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("MAILROOM_TEST_TMP", "/tmp")))
    return embedded.up(home, fast=True)


def stop_cluster(cluster: embedded.Cluster) -> None:
    cluster.destroy(embedded.find_bindir(), embedded.RunAs.detect())


def create_database(cluster: embedded.Cluster, name: str, *, template: str | None = None) -> str:
    with connect(cluster.url("postgres")) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            # FILE_COPY, not PostgreSQL 15's default WAL_LOG: a test cluster has no fsync, so its two
            # checkpoints are cheap, and the clone's pages never pass through shared buffers, which the
            # DROP at the test's end would then scan out (measured on 2 loaded cores, 12 MB template:
            # create 0.48 s + drop 0.04 s against 0.56 s + 0.09 s, over 30 clones of each)
            stmt += sql.SQL(" TEMPLATE {} STRATEGY FILE_COPY").format(sql.Identifier(template))
        conn.execute(stmt)
    return cluster.url(name)


def drop_database(cluster: embedded.Cluster, name: str) -> None:
    with connect(cluster.url("postgres")) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# Login roles the drivers use in tests: never the superuser. Each is granted the group role of
# its job, and mailroom_timekeeper, because tests pin the clock (`mr_app_nopin` is not: it proves a
# runtime role cannot move time).
TEST_LOGINS: dict[str, tuple[str, ...]] = {
    "mr_app": ("mailroom_app", "mailroom_timekeeper"),
    "mr_collector": ("mailroom_collector", "mailroom_timekeeper"),
    "mr_sender": ("mailroom_sender", "mailroom_timekeeper"),
    "mr_inbound": ("mailroom_inbound", "mailroom_timekeeper"),
    "mr_monitor": ("mailroom_monitor", "mailroom_timekeeper"),
    "mr_admin": ("mailroom_admin", "mailroom_timekeeper"),
    # `mailroom run` starts the inbox server, the collector, the sender (and the HTTP face) with one URL
    "mr_worker": ("mailroom_collector", "mailroom_sender", "mailroom_inbound", "mailroom_http", "mailroom_timekeeper"),
    "mr_app_nopin": ("mailroom_app",),
    "mr_http": ("mailroom_http", "mailroom_timekeeper"),
}


def ensure_test_logins(url: str) -> None:
    """Create the TEST_LOGINS (cluster-wide, idempotent) with their group roles."""
    with connect(url) as conn:
        for login, groups in TEST_LOGINS.items():
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
            for group in groups:
                conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(group), sql.Identifier(login)))


def login_for(args: tuple[str, ...] | list[str]) -> str | None:
    """The test login a `mailroom …` command runs as; None: as given (db, demo, doctor: admin's tools)."""
    if not args:
        return None
    command, sub = args[0], (args[1] if len(args) > 1 else "")
    if command == "collect":
        return "mr_collector"
    if command == "send":
        return "mr_sender"
    if command == "expire" or (command == "inbox" and sub == "serve"):
        return "mr_inbound"
    if command == "inbox":
        return "mr_app"
    if command == "account":  # the application's calls; list and show read every address (admin)
        return "mr_admin" if sub in ("list", "show") else "mr_app"
    if command == "outbound":
        return "mr_monitor" if sub in ("status", "list", "queue") else "mr_admin"
    if command == "status":
        return "mr_monitor"
    if command == "plans":
        return "mr_app"
    if command == "settings":
        return "mr_admin" if sub == "set" else "mr_monitor"
    if command in ("suppress", "keys", "erase", "webhook"):
        return "mr_admin"
    if command in ("maintain", "apikey", "smtpcred", "catchall"):
        return "mr_admin"
    if command in ("http", "mcp"):
        return "mr_http"
    if command == "run":
        return "mr_worker"
    return None


def as_login(url: str, login: str | None) -> str:
    """`url` with another user (the cluster trusts its socket; the test pooler lists TEST_LOGINS)."""
    return url if login is None else make_conninfo(url, user=login)


def driver_env(env: dict[str, str], args: tuple[str, ...] | list[str]) -> dict[str, str]:
    """MAILROOM_DATABASE_URL / MAILROOM_LISTEN_URL of a command's environment, as its test login; the
    run's MAILROOM_FAST_PATHS (the `--fast-paths-off-pass`) reaches the command unless `env` sets it."""
    login = login_for(args)
    out = dict(env)
    if FAST_PATHS_ENV in os.environ:
        out.setdefault(FAST_PATHS_ENV, os.environ[FAST_PATHS_ENV])
    for key in ("MAILROOM_DATABASE_URL", "MAILROOM_LISTEN_URL"):
        if out.get(key) and out[key].strip().lower() not in ("none", "off"):
            out[key] = as_login(out[key], login)
    return out


def migrated_database(cluster: embedded.Cluster, name: str, *, pgtap: bool = False) -> str:
    url = create_database(cluster, name)
    migrate(url)
    ensure_test_logins(url)
    if pgtap:
        with connect(url) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pgtap")
    return url


def start_citus(workers: int = 2, prefix: str = "mailroom-citus-", *, fast: bool = True):
    """A coordinator and `workers` workers in a fresh temporary directory (mailroom.db.citus), tuned for
    tests (fast: no fsync), or durable like the bench cluster (fast=False)."""
    from mailroom.db import citus

    home = Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("MAILROOM_TEST_TMP", "/tmp")))
    port = _free_port_run(workers + 1)
    return citus.up(home, workers, port=port, fast=fast)


def stop_citus(topology) -> None:
    from mailroom.db import citus

    citus.destroy(topology)


def citus_database(topology, name: str) -> str:
    """A database on every node of the topology, migrated through the coordinator (distributed), with TEST_LOGINS."""
    from mailroom.db import citus

    citus.drop_database(topology, name)
    citus.ensure_database(topology, name)
    url = topology.url(name)
    migrate(url)
    ensure_test_logins(url)
    return url


def _free_port_run(count: int) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1 (each node's socket is named by its port)."""
    for _ in range(50):
        first = _free_port()
        if first + count < 65535 and all(_port_is_free(first + i) for i in range(count)):
            return first
    raise UserError("no run of free ports for a Citus topology")


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pg_prove_argv(cluster: embedded.Cluster, dbname: str, files: list[str]) -> list[str]:
    exe = shutil.which("pg_prove")
    if exe is None:
        raise UserError("pg_prove not found: apt-get install libtap-parser-sourcehandler-pgtap-perl postgresql-15-pgtap")
    return [exe, "--ext", ".sql", "-h", str(cluster.home), "-p", str(cluster.port), "-U", "postgres", "-d", dbname, *files]


def pg_prove(cluster: embedded.Cluster, dbname: str, files: list[str]) -> int:
    return subprocess.call(pg_prove_argv(cluster, dbname, files))


def _pgtap_files(args: list[str]) -> list[str]:
    if args:
        return args
    root = checkout_root()
    if root is None:
        raise UserError("the pgTAP suite is part of a mailroom checkout (tests/pgtap), not of the package")
    # tests/pgtap_sessions: files that drive a second session through dblink (it commits); tests/pgtap_fresh:
    # files that change the schema or its statistics to test a plan or partition maintenance (DDL, ANALYZE).
    # Both run here on the throwaway cluster only, never shipped, never run by `db verify`
    return [str(p) for folder in ("pgtap", "pgtap_sessions", "pgtap_fresh")
            for p in sorted((root / "tests" / folder).glob("*.sql"))]


FRESH_FOLDER = "pgtap_fresh"


def _pgtap_runs(cluster: embedded.Cluster, files: list[str]) -> list[tuple[str, list[str]]]:
    """(database, files) for pg_prove: every file on mailroom_pgtap (migrated already), but each file of
    tests/pgtap_fresh on a clone of its own, made before any file runs: a plan test reads the tables'
    physical state (pages, dead rows, estimates), which another file's rolled-back rows and ANALYZE change."""
    fresh = [f for f in files if Path(f).parent.name == FRESH_FOLDER]
    shared = [f for f in files if f not in fresh]
    runs = [("mailroom_pgtap", shared)] if shared else []
    for f in fresh:
        name = f"mailroom_pgtap_{Path(f).stem}"
        create_database(cluster, name, template="mailroom_pgtap")
        runs.append((name, [f]))
    return runs


def _prove_runs(cluster: embedded.Cluster, runs: list[tuple[str, list[str]]], out: TextIO | None = None,
                current: list[subprocess.Popen] | None = None) -> int:
    """pg_prove once a run, one after the other; the first failure's exit code. `current` holds the running one."""
    rc = 0
    for dbname, files in runs:
        proc = subprocess.Popen(pg_prove_argv(cluster, dbname, files), stdout=out,
                                stderr=subprocess.STDOUT if out is not None else None, stdin=subprocess.DEVNULL)
        if current is not None:
            current[:] = [proc]
        rc = rc or proc.wait()
    return rc


def run_pgtap(cluster: embedded.Cluster, files: list[str]) -> int:
    files = _pgtap_files(files)
    if not files:
        print("no pgTAP files", file=sys.stderr)
        return 0
    migrated_database(cluster, "mailroom_pgtap", pgtap=True)
    return _prove_runs(cluster, _pgtap_runs(cluster, files))


# ----------------------------------------------------------------------------- the suite on a used database
# Issue 47: the pgTAP suite must pass on an installation that has been used, not only on a fresh one.
# `used_database` builds one as a DBA's would look: `mailroom demo` ran against it, 200 accounts and 50
# inboxes were made, then USED_INSTALLATION_SQL (accounts in every status, inboxes open, due and expired,
# messages, outbound rows in every status, suppressions, keys rotated, settings changed). A few seconds.
USED_INSTALLATION_SQL = """\
-- settings changed
SELECT mailroom.set_setting(p_name => s.name, p_value => s.value) FROM (VALUES
    ('collector.link_base_url', 'https://used.example'), ('outbound.max_attempts', '7'),
    ('tokens.ttl', '30 minutes'), ('collector.priority', '3'), ('outbound.lease', '2 minutes'),
    ('inbox.retention_grace', '3 days'), ('outbound.backoff_base', '2 minutes'),
    ('outbound.retention', '10 days'), ('recovery.daily_cap', '4'), ('http.anonymous_plan', 'pro')
) AS s (name, value);
-- accounts in every status, tokens dispatched and not, a recovery requested
SELECT mailroom.create_account(p_email => format('gen%s@used.example', g), p_login => format('gen%s', g))
FROM generate_series(1, 30) AS g;
SELECT count(*) FROM mailroom.dequeue_tokens(p_limit => 10);
UPDATE mailroom.accounts SET status = 'active' WHERE email LIKE 'gen1_@used.example';
SELECT mailroom.suspend_account(p_account => a.id) FROM mailroom.accounts AS a WHERE a.email LIKE 'gen2_@used.example';
SELECT mailroom.request_password_recovery(p_email => 'gen11@used.example');
-- keys rotated
SELECT mailroom.rotate_signing_key();
SELECT mailroom.rotate_signing_key();
-- inboxes: open anonymous, owned by an API key, a catch-all; with messages; expired ones
SELECT mailroom.create_mailbox() FROM generate_series(1, 10);
SELECT mailroom.create_mailbox(p_owner_type => 'api', p_owner_id => 'gen-owner') FROM generate_series(1, 10);
SELECT mailroom.create_api_key(p_owner_id => 'gen-owner', p_key_digest => sha256('gen-key'::bytea), p_label => 'gen');
SELECT mailroom.set_catchall_domain(p_domain => 'catch.used.example', p_owner_id => 'gen-owner');
SELECT mailroom.deliver_message(
    p_address => m.address, p_raw => convert_to('Subject: hello ' || g || E'\\r\\n\\r\\nbody ' || g, 'UTF8'),
    p_envelope_from => 'someone@elsewhere.example', p_subject => 'hello ' || g, p_from_header => 'someone@elsewhere.example',
    p_text_body => 'body ' || g || ' https://used.example/activate?x=1 code 12345'
)
FROM mailroom.mailboxes AS m, generate_series(1, 3) AS g WHERE m.is_active AND m.owner_id = 'gen-owner';
UPDATE mailroom.mailboxes SET expires_at = now() - interval '1 hour'
WHERE id IN (SELECT id FROM mailroom.mailboxes WHERE is_active ORDER BY id LIMIT 8);
SELECT mailroom.expire_mailboxes(p_batch => 4);  -- four expired, four still due
-- outbound rows in every status
SELECT mailroom.upsert_sender(
    p_name => 'gen-sender', p_from_address => 'noreply@used.example', p_host => '127.0.0.1', p_port => 2525
);
SELECT mailroom.set_domain_limit(p_pattern => 'used.example', p_max_in_flight => 5, p_max_per_minute => 100);
SELECT mailroom.enqueue_message(
    p_sender => 'gen-sender', p_to => ARRAY[format('rcpt%s@used.example', g)], p_subject => 'gen ' || g, p_text_body => 'hello'
)
FROM generate_series(1, 20) AS g;
CREATE TEMP TABLE gen_claim ON COMMIT DROP AS
SELECT c.id, c.claim_token, row_number() OVER (ORDER BY c.id) AS n
FROM mailroom.claim_messages(p_limit => 8, p_worker => 'gen-worker') AS c;
SELECT count(*) FROM mailroom.finalize_messages(
    p_ids => (SELECT array_agg(id ORDER BY n) FROM gen_claim WHERE n <= 6),
    p_claim_tokens => (SELECT array_agg(claim_token ORDER BY n) FROM gen_claim WHERE n <= 6),
    p_outcomes => (SELECT array_agg(CASE WHEN n <= 2 THEN 'sent' ELSE 'reply' END ORDER BY n) FROM gen_claim WHERE n <= 6),
    p_smtp_codes => (
        SELECT array_agg(CASE WHEN n <= 2 THEN 250 WHEN n <= 4 THEN 550 ELSE 451 END ORDER BY n) FROM gen_claim WHERE n <= 6
    )
);
SELECT count(*) FROM mailroom.hold_messages(p_ids => ARRAY(
    SELECT id FROM mailroom.outbound_messages WHERE status = 'queued' AND subject LIKE 'gen %' ORDER BY id LIMIT 3));
SELECT count(*) FROM mailroom.cancel_messages(p_ids => ARRAY(
    SELECT id FROM mailroom.outbound_messages WHERE status = 'queued' AND subject LIKE 'gen %' ORDER BY id LIMIT 2));
-- suppressions
SELECT mailroom.suppress(p_address => format('blocked%s@used.example', g), p_reason => 'manual') FROM generate_series(1, 5) AS g;
SELECT mailroom.worker_heartbeat(p_worker => 'gen-host:1', p_kind => 'sender', p_listening => true, p_claimed => 2);
"""

def used_database(cluster: embedded.Cluster, name: str = "mailroom_used") -> str:
    """A migrated database with pgtap that the demo and the data generator have used (a few seconds)."""
    url = migrated_database(cluster, name, pgtap=True)
    env = dict(os.environ, MAILROOM_DATABASE_URL=url)
    proc = subprocess.run([sys.executable, "-m", "mailroom", "demo", "--pace", "0"], env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise UserError(f"the demo failed on {name}: {proc.stderr[-2000:]}")
    with connect(url) as conn:
        for i in range(200):
            conn.execute("SELECT mailroom.create_account(p_email => %s, p_login => %s)", (f"dba{i}@example.org", f"dba{i}"))
        for _ in range(50):
            conn.execute("SELECT mailroom.create_mailbox()")
        conn.execute(USED_INSTALLATION_SQL)
    return url


def run_used_pgtap(cluster: embedded.Cluster) -> int:
    """`db verify` on a used database; fails when a file fails or any table's checksum changed."""
    from mailroom.db import verify

    url = used_database(cluster)
    with connect(url) as conn:
        before = verify.checksums(conn)
    rc = verify.verify(url)  # every file; those marked `not on a live database yet` are skipped, named
    with connect(url) as conn:
        after = verify.checksums(conn)
    changed = sorted(t for t in before.keys() | after.keys() if before.get(t) != after.get(t))
    if changed:
        print(f"# the suite changed these tables: {', '.join(changed)}", flush=True)
        return 1
    print(f"# every table's checksum unchanged ({len(before)} tables)", flush=True)
    return rc


PGBOUNCER_PATHS = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def find_pgbouncer() -> str:
    """The pgbouncer binary (PATH, then the Debian location), or UserError naming the package."""
    found = shutil.which("pgbouncer") or next((p for p in PGBOUNCER_PATHS if os.access(p, os.X_OK)), None)
    if found is None:
        raise UserError("pgbouncer not found: apt-get install pgbouncer (1.18 or newer)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgBouncer:
    """A real PgBouncer in transaction mode in front of a test cluster, as a child process.

    Everything lives in its own temporary directory (config, auth file, unix socket, log). A
    wildcard database entry sends every database name to the cluster's unix socket, so a test
    database created after start is reachable at once. Clients connect over TCP on 127.0.0.1
    (`pooled_url`), like workers on other hosts. The pools are small (`pool_size` server
    connections per database and user) and clients many (`max_client_conn`), and each pool
    keeps all its server connections open and hands them out in turn (min_pool_size,
    server_round_robin), so consecutive transactions of even a lone client land on different
    server connections: what session state or a server-side prepared statement would not survive. auth_type is trust
    (the cluster trusts its socket too); PgBouncer still admits only users listed in the auth
    file: `pooled_url` adds the URL's user. As root it runs as the cluster's OS user (`-u`).
    """

    def __init__(self, cluster: embedded.Cluster, *, pool_size: int = 3, max_client_conn: int = 200,
                 users: tuple[str, ...] = (embedded.SUPERUSER, *TEST_LOGINS), rotate: bool = True) -> None:
        self.cluster = cluster
        self.rotate = rotate  # False: PgBouncer's defaults (last used server first, pools grow on demand)
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.users = list(users)
        self.run_as = embedded.RunAs.detect()
        self.home = Path(tempfile.mkdtemp(prefix="mailroom-pgbouncer-", dir=os.environ.get("MAILROOM_TEST_TMP", "/tmp")))
        self.config_file = self.home / "pgbouncer.ini"
        self.auth_file = self.home / "userlist.txt"
        self.logfile = self.home / "pgbouncer.log"
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def config(self) -> str:
        """The pgbouncer.ini this instance runs with (docs/deployment.md shows the same settings)."""
        return f"""\
[databases]
* = host={self.cluster.home} port={self.cluster.port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir = {self.home}
auth_type = trust
auth_file = {self.auth_file}
admin_users = {embedded.SUPERUSER}
pool_mode = transaction
default_pool_size = {self.pool_size}
min_pool_size = {self.pool_size if self.rotate else 0}
server_round_robin = {1 if self.rotate else 0}
max_client_conn = {self.max_client_conn}
server_login_retry = 1
autodb_idle_timeout = 30
ignore_startup_parameters = extra_float_digits
logfile = {self.logfile}
log_connections = 0
log_disconnections = 0
"""

    def _write_auth_file(self) -> None:
        self.auth_file.write_text("".join(f'"{user}" ""\n' for user in self.users))
        self._own(self.auth_file)

    def _own(self, path: Path) -> None:
        if self.run_as.name is not None:
            os.chown(path, self.run_as.uid, self.run_as.gid)

    def start(self, timeout: float = 15.0) -> PgBouncer:
        exe = find_pgbouncer()
        self._own(self.home)
        for _attempt in range(3):  # the free port can be taken between probe and bind: pick another
            self.port = _free_port()
            self.config_file.write_text(self.config())
            self._own(self.config_file)
            self._write_auth_file()
            argv = [exe, *(["-u", self.run_as.name] if self.run_as.name else []), str(self.config_file)]
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, cwd=str(self.home))
            if self._wait_ready(timeout):
                return self
            self.stop(remove=False)
        raise UserError(f"pgbouncer did not start (log: {self.logfile})")

    def _wait_ready(self, timeout: float) -> bool:
        """Until a query through the pooler reaches the cluster (or the process exits)."""
        deadline = time.monotonic() + timeout
        url = self.pooled_url(self.cluster.url("postgres"))
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return True
            except psycopg.Error:
                time.sleep(0.05)
        return False

    def pooled_url(self, url: str) -> str:
        """The same database and user as `url`, through this pooler (TCP 127.0.0.1, no password)."""
        params = conninfo_to_dict(url)
        for key in ("host", "hostaddr", "port", "passfile", "password"):
            params.pop(key, None)
        user = str(params.get("user") or embedded.SUPERUSER)
        if user not in self.users:
            self.allow(user)
        return make_conninfo("", **params, host="127.0.0.1", port=str(self.port))

    def fill(self, url: str) -> None:
        """Open every server connection of `url`'s pool now: `pool_size` clients hold a transaction at once.

        (min_pool_size fills a new pool only bit by bit; until it is full a lone client keeps
        landing on the same server connection.)"""
        pooled = self.pooled_url(url)
        clients = [psycopg.connect(pooled, connect_timeout=5) for _ in range(self.pool_size)]
        try:
            for client in clients:
                client.execute("SELECT 1")  # non-autocommit: each now holds a server connection
            for client in clients:
                client.rollback()  # (a client leaving inside a transaction would take its server along)
        finally:
            for client in clients:
                client.close()

    def admin_url(self) -> str:
        """The admin console (SHOW POOLS, SHOW SERVERS …; simple queries only)."""
        return make_conninfo(host="127.0.0.1", port=str(self.port), dbname="pgbouncer", user=embedded.SUPERUSER)

    def admin(self, command: str) -> list[tuple]:
        """One admin-console command (`SHOW POOLS`, `RELOAD`); its rows."""
        with psycopg.connect(self.admin_url(), autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(command)
            return cur.fetchall() if cur.description else []

    def allow(self, user: str) -> None:
        """Admit another login role (auth file + RELOAD)."""
        self.users.append(user)
        self._write_auth_file()
        if self.proc is not None and self.proc.poll() is None:
            self.admin("RELOAD")

    def log(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, *, remove: bool = True) -> None:
        """SIGINT (safe shutdown), then SIGTERM, then SIGKILL; remove the directory."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            for sig, wait in ((signal.SIGINT, 5), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                proc.send_signal(sig)
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if remove:
            shutil.rmtree(self.home, ignore_errors=True)


SNAPSHOT = Path("tests") / "db" / "schema.snapshot"
SNAPSHOT_COMMAND = "make snapshot"


def fresh_snapshot(cluster: embedded.Cluster, name: str = "mailroom_snapshot") -> str:
    """The schema snapshot (mailroom.db.snapshot) of a database migrated from nothing."""
    from mailroom.db import snapshot

    url = create_database(cluster, name)
    try:
        migrate(url)
        with connect(url) as conn:
            return snapshot.take(conn)
    finally:
        drop_database(cluster, name)


def write_snapshot(cluster: embedded.Cluster) -> Path:
    root = checkout_root()
    if root is None:
        raise UserError("the schema snapshot lives in a mailroom checkout (tests/db/schema.snapshot)")
    path = root / SNAPSHOT
    path.write_text(fresh_snapshot(cluster))
    return path


@contextlib.contextmanager
def phase(name: str, out: TextIO | None = None) -> Iterator[None]:
    """Time one phase of a run: `== phase NAME: 12.3 s` on stderr when it ends (failed or not), the
    line .ci/run's phases print too, so a CI log shows where its minutes went."""
    started = time.monotonic()
    try:
        yield
    finally:
        print(f"== phase {name}: {time.monotonic() - started:.1f} s", file=out or sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("pgtap", "used", "all", "snapshot"):
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    with phase("cluster start"):
        cluster = start_cluster()
    try:
        if command == "snapshot":
            print(f"wrote {write_snapshot(cluster)}", file=sys.stderr)
            return 0
        if command == "pgtap":
            with phase("pgTAP"):
                return run_pgtap(cluster, rest)
        if command == "used":
            with phase("pgTAP on a used database"):
                return run_used_pgtap(cluster)
        off_pass = FAST_PATHS_OFF_FLAG in rest
        rest = [a for a in rest if a != FAST_PATHS_OFF_FLAG]
        args, parallel = pytest_args(rest)
        env = dict(os.environ)
        if parallel:
            # each xdist worker starts its own cluster (roles are cluster-wide: two workers
            # migrating templates in one cluster would race to create them), so pg_prove runs on this
            # one alongside pytest, not before it: its single backend fills the CPU pytest's workers
            # leave idle while they wait on servers, subprocesses and sleeps
            rc = _pgtap_alongside_pytest(cluster, args, env)
            with phase("pgTAP on a used database"):  # the suite again, as db verify on a used database (issue 47)
                rc = run_used_pgtap(cluster) or rc
        else:
            with phase("pgTAP"):
                rc = run_pgtap(cluster, [])
            env[CLUSTER_ENV] = str(cluster.home)
            with phase("pgTAP on a used database"):  # the suite again, as db verify on a used database (issue 47)
                rc = run_used_pgtap(cluster) or rc
            with phase("pytest"):
                pytest_rc = subprocess.call([sys.executable, "-m", "pytest", *args], env=env)
            rc = rc or pytest_rc
        if off_pass:
            # the suites whole, spread as the first run was (its other arguments chose files or tests)
            off_args = (["-n", "auto", "--dist", "loadfile"] if parallel else ["-p", "no:xdist"]) \
                + list(FAST_PATHS_OFF_SUITES) + list(FAST_PATHS_OFF_IGNORE)
            with phase(f"pytest {' '.join(FAST_PATHS_OFF_SUITES)} with {FAST_PATHS_ENV}=off"):
                off_rc = subprocess.call([sys.executable, "-m", "pytest", *off_args], env={**env, FAST_PATHS_ENV: "off"})
            rc = rc or off_rc
        return rc
    finally:
        if cluster.is_running():
            stop_cluster(cluster)


def _pgtap_alongside_pytest(cluster: embedded.Cluster, args: list[str], env: dict[str, str]) -> int:
    """pg_prove (its report kept in a file, printed once pytest is done: the two never interleave)
    while pytest runs; the exit code is the first failure's."""
    files = _pgtap_files([])
    with phase("pgTAP database"):
        migrated_database(cluster, "mailroom_pgtap", pgtap=True)
        runs = _pgtap_runs(cluster, files)
    with tempfile.TemporaryFile("w+") as report:
        started = time.monotonic()
        current: list[subprocess.Popen] = []
        ended: list[float] = []  # when pg_prove ended (a thread runs it: pytest holds this one)
        rcs: list[int] = []
        waiter = threading.Thread(
            target=lambda: (rcs.append(_prove_runs(cluster, runs, report, current)), ended.append(time.monotonic())),
            daemon=True)
        waiter.start()
        try:
            with phase("pytest (pgTAP alongside)"):
                pytest_rc = subprocess.call([sys.executable, "-m", "pytest", *args], env=env)
            waiter.join()
            rc = rcs[0] if rcs else 1
        finally:
            if waiter.is_alive():
                for proc in current:
                    proc.kill()
                    proc.wait()
        report.seek(0)
        print("== pgTAP (pg_prove, run alongside pytest)", flush=True)
        sys.stdout.write(report.read())
        sys.stdout.flush()
        print(f"== phase pgTAP: {ended[0] - started:.1f} s (alongside pytest)", file=sys.stderr, flush=True)
    return rc or pytest_rc


def pytest_args(rest: list[str]) -> tuple[list[str], bool]:
    """pytest's arguments for `all`: on a machine with more than one core, the files spread over
    one pytest-xdist worker per core (`--dist loadfile`: a module's fixtures, such as a Citus
    topology, are made once), unless the caller chose (-n, -p no:xdist); whether it is parallel."""
    chose = any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in rest)
    # the slowest tests and fixtures, named in every run's log (where pytest's minutes go)
    durations = [] if any(a.startswith("--durations") for a in rest) else ["--durations=30"]
    if chose or (os.cpu_count() or 1) < 2 or importlib.util.find_spec("xdist") is None:
        return [*durations, *rest], False
    return ["-n", "auto", "--dist", "loadfile", *durations, *rest], True


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as exc:
        print(f"mailroom: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
