"""`mailroom db …` as an operator runs it: a private cluster, started as an unprivileged user."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from mailroom.db import cluster as embedded


def mailroom(*args: str, home: Path, env: dict[str, str] | None = None, timeout: float = 120):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    full_env["MAILROOM_DATA_DIR"] = str(home)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "mailroom", *args], env=full_env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def home():
    # a directory the unprivileged server user can reach (pytest's tmp_path is root-only)
    path = Path(tempfile.mkdtemp(prefix="mr-cli-", dir="/tmp"))
    yield path
    cluster = embedded.Cluster(path)
    if cluster.pid() is not None:
        cluster.stop(embedded.find_bindir(), embedded.RunAs.detect(), mode="immediate")
    shutil.rmtree(path, ignore_errors=True)


def psql(url: str, query: str) -> subprocess.CompletedProcess:
    return subprocess.run(["psql", url, "-XAtc", query], capture_output=True, text=True, timeout=30)


def assert_one_line_error(proc: subprocess.CompletedProcess, fragment: str, code: int = 1) -> None:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("mailroom: error: "), proc.stderr
    assert fragment in lines[-1], lines[-1]


def test_up_twice_url_status_down(home):
    first = mailroom("db", "up", home=home)
    assert first.returncode == 0, first.stderr
    assert "started cluster" in first.stderr
    url = first.stdout.strip()
    second = mailroom("db", "up", home=home)
    assert second.returncode == 0, second.stderr
    assert "reusing running cluster" in second.stderr
    assert "migrations applied: 0" in second.stderr
    assert second.stdout.strip() == url

    printed = mailroom("db", "url", home=home).stdout.strip()
    assert printed == url
    out = psql(printed, "SELECT count(*) FROM mailroom.schema_migrations WHERE version = 1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"

    # the server runs as an unprivileged user and listens on no TCP port
    pid = embedded.Cluster(home).pid()
    assert pid is not None
    assert os.stat(f"/proc/{pid}").st_uid != 0
    assert psql(url, "SHOW listen_addresses").stdout.strip() == ""

    status = mailroom("db", "status", home=home)
    assert status.returncode == 0, status.stderr
    assert "state:    running" in status.stdout
    assert "pending:  none" in status.stdout

    down = mailroom("db", "down", home=home)
    assert down.returncode == 0
    assert "stopped cluster" in down.stderr
    assert embedded.Cluster(home).pid() is None
    stopped = mailroom("db", "status", home=home)
    assert stopped.returncode == 1
    assert "state:    stopped" in stopped.stdout


def test_up_with_other_settings_while_running_says_so(home):
    assert mailroom("db", "up", home=home).returncode == 0
    other_port = mailroom("db", "up", "--port", "5999", home=home)
    assert_one_line_error(other_port, "already runs on port 5432; `mailroom db down` first")
    tcp = mailroom("db", "up", "--tcp", home=home)
    assert_one_line_error(tcp, "runs without TCP")
    assert mailroom("db", "up", "--port", "5432", home=home).returncode == 0


def test_stale_pid_file_after_crash_is_handled(home):
    assert mailroom("db", "up", home=home).returncode == 0
    cluster = embedded.Cluster(home)
    pid = cluster.pid()
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    assert (cluster.pgdata / "postmaster.pid").exists(), "a crash leaves the pid file behind"
    again = mailroom("db", "up", home=home)
    assert again.returncode == 0, again.stderr
    assert "started cluster" in again.stderr
    assert psql(again.stdout.strip(), "SELECT 1").stdout.strip() == "1"


def test_tcp_when_asked_and_port_in_use(home, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = mailroom("db", "up", "--tcp", "--port", str(port), home=home)
        assert_one_line_error(proc, f"127.0.0.1:{port} is in use")
    up = mailroom("db", "up", "--tcp", "--port", str(port), home=home)
    assert up.returncode == 0, up.stderr
    tcp_url = mailroom("db", "url", "--tcp", home=home).stdout.strip()
    assert "127.0.0.1" in tcp_url and "password" not in tcp_url
    assert psql(tcp_url, "SELECT 2").stdout.strip() == "2"


def test_database_url_is_honoured(pg, template_db, tmp_path):
    url = pg.url(template_db)
    up = mailroom("db", "up", home=tmp_path / "unused", env={"MAILROOM_DATABASE_URL": url})
    assert up.returncode == 0, up.stderr
    assert "migrating only" in up.stderr
    assert not (tmp_path / "unused").exists(), "no embedded cluster is created"
    status = mailroom("db", "status", home=tmp_path / "unused", env={"MAILROOM_DATABASE_URL": url})
    assert status.returncode == 0
    assert "database: MAILROOM_DATABASE_URL" in status.stdout


def test_unreachable_database_url(tmp_path):
    proc = mailroom("db", "status", home=tmp_path, env={"MAILROOM_DATABASE_URL": f"host={tmp_path} port=1 dbname=x"})
    assert_one_line_error(proc, "cannot connect to the database")


def test_no_binaries_names_the_package(tmp_path):
    proc = mailroom("db", "up", home=tmp_path / "mr", env={"MAILROOM_PG_BINDIR": str(tmp_path)})
    assert_one_line_error(proc, "apt-get install postgresql-15")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create a directory owned by another user")
def test_data_directory_owned_by_someone_else(tmp_path):
    home = tmp_path / "foreign"
    (home / "pgdata").mkdir(parents=True)
    os.chown(home, 65534, 65534)
    os.chown(home / "pgdata", 65534, 65534)
    proc = mailroom("db", "up", home=home)
    assert_one_line_error(proc, "is owned by nobody")


def test_commands_without_a_database_say_what_to_do(tmp_path):
    proc = mailroom("db", "migrate", home=tmp_path / "none")
    assert_one_line_error(proc, "run `mailroom db up`")
