"""Helpers of the checks' tests, and the real spamd the browser test (tests/http/test_browser.py) reuses."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def assert_shape(doc: dict, model: Any) -> None:
    """The answer has exactly its model's keys (mailroom.http.models) and validates against it."""
    assert set(doc) == {f.alias or name for name, f in model.model_fields.items()}, (set(doc), model.__name__)
    model.model_validate(doc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"PING SPAMC/1.5\r\n\r\n")
            return b"PONG" in s.recv(100)
    except OSError:
        return False


@contextmanager
def running_spamd(home: Path) -> Iterator[str]:
    """A real spamd (Debian's spamassassin, its shipped rules) on a free 127.0.0.1 port: host:port.
    Network tests off (--local), no user configuration, no rule update; stopped by its pid.
    Not installed: a skip (a failure under CI, where `make deps` installs it)."""
    binary = shutil.which("spamd") or ("/usr/sbin/spamd" if Path("/usr/sbin/spamd").exists() else None)
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("spamd is not installed (make deps installs Debian's spamd)")
        pytest.skip("spamd is not installed (apt-get install spamassassin spamd)")
    port = _free_port()
    log = open(home / "spamd.log", "w")  # noqa: SIM115 - the child writes to it
    proc = subprocess.Popen(
        [binary, "--listen", f"127.0.0.1:{port}", "--allowed-ips", "127.0.0.1", "--local", "--nouser-config",
         "--max-children", "1", "--min-children", "1", "--pidfile", str(home / "spamd.pid"), "--syslog", "stderr"],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL,
    )
    log.close()
    try:
        deadline = time.monotonic() + 30
        while not _pong(port):
            assert proc.poll() is None, (home / "spamd.log").read_text()
            assert time.monotonic() < deadline, "spamd did not answer PING within 30 s:\n" + (home / "spamd.log").read_text()
            time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
