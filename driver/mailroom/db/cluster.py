"""The embedded PostgreSQL cluster: a private server in a directory, on a unix socket.

The home directory (default ./.mailroom) holds `pgdata/` (the cluster), the unix
socket, `postgres.log` and `cluster.json` (port, TCP). initdb and postgres refuse
to run as root, so when we are root the cluster runs as an unprivileged system
user (default `postgres`, set MAILROOM_PG_OS_USER) that owns the home directory.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from psycopg.conninfo import make_conninfo

from mailroom.core.errors import UserError

SUPERUSER = "postgres"
DEFAULT_DBNAME = "mailroom"
DEFAULT_PORT = 5432
_REQUIRED = ("initdb", "pg_ctl", "postgres")
_SOCKET_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux


def _version_key(path: str) -> tuple[int, ...]:
    nums = re.findall(r"\d+", path)
    return tuple(int(n) for n in nums) or (0,)


def _candidate_bindirs() -> list[Path]:
    """PostgreSQL bin directories in the order we try them: env, PATH, pg_config, Debian layout."""
    found: list[Path] = []
    on_path = shutil.which("pg_ctl")
    if on_path:
        found.append(Path(on_path).resolve().parent)
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                found.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    found.extend(Path(p) for p in debian)
    return found


def find_bindir() -> Path:
    """The first directory holding initdb, pg_ctl and postgres, or a clear error naming the package.

    MAILROOM_PG_BINDIR, when set, is the only place looked at.
    """
    env = os.environ.get("MAILROOM_PG_BINDIR")
    candidates = [Path(env)] if env else _candidate_bindirs()
    for candidate in candidates:
        if all((candidate / tool).is_file() and os.access(candidate / tool, os.X_OK) for tool in _REQUIRED):
            return candidate
    raise UserError(
        f"no PostgreSQL server binaries found (initdb, pg_ctl, postgres) in {', '.join(map(str, candidates)) or 'PATH'}: "
        "install them with `apt-get install postgresql-15` or set MAILROOM_PG_BINDIR"
    )


@dataclass
class RunAs:
    """The OS user the server runs as (None = the current user)."""

    name: str | None
    uid: int
    gid: int

    @classmethod
    def detect(cls) -> RunAs:
        if os.geteuid() != 0:
            return cls(None, os.geteuid(), os.getegid())
        name = os.environ.get("MAILROOM_PG_OS_USER", "postgres")
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise UserError(
                f"running as root, and the unprivileged user {name!r} to run PostgreSQL as does not exist: "
                "create it (`useradd --system postgres`) or set MAILROOM_PG_OS_USER"
            ) from None
        return cls(name, entry.pw_uid, entry.pw_gid)

    def popen_kwargs(self) -> dict:
        if self.name is None:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


class Cluster:
    """A private PostgreSQL cluster living in `home`."""

    def __init__(self, home: Path, *, port: int | None = None, tcp: bool | None = None,
                 settings: dict[str, str] | None = None) -> None:
        self.home = Path(home).expanduser().resolve()
        self.pgdata = self.home / "pgdata"
        self.logfile = self.home / "postgres.log"
        self.config_file = self.home / "cluster.json"
        saved = self._load_config()
        self.port = port if port is not None else saved.get("port", DEFAULT_PORT)
        self.tcp = tcp if tcp is not None else saved.get("tcp", False)
        # server settings of this cluster beyond the defaults (a Citus node's shared_preload_libraries, …)
        self.settings: dict[str, str] = dict(settings if settings is not None else saved.get("settings", {}))
        # the Citus workers of a coordinator (their homes; mailroom.db.citus), [] for a single node
        self.workers: list[str] = list(saved.get("workers", []))

    # -- configuration -------------------------------------------------------------------
    def _load_config(self) -> dict:
        try:
            return json.loads(self.config_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save_config(self) -> None:
        config: dict = {"port": self.port, "tcp": self.tcp}
        if self.settings:
            config["settings"] = self.settings
        if self.workers:
            config["workers"] = self.workers
        self.config_file.write_text(json.dumps(config, indent=2) + "\n")

    def url(self, dbname: str = DEFAULT_DBNAME) -> str:
        """A libpq conninfo for this cluster (unix socket; usable as `psql "$(mailroom db url)"`)."""
        return make_conninfo(host=str(self.home), port=str(self.port), user=SUPERUSER, dbname=dbname)

    def tcp_url(self, dbname: str = DEFAULT_DBNAME) -> str:
        """TCP conninfo (127.0.0.1) with the password read from a passfile, never printed."""
        return make_conninfo(
            host="127.0.0.1",
            port=str(self.port),
            user=SUPERUSER,
            dbname=dbname,
            passfile=str(self.home / "pgpass"),
        )

    # -- state ---------------------------------------------------------------------------
    def exists(self) -> bool:
        return (self.pgdata / "PG_VERSION").is_file()

    def pid(self) -> int | None:
        """The postmaster's pid if it is alive and really serves this data directory."""
        try:
            lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        if not any(b"postgres" in part or b"postmaster" in part for part in cmdline[:1]):
            return None
        return pid

    def is_running(self) -> bool:
        if self.pid() is None:
            return False
        return self._socket_path().exists()

    def _socket_path(self) -> Path:
        return self.home / f".s.PGSQL.{self.port}"

    # -- lifecycle -----------------------------------------------------------------------
    def _run(self, argv: list[str], run_as: RunAs, what: str, timeout: float = 120) -> subprocess.CompletedProcess:
        env = dict(os.environ, LC_ALL="C.UTF-8", LANG="C.UTF-8")
        env.pop("PGDATA", None)
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=env,
                cwd=str(self.home),
                **run_as.popen_kwargs(),
            )
        except subprocess.TimeoutExpired:
            raise UserError(f"{what} timed out after {timeout:.0f}s (log: {self.logfile})") from None
        except OSError as exc:
            raise UserError(f"{what} failed: {exc}") from None
        return proc

    def _check_paths(self, run_as: RunAs) -> None:
        sock = str(self._socket_path())
        if len(sock) > _SOCKET_PATH_MAX:
            raise UserError(
                f"the socket path {sock} is longer than {_SOCKET_PATH_MAX} bytes; "
                "choose a shorter --data-dir / MAILROOM_DATA_DIR"
            )
        if self.home.exists() and not self.home.is_dir():
            raise UserError(f"{self.home} exists and is not a directory")
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = self.home.stat()
        if st.st_uid != run_as.uid:
            if os.geteuid() == 0 and not self.pgdata.exists():
                os.chown(self.home, run_as.uid, run_as.gid)
                for child in self.home.iterdir():
                    os.chown(child, run_as.uid, run_as.gid)
            else:
                owner = _user_name(st.st_uid)
                expected = run_as.name or _user_name(run_as.uid)
                raise UserError(
                    f"data directory {self.home} is owned by {owner}, not {expected}: "
                    "choose another --data-dir or fix its owner"
                )
        if self.pgdata.exists() and self.pgdata.stat().st_uid != run_as.uid:
            owner = _user_name(self.pgdata.stat().st_uid)
            expected = run_as.name or _user_name(run_as.uid)
            raise UserError(f"data directory {self.pgdata} is owned by {owner}, not {expected}")
        if run_as.name is not None:
            probe = self._run(["test", "-w", str(self.home)], run_as, "access check")
            if probe.returncode != 0:
                raise UserError(
                    f"user {run_as.name} cannot reach {self.home} (a parent directory is not "
                    "searchable by it); choose a --data-dir such as /var/tmp/mailroom"
                )

    def init(self, bindir: Path, run_as: RunAs, *, fast: bool = False) -> bool:
        """initdb if needed; returns True when a new cluster was created."""
        self._check_paths(run_as)
        if self.exists():
            return False
        password = secrets.token_urlsafe(24)
        pwfile = self.home / "pwfile"
        pwfile.write_text(password + "\n")
        pgpass = self.home / "pgpass"
        pgpass.write_text(f"127.0.0.1:*:*:{SUPERUSER}:{password}\n")
        for path in (pwfile, pgpass):
            path.chmod(0o600)
            os.chown(path, run_as.uid, run_as.gid)
        argv = [
            str(bindir / "initdb"),
            "-D", str(self.pgdata),
            "-U", SUPERUSER,
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            f"--pwfile={pwfile}",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
        ]
        if fast:
            argv.append("--no-sync")
        proc = self._run(argv, run_as, "initdb")
        pwfile.unlink(missing_ok=True)
        if proc.returncode != 0:
            shutil.rmtree(self.pgdata, ignore_errors=True)
            raise UserError(f"initdb failed: {_last_line(proc.stderr or proc.stdout)}")
        if fast and (bindir.parent / "lib" / "pg_stat_statements.so").is_file():
            # test clusters count what each statement does (tests/accounts/test_recovery_work.py
            # compares two paths statement by statement, buffer by buffer); in postgresql.conf, so
            # a test that preloads another library (pg_cron) can still set its own line after it
            with (self.pgdata / "postgresql.conf").open("a") as conf:
                conf.write("\nshared_preload_libraries = 'pg_stat_statements'\n")
        if os.geteuid() == 0:
            # root's psql reads the passfile for TCP connections
            os.chown(pgpass, 0, 0)
        return True

    def _port_free(self) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", self.port))
            except OSError:
                return False
        return True

    def start(self, bindir: Path, run_as: RunAs, *, fast: bool = False) -> bool:
        """Start the server unless it already runs; returns True when it was started now."""
        if self.is_running():
            return False
        self._clear_stale_pid()
        if self.tcp and not self._port_free():
            raise UserError(f"TCP port 127.0.0.1:{self.port} is in use; choose another --port")
        sock = self._socket_path()
        if sock.exists():
            raise UserError(f"socket {sock} is in use by another server; choose another --port")
        self._save_config()
        if os.geteuid() == 0:
            os.chown(self.config_file, run_as.uid, run_as.gid)
        settings = {
            "listen_addresses": "127.0.0.1" if self.tcp else "",
            "port": str(self.port),
            "unix_socket_directories": str(self.home),
            "unix_socket_permissions": "0700",
            "max_connections": "200",
        }
        if fast:
            settings.update({"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"})
        settings.update(self.settings)
        opts = " ".join(f"-c {k}='{v}'" for k, v in settings.items())
        argv = [
            str(bindir / "pg_ctl"), "start", "-w", "-t", "60",
            "-D", str(self.pgdata), "-l", str(self.logfile), "-o", opts,
        ]
        proc = self._run(argv, run_as, "starting PostgreSQL", timeout=90)
        if proc.returncode != 0:
            raise UserError(f"PostgreSQL did not start: {self._log_reason()} (log: {self.logfile})")
        return True

    def _clear_stale_pid(self) -> None:
        pidfile = self.pgdata / "postmaster.pid"
        if pidfile.exists() and self.pid() is None:
            pidfile.unlink()
            lock = self.home / f".s.PGSQL.{self.port}.lock"
            lock.unlink(missing_ok=True)
            self._socket_path().unlink(missing_ok=True)

    def _log_reason(self) -> str:
        try:
            lines = self.logfile.read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        for line in reversed(lines):
            if "FATAL" in line or "ERROR" in line:
                return line.split("FATAL:", 1)[-1].split("ERROR:", 1)[-1].strip()
        return lines[-1].strip() if lines else "no log"

    def stop(self, bindir: Path, run_as: RunAs, *, mode: str = "fast") -> bool:
        """Stop the server; returns False when it was not running."""
        if self.pid() is None:
            self._clear_stale_pid()
            return False
        argv = [str(bindir / "pg_ctl"), "stop", "-w", "-t", "60", "-m", mode, "-D", str(self.pgdata)]
        proc = self._run(argv, run_as, "stopping PostgreSQL", timeout=90)
        if proc.returncode != 0:
            raise UserError(f"PostgreSQL did not stop: {_last_line(proc.stderr or proc.stdout)}")
        return True

    def kill(self) -> None:
        """SIGKILL the postmaster (tests of crash recovery)."""
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            for _ in range(100):
                if self.pid() is None:
                    break
                time.sleep(0.05)

    def destroy(self, bindir: Path, run_as: RunAs) -> None:
        self.stop(bindir, run_as, mode="immediate")
        shutil.rmtree(self.home, ignore_errors=True)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def ensure_database(url: str, dbname: str) -> bool:
    """CREATE DATABASE dbname if missing (connecting to `postgres`); True when created."""
    import psycopg
    from psycopg import sql

    from mailroom.db.connect import connect

    admin = make_conninfo(url, dbname="postgres")
    with connect(admin) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (dbname,)).fetchone()
        if exists:
            return False
        try:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        except psycopg.errors.DuplicateDatabase:
            return False
    return True


def up(home: Path, *, port: int | None = None, tcp: bool | None = None, fast: bool = False) -> Cluster:
    """Create (if needed) and start the cluster, and create the `mailroom` database."""
    cluster = Cluster(home, port=port, tcp=tcp)
    bindir = find_bindir()
    run_as = RunAs.detect()
    cluster.init(bindir, run_as, fast=fast)
    cluster.start(bindir, run_as, fast=fast)
    ensure_database(cluster.url(), DEFAULT_DBNAME)
    return cluster


def down(home: Path) -> bool:
    cluster = Cluster(home)
    if not cluster.exists():
        return False
    return cluster.stop(find_bindir(), RunAs.detect())
