"""Reference SMTP peers for the benchmarks: Postfix's smtp-source/smtp-sink and a bare aiosmtpd.

- smtp_source(): Postfix's C load generator (one process, N sessions), timed from start to exit; what
  it sends is counted by its peer (the database for mailroom). smtp-source(1): `-d` is "don't
  disconnect after sending a message; send the next message over the same connection", so
  reuse=True (`-d`) keeps each session open for all its messages, reuse=False (no `-d`) opens a new
  session (connect, banner, EHLO ... QUIT) per message. Checked: 20 messages over 2 sessions are
  2 TCP connections with -d and 20 without.
- SmtpSink: Postfix's smtp-sink (accepts and discards); run as `nobody` when we are root.
- BareSmtpd: an aiosmtpd server in its own process whose handler stores nothing (`python -m
  bench.smtp_tools bare PORT`), the reference ceiling of an aiosmtpd-based server.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def find(tool: str) -> str | None:
    return shutil.which(tool) or next((p for p in (f"/usr/sbin/{tool}", f"/usr/lib/postfix/sbin/{tool}")
                                       if os.access(p, os.X_OK)), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


def wait_unix(path: Path, proc: subprocess.Popen | None = None, timeout: float = 20) -> None:
    """Until a server accepts connections on the unix socket `path` (or its process exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server on {path} exited with {proc.returncode}")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {path}")


def smtp_source(port: int, sessions: int, messages: int, size: int, mail_from: str, rcpt: str,
                reuse: bool = True) -> float:
    """Seconds smtp-source took to send `messages`: reuse=True passes -d (each session keeps its
    connection for all its messages), reuse=False a new connection per message."""
    exe = find("smtp-source")
    if exe is None:
        raise RuntimeError("smtp-source not found (Debian package postfix; see the Makefile's APT_PACKAGES)")
    argv = [exe, *(["-d"] if reuse else []), "-s", str(sessions), "-m", str(messages), "-l", str(size),
            "-f", mail_from, "-t", rcpt, f"127.0.0.1:{port}"]
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"smtp-source failed: {(out.stderr or out.stdout).strip()[-200:]}")
    return elapsed


class SmtpSink:
    """Postfix's smtp-sink on a free port (a C server that discards every message)."""

    def __init__(self) -> None:
        exe = find("smtp-sink")
        if exe is None:
            raise RuntimeError("smtp-sink not found (Debian package postfix; see the Makefile's APT_PACKAGES)")
        self.port = free_port()
        argv = [exe, *(["-u", "nobody"] if os.geteuid() == 0 else []), f"127.0.0.1:{self.port}", "1000"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.proc)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class BareSmtpd(SmtpSink):
    """An aiosmtpd server that stores nothing, in its own process (same settings as the inbox server)."""

    def __init__(self) -> None:  # noqa: D107 - no super(): a different process
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.smtp_tools", "bare", str(self.port)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.proc)


class _Discard:
    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd hook name
        return "250 2.0.0 OK"


def _serve_bare(port: int) -> None:
    from aiosmtpd.smtp import SMTP

    async def main() -> None:
        loop = asyncio.get_running_loop()
        handler = _Discard()
        server = await loop.create_server(
            lambda: SMTP(handler, decode_data=False, enable_SMTPUTF8=True, hostname="bench", loop=loop),
            host="127.0.0.1", port=port)
        async with server:
            await server.serve_forever()

    import logging

    logging.getLogger("mail.log").setLevel(logging.WARNING)
    asyncio.run(main())


if __name__ == "__main__":
    if sys.argv[1:2] == ["bare"]:
        _serve_bare(int(sys.argv[2]))
