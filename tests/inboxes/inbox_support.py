"""Helpers shared by the inbox tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# the Received: header inbound SMTP writes in front of every message it stores (sql/21_delivery.sql,
# _received_header; tests/inboxes/test_received.py holds its every part)
RECEIVED = re.compile(rb"\AReceived: from [^\r\n]*\r\n\tby [^\r\n]* \(mailroom\) with [^\r\n]*\r\n\t[^\r\n]*\r\n")


def as_sent(raw: bytes) -> bytes:
    """A message stored over SMTP without the one Received: header mailroom put in front: the
    client's bytes (the assertion fails when that header is missing)."""
    match = RECEIVED.match(raw)
    assert match, f"no Received: header of mailroom's on top: {raw[:300]!r}"
    return raw[match.end():]


@dataclass
class Mailbox:
    id: int
    address: str
    expires_at: object
    token: str | None


@dataclass
class InboxServer:
    host: str
    port: int
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)


def wait_for_log(path: Path, pattern: str, proc: subprocess.Popen, timeout: float = 15) -> re.Match:
    deadline = time.monotonic() + timeout
    rx = re.compile(pattern)
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        match = rx.search(text)
        if match:
            return match
        if proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode}: {text}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {pattern!r} in: {path.read_text() if path.exists() else ''}")
