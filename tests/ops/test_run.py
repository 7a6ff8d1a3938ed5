"""`mailroom run` and the logins of its workers (issue 23, item 3): it names the role a login lacks
before starting anything, and each worker may have a URL, and so a login, of its own."""

from __future__ import annotations

import signal
import socket
import time

import psycopg

from mailroom import testing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_as_a_login_without_the_worker_roles_says_which_role(cli, db_url):
    result = cli("run", "--database-url", testing.as_login(db_url, "mr_admin"), timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("mailroom: error: inbox needs a login granted mailroom_inbound, and mr_admin is "
                                    "not: GRANT mailroom_inbound TO mr_admin, or give --inbox-url a login that is")
    assert result.stderr.count("\n") == 1 and "migrated" not in result.stderr


def test_run_with_a_url_per_worker(cli_popen, conn, db_url):
    urls = {"inbox": "mr_inbound", "collect": "mr_collector", "send": "mr_sender", "expire": "mr_inbound",
            "maintain": "mr_inbound"}
    args = [a for worker, login in urls.items() for a in (f"--{worker}-url", testing.as_login(db_url, login))]
    proc = cli_popen("run", *args, "--inbox-port", str(free_port()),
                     env={"MAILROOM_DATABASE_URL": testing.as_login(db_url, "mr_app_nopin")})  # used by none of them
    try:
        seen = ""
        deadline = time.monotonic() + 60
        while "running: inbox" not in seen and time.monotonic() < deadline and proc.poll() is None:
            seen += proc.stderr.readline().decode()
        assert "running: inbox" in seen, seen
        logins = dict(conn.execute(
            "SELECT application_name, usename FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name IN ('mailroom-collect', 'mailroom-send-0', 'mailroom-inbox', 'mailroom-expire',"
            " 'mailroom-maintain')").fetchall())
        assert logins == {"mailroom-collect": "mr_collector", "mailroom-send-0": "mr_sender",
                          "mailroom-inbox": "mr_inbound", "mailroom-expire": "mr_inbound",
                          "mailroom-maintain": "mr_inbound"}, logins
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    rest = proc.stderr.read().decode()
    with psycopg.connect(db_url, autocommit=True) as c:
        states = {kind: state for kind, state in c.execute("SELECT kind, state FROM mailroom.worker_health()")}
    assert states == {"collector": "stopped", "sender": "stopped", "inbound": "stopped", "expiry": "stopped",
                      "maintenance": "stopped"}, (states, seen, rest)


def test_run_never_says_running_when_a_child_cannot_serve(cli, db_url):
    """The inbound server cannot bind its port: `run` says why and never that it is running (issue 23)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = cli("run", "--inbox-port", str(port), "--no-collect", "--no-send", "--no-expire", "--no-maintain",
                     timeout=60)
    assert result.returncode == 1, result.stderr
    assert "cannot listen on 127.0.0.1" in result.stderr
    assert "mailroom: error: inbox exited with code 1 before it was ready" in result.stderr
    assert "running:" not in result.stderr
