"""Failure paths that answer fast (issue 23, item 5; issue 34, item 2): PostgreSQL stopped and started
again under every worker and the HTTP face, and every worker started while it is down.

Each worker (collect --enqueue, send, inbox serve, expire, maintain --every) runs as its own login on
a cluster of this test's own. While the server is down: a RCPT answers 451 within a few seconds from
the first session on, every worker says once that the database is unreachable (not once per retry or
per second), and no worker exits. Once it is back: every worker says once that it recovered, mail
flows again end to end, and SIGTERM ends each with exit 0, listed as stopped. The HTTP face answers
503 with Retry-After and its JSON error within a few seconds while the server is down (never 500),
and 200 again within seconds of its return. `mailroom run` started
while the database is down says "running" only once every child is ready, and Ctrl-C ends all with 0.
"""

from __future__ import annotations

import os
import signal
import smtplib
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from mailroom import testing
from mailroom.db import cluster as embedded
from mailroom.db.migrate import migrate

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

WORKERS = {
    "collect": ["collect", "--enqueue", "--batch-timeout", "100ms", "--poll-interval", "500ms"],
    "send": ["send", "--poll-interval", "200ms", "--smtp-timeout", "5s", "--shutdown-grace", "1s"],
    "inbox": ["inbox", "serve", "--db-timeout", "2s"],
    "expire": ["expire", "--interval", "1s"],
    "maintain": ["maintain", "--every", "2s"],
}
KINDS = {"collect": "collector", "send": "sender", "inbox": "inbound", "expire": "expiry", "maintain": "maintenance"}
HTTP_ARGS = ["http", "serve", "--pool-size", "4"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """A `python -m mailroom …` subprocess as its test login, with its stderr lines collected."""

    def __init__(self, name: str, args: list[str], url: str, env: dict[str, str] | None = None) -> None:
        merged = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
        merged.update(PYTHONUNBUFFERED="1", MAILROOM_DATABASE_URL=url, **(env or {}))
        login_args = ["maintain"] if name == "maintain" else args
        env_for = testing.driver_env(merged, login_args)
        if name == "maintain":  # the maintenance worker runs as the inbound login (maintain_partitions, heartbeat)
            env_for["MAILROOM_DATABASE_URL"] = testing.as_login(url, "mr_inbound")
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-m", "mailroom", *args], env=env_for, cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)

    def count(self, needle: str) -> int:
        with self._cond:
            return sum(needle in line for line in self.lines)

    def wait_for(self, needle: str, timeout: float = 30.0, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while sum(needle in line for line in self.lines) < count:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"{self.name}: no {needle!r} in:\n{self.text_unlocked()}")
                self._cond.wait(min(left, 0.5))

    def text_unlocked(self) -> str:
        return "\n".join(self.lines)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _setup(url: str, inbox_port: int) -> None:
    migrate(url)
    testing.ensure_test_logins(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT mailroom.upsert_sender('mailroom', 'noreply@mailroom.test', '127.0.0.1', %s)",
                     (inbox_port,))


def _workers_by_state(url: str) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return {kind: state for kind, state in conn.execute("SELECT kind, state FROM mailroom.worker_health()")}


def _wait_until(what: str, probe, timeout: float = 30.0):  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _rcpt(port: int, address: str) -> tuple[int, float]:
    started = time.monotonic()
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as smtp:
        smtp.ehlo("test.localhost")
        smtp.mail("someone@example.net")
        code, _ = smtp.rcpt(address)
    return code, time.monotonic() - started


def _start_all(url: str, inbox_port: int, http_port: int | None = None) -> dict[str, Worker]:
    env: dict[str, str] = {}
    workers = {}
    for name, args in WORKERS.items():
        extra = ["--port", str(inbox_port)] if name == "inbox" else []
        workers[name] = Worker(name, [*args, *extra], url, env)
    if http_port is not None:
        workers["http"] = Worker("http", [*HTTP_ARGS, "--port", str(http_port)], url, env)
        workers["http"].wait_for("serving (pid", timeout=30)
    return workers


def http(port: int, method: str, path: str, body: bytes | None = None, timeout: float = 30,  # noqa: ANN201
         token: str | None = None):
    """(status, headers, JSON body or None, seconds) of one request to the HTTP face."""
    import json
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method, headers=headers)
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - 127.0.0.1
            status, headers, raw = resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as err:
        status, headers, raw = err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()
    seconds = time.monotonic() - started
    try:
        doc = json.loads(raw) if raw else None
    except ValueError:
        doc = None
    return status, headers, doc, seconds


def assert_http_unavailable(port: int, method: str, path: str, body: bytes | None = None,
                            token: str | None = None) -> None:
    """The HTTP face while the database is down: 503, Retry-After and the JSON error, within 5 s."""
    status, headers, doc, seconds = http(port, method, path, body, token=token)
    assert status == 503, (method, path, status, doc)
    assert seconds < 5, (method, path, seconds)
    assert headers.get("retry-after", "").isdigit(), headers
    assert doc is not None and doc["error"]["kind"] == "unavailable", doc


def wait_http_ok(port: int, path: str, token: str | None = None, timeout: float = 30) -> float:
    """Seconds until GET `path` answers 200."""
    started = time.monotonic()
    last = None
    while time.monotonic() - started < timeout:
        last = http(port, "GET", path, token=token)
        if last[0] == 200:
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"GET {path} did not answer 200 within {timeout}s: last {last and last[:3]}")


