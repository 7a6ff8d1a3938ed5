"""Helpers for the collector tests: run `mailroom collect` as a real subprocess and read its output."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from mailroom import testing

KEY_HEX = "cafebabe" * 8
KEY = bytes.fromhex(KEY_HEX)  # made the keyring's active key (use_known_key) so tests can check the HMAC
APP_NAME = "mailroom-collect"
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Record:
    action: str  # "1" activation, "2" password recovery (article codes)
    email: str
    login: str
    signed: str
    code: str


def parse_csv_line(line: str) -> list[Record]:
    fields = line.rstrip("\n").split(",")
    assert len(fields) % 5 == 0, f"a csv batch line has a multiple of 5 fields: {line!r}"
    return [Record(*fields[i : i + 5]) for i in range(0, len(fields), 5)]


def b64url_decode(text: str) -> bytes:
    assert "=" not in text, "signed value is unpadded"
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify_signed(record: Record, key: bytes = KEY) -> bytes:
    """Independent check of the signed value (the article's layout); returns the secret."""
    raw = b64url_decode(record.signed)
    assert len(raw) == 64, f"secret(32) + hmac(32), got {len(raw)} bytes"
    secret, mac = raw[:32], raw[32:]
    if record.action == "1":
        data = b"/activate" + secret
    elif record.action == "2":
        assert len(record.code) == 5 and record.code.isdigit()
        data = b"/recover" + secret + record.code.encode()
    else:
        raise AssertionError(f"unknown action {record.action!r}")
    expected = hmac.new(key, data, hashlib.sha256).digest()
    assert hmac.compare_digest(mac, expected), f"HMAC mismatch for {record.login}"
    return secret


def use_known_key(url: str) -> None:
    """Make KEY the keyring's active signing key (as the owner would import one), so a test can check
    the signed values independently. The collector itself is given no key."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT mailroom.import_signing_key(%s, true)", (KEY,))


def wait_committed(conn: psycopg.Connection, logins: list[str], action: str | None = None, timeout: float = 10) -> None:
    """Wait until the collector's batches with these logins' tokens committed: a line is written
    before its batch commits, and its link works (its secret's digest is stored) from the commit on.
    A connection killed between the write and the COMMIT makes the collector write that batch again
    with new links, so a test that kills one waits for this first."""
    deadline = time.monotonic() + timeout
    while conn.execute(
        "SELECT count(*) FROM mailroom.accounts AS a WHERE a.login = ANY(%s) AND NOT coalesce(("
        " SELECT t.secret_digest IS NOT NULL FROM mailroom.tokens AS t"
        " WHERE t.account = a.id AND t.action::text = coalesce(%s, t.action::text) ORDER BY t.id DESC LIMIT 1), false)",
        (logins, action),
    ).fetchone()[0]:
        assert time.monotonic() < deadline, "the batch did not commit"
        time.sleep(0.02)


class Collector:
    """A running `python -m mailroom collect` with its stdout lines and stderr lines collected."""

    def __init__(self, url: str, *args: str, env: dict[str, str] | None = None, pump_stdout: bool = True) -> None:
        use_known_key(url)
        merged = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
        merged.update(
            PYTHONUNBUFFERED="1",
            MAILROOM_DATABASE_URL=url,
            MAILROOM_BATCH_LIMIT="10",
            MAILROOM_BATCH_TIMEOUT="200ms",
        )
        merged.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mailroom", "collect", *args],
            env=testing.driver_env(merged, ["collect"]),  # as mr_collector, never the superuser
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        self._stderr_cond = threading.Condition()
        if pump_stdout:
            self.start_pump()
        threading.Thread(target=self._pump_stderr, daemon=True).start()

    def start_pump(self) -> None:
        """Start reading stdout (tests that want the collector blocked on a full pipe start late)."""
        threading.Thread(target=self._pump_stdout, daemon=True).start()

    def _pump_stdout(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                self.lines.put(line)
        except (ValueError, OSError):
            pass  # the test closed its end on purpose

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._stderr_cond:
                self.stderr.append(line)
                self._stderr_cond.notify_all()

    def stderr_text(self) -> str:
        with self._stderr_cond:
            return "".join(self.stderr)

    def wait_stderr(self, needle: str, timeout: float = 10, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        with self._stderr_cond:
            while "".join(self.stderr).count(needle) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{needle!r} not seen {count}x on stderr:\n{''.join(self.stderr)}")
                self._stderr_cond.wait(min(left, 0.1))

    def read_line(self, timeout: float = 10) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output line within {timeout}s; stderr:\n{self.stderr_text()}") from None

    def records(self, n: int, timeout: float = 10) -> list[Record]:
        """Read csv batch lines until at least n records arrived."""
        out: list[Record] = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            out += parse_csv_line(self.read_line(max(deadline - time.monotonic(), 0.01)))
        return out

    def assert_quiet(self, seconds: float) -> None:
        try:
            line = self.lines.get(timeout=seconds)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected output line: {line!r}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def create_accounts(conn: psycopg.Connection, prefix: str, n: int) -> list[str]:
    """n accounts, one autocommit statement each; returns their logins."""
    logins = [f"{prefix}{i}" for i in range(n)]
    for login in logins:
        conn.execute("SELECT mailroom.create_account(%s, %s)", (f"{login}@example.test", login))
    return logins


def bulk_accounts_sql(prefix: str, n: int) -> str:
    return (
        "SELECT mailroom.create_account(%(p)s || g || '@example.test', %(p)s || g)"
        f" FROM generate_series(0, {int(n) - 1}) AS g"
    ).replace("%(p)s", f"'{prefix}'")


def assert_exactly_once(records: list[Record], logins: list[str]) -> None:
    seen = [r.login for r in records]
    assert len(seen) == len(set(seen)), f"duplicates: {len(seen) - len(set(seen))}"
    lost, extra = set(logins) - set(seen), set(seen) - set(logins)
    assert not lost and not extra, f"lost {len(lost)}: {sorted(lost)[:5]}, extra {len(extra)}: {sorted(extra)[:5]}"
    for r in records:
        verify_signed(r)
