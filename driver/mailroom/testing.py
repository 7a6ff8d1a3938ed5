"""Test harness: a throwaway cluster per run, migrated databases, pg_prove, pytest.

    python -m mailroom.testing pgtap [FILE ...]   pgTAP files (default tests/pgtap/*.sql)
    python -m mailroom.testing all [PYTEST ARGS]  pg_prove on one cluster, then pytest (one worker per core)
    python -m mailroom.testing snapshot           rewrite tests/db/schema.snapshot from a fresh migrate

pytest reuses the cluster named by MAILROOM_TEST_CLUSTER_HOME when set (see tests/conftest.py).
`PgBouncer` puts a real PgBouncer in transaction mode in front of a test cluster.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from mailroom.core.errors import UserError
from mailroom.db import cluster as embedded
from mailroom.db.connect import connect
from mailroom.db.files import checkout_root
from mailroom.db.migrate import migrate

CLUSTER_ENV = "MAILROOM_TEST_CLUSTER_HOME"


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
            stmt += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
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
    if command in ("suppress", "keys", "erase"):
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
    """MAILROOM_DATABASE_URL / MAILROOM_LISTEN_URL of a command's environment, as its test login."""
    login = login_for(args)
    out = dict(env)
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


def pg_prove(cluster: embedded.Cluster, dbname: str, files: list[str]) -> int:
    exe = shutil.which("pg_prove")
    if exe is None:
        raise UserError("pg_prove not found: apt-get install libtap-parser-sourcehandler-pgtap-perl postgresql-15-pgtap")
    argv = [exe, "--ext", ".sql", "-h", str(cluster.home), "-p", str(cluster.port), "-U", "postgres", "-d", dbname, *files]
    return subprocess.call(argv)


def _pgtap_files(args: list[str]) -> list[str]:
    if args:
        return args
    root = checkout_root()
    if root is None:
        raise UserError("the pgTAP suite is part of a mailroom checkout (tests/pgtap), not of the package")
    return [str(p) for p in sorted((root / "tests" / "pgtap").glob("*.sql"))]


def run_pgtap(cluster: embedded.Cluster, files: list[str]) -> int:
    files = _pgtap_files(files)
    if not files:
        print("no pgTAP files", file=sys.stderr)
        return 0
    migrated_database(cluster, "mailroom_pgtap", pgtap=True)
    return pg_prove(cluster, "mailroom_pgtap", files)


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


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("pgtap", "all", "snapshot"):
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    cluster = start_cluster()
    try:
        if command == "snapshot":
            print(f"wrote {write_snapshot(cluster)}", file=sys.stderr)
            return 0
        if command == "pgtap":
            return run_pgtap(cluster, rest)
        rc = run_pgtap(cluster, [])
        args, parallel = pytest_args(rest)
        env = dict(os.environ)
        if parallel:
            # each xdist worker starts its own cluster (roles are cluster-wide: two workers
            # migrating templates in one cluster would race to create them)
            stop_cluster(cluster)
        else:
            env[CLUSTER_ENV] = str(cluster.home)
        pytest_rc = subprocess.call([sys.executable, "-m", "pytest", *args], env=env)
        return rc or pytest_rc
    finally:
        if cluster.is_running():
            stop_cluster(cluster)


def pytest_args(rest: list[str]) -> tuple[list[str], bool]:
    """pytest's arguments for `all`: on a machine with more than one core, the files spread over
    one pytest-xdist worker per core (`--dist loadfile`: a module's fixtures, such as a Citus
    topology, are made once), unless the caller chose (-n, -p no:xdist); whether it is parallel."""
    chose = any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in rest)
    if chose or (os.cpu_count() or 1) < 2 or importlib.util.find_spec("xdist") is None:
        return list(rest), False
    return ["-n", "auto", "--dist", "loadfile", *rest], True


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as exc:
        print(f"mailroom: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