def test_postgres_stopped_and_started_under_every_worker(private_cluster):
    url = private_cluster.url()
    bindir, run_as = embedded.find_bindir(), embedded.RunAs.detect()
    inbox_port, http_port = free_port(), free_port()
    _setup(url, inbox_port)
    workers = _start_all(url, inbox_port, http_port)
    try:
        _wait_until("every worker to report in", lambda: set(KINDS.values()) <= set(_workers_by_state(url))
                    and {_workers_by_state(url)[k] for k in KINDS.values()} == {"running"})
        with psycopg.connect(url, autocommit=True) as conn:
            address = conn.execute("SELECT address FROM mailroom.create_mailbox(60, 'free')").fetchone()[0]
        assert _rcpt(inbox_port, address)[0] == 250
        status, _, box, _ = http(http_port, "POST", "/api/v1/mailboxes", b"{}")
        assert status == 201, box
        box_path = f"/api/v1/mailboxes/{box['address']}/messages"
        assert http(http_port, "GET", box_path, token=box["session_token"])[0] == 200

        private_cluster.stop(bindir, run_as)  # fast shutdown: every backend is terminated
        down_at = time.monotonic()
        code, seconds = _rcpt(inbox_port, address)  # the first session after the stop
        assert code == 451 and seconds < 5, (code, seconds)
        assert _rcpt(inbox_port, address)[0] == 451
        # every route of the HTTP face: 503 within seconds, never a 500 (issue 34, item 2)
        assert_http_unavailable(http_port, "GET", box_path, token=box["session_token"])
        assert_http_unavailable(http_port, "POST", "/api/v1/mailboxes", b"{}")
        assert_http_unavailable(http_port, "GET", box_path, token=box["session_token"])
        for w in workers.values():
            w.wait_for("database unreachable (", timeout=20)  # the outage line, not a LISTEN reason
        time.sleep(max(0.0, 8 - (time.monotonic() - down_at)))  # several retries of every worker
        for w in workers.values():
            assert w.proc.poll() is None, f"{w.name} exited during the outage:\n{w.text()}"
            assert w.count("database unreachable (") == 1, f"{w.name} said it more than once:\n{w.text()}"
            warnings = [line for line in w.lines if "WARN" in line]
            assert len(warnings) <= 4, f"{w.name} kept warning:\n{w.text()}"

        private_cluster.start(bindir, run_as, fast=True)
        back = wait_http_ok(http_port, box_path, token=box["session_token"])
        assert back < 5, f"the HTTP face served again after {back:.1f}s"
        for w in workers.values():
            w.wait_for("recovered: database unreachable no more", timeout=30)
            assert w.count("recovered") == 1, w.text()
        assert _rcpt(inbox_port, address)[0] == 250
        assert "Traceback" not in workers["http"].text() and "psycopg" not in workers["http"].text(), \
            workers["http"].text()
        # mail flows again: an account's activation email is collected, sent and delivered to its inbox
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT mailroom.create_account(%s, 'after-restart')", (address,))
            _wait_until("the activation email in the inbox", lambda: conn.execute(
                "SELECT count(*) FROM mailroom.messages AS m JOIN mailroom.mailboxes AS b ON b.id = m.mailbox_id"
                " WHERE b.address = %s", (address,)).fetchone()[0] >= 1, timeout=30)
        for name, w in workers.items():
            assert w.stop() == 0, f"{name}:\n{w.text()}"
        assert {_workers_by_state(url)[k] for k in KINDS.values()} == {"stopped"}, _workers_by_state(url)
    finally:
        for w in workers.values():
            w.kill()


def test_workers_started_while_postgres_is_down_wait_for_it(private_cluster):
    url = private_cluster.url()
    bindir, run_as = embedded.find_bindir(), embedded.RunAs.detect()
    inbox_port = free_port()
    _setup(url, inbox_port)
    private_cluster.stop(bindir, run_as)
    workers = _start_all(url, inbox_port)
    try:
        for w in workers.values():
            w.wait_for("database unreachable (", timeout=20)  # the outage line, not a LISTEN reason
        time.sleep(4)
        for w in workers.values():
            assert w.proc.poll() is None, f"{w.name} exited:\n{w.text()}"
            assert w.count("database unreachable (") == 1, w.text()
        with pytest.raises(OSError):  # the inbox server listens only once it can answer
            smtplib.SMTP("127.0.0.1", inbox_port, timeout=2).close()
        private_cluster.start(bindir, run_as, fast=True)
        for w in workers.values():
            w.wait_for("recovered", timeout=30)
        _wait_until("every worker to report in", lambda: len(_workers_by_state(url)) == len(KINDS))
        for name, w in workers.items():
            assert w.stop() == 0, f"{name}:\n{w.text()}"
    finally:
        for w in workers.values():
            w.kill()


def test_run_says_running_only_when_every_child_is_ready_and_ctrl_c_exits_0(private_cluster):
    url = private_cluster.url()
    bindir, run_as = embedded.find_bindir(), embedded.RunAs.detect()
    inbox_port = free_port()
    _setup(url, inbox_port)
    private_cluster.stop(bindir, run_as)
    run = Worker("run", ["run", "--inbox-port", str(inbox_port)], url, {"MAILROOM_MAINTAIN_METRICS_PORT": "0"})
    try:
        run.wait_for("waiting for", timeout=30)  # which children it still waits for, said once
        assert run.count("running:") == 0, run.text()
        private_cluster.start(bindir, run_as, fast=True)
        run.wait_for("running: inbox (smtp 127.0.0.1:", timeout=60)
        assert _rcpt(inbox_port, "nobody@mailroom.test")[0] == 550  # listening when it says so
        assert run.stop(signal.SIGINT) == 0, run.text()  # Ctrl-C
        for child in ("inbox", "collect", "send", "expire", "maintain"):
            assert f"{child} stopped" in run.text(), run.text()
        assert "exited with code" not in run.text() and "killed by" not in run.text(), run.text()
    finally:
        run.kill()
