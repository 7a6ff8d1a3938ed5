"""Helpers shared by the inbox tests (imported by conftest.py and the test modules)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


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
