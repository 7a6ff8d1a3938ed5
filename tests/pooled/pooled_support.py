"""Helpers of the pooled tests: which URL each driver gets, and PgBouncer facts.

Every driver in tests/pooled gets its URLs from `worker_urls`: the database URL through the
pooler and, for LISTEN, the direct URL. Switching the drivers to least-privilege login roles is
a change of `as_login` only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from mailroom import testing
from mailroom.testing import PgBouncer

POOLER_SELFTEST_WARNING = "the self-test NOTIFY did not come back (a transaction pooler cannot carry LISTEN"


@dataclass(frozen=True)
class WorkerUrls:
    database: str  # through PgBouncer (transaction mode)
    listen: str  # direct to PostgreSQL


def as_login(url: str, role: str) -> str:
    """The URL a driver of `role` (collector, sender, inbound, app, monitor, admin) connects with."""
    return url


def worker_urls(pooler: PgBouncer, db_url: str, role: str) -> WorkerUrls:
    direct = as_login(db_url, role)
    pooler.fill(direct)  # every server connection open: the driver's transactions rotate over them
    return WorkerUrls(database=pooler.pooled_url(direct), listen=direct)


def server_backends(conn: psycopg.Connection, application_name: str) -> int:
    """Server connections of the test database whose application_name starts with the given one."""
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE %s",
        (application_name + "%",),
    ).fetchone()[0]


class Worker:
    """A `python -m mailroom …` subprocess whose stderr is collected (wait_stderr) as it runs."""

    def __init__(self, args: list[str], env: dict[str, str], *, stdout: int | None = subprocess.DEVNULL) -> None:
        merged = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
        merged.update(PYTHONUNBUFFERED="1", **env)
        self.args = args
        self.proc = subprocess.Popen([sys.executable, "-m", "mailroom", *args], env=testing.driver_env(merged, args),
                                     stdout=stdout,
                                     stderr=subprocess.PIPE, text=True)
        self._lines: list[str] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()

    def stderr(self) -> str:
        with self._cond:
            return "".join(self._lines)

    def wait_stderr(self, needle: str, timeout: float = 15, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while "".join(self._lines).count(needle) < count:
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and left < timeout - 1):
                    raise AssertionError(f"{needle!r} not seen {count}x on stderr of {self.args[0]} "
                                         f"(exit {self.proc.poll()}):\n{''.join(self._lines)}")
                self._cond.wait(min(left, 0.1))

    def stop(self, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def wait_until(predicate: Callable[[], object], timeout: float = 20, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
