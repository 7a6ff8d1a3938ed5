"""A burst of clients (docs/reliability.md, "Load held": 1,000 SMTP sessions at once): the inbound server
queues 1,024 connections before it accepts them (asyncio's default of 100 lost the handshakes of a
burst past it: those clients hung up to two minutes without a greeting), and every mailroom command
starts with its soft limit of open files raised to the hard one (cli.main: a service's usual soft limit
of 1,024 would refuse the sockets past it with EMFILE)."""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import time
from pathlib import Path

import pytest


def _open_files(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no Max open files line")


def _backlog(port: int) -> int:
    """The listening socket's backlog (ss: Send-Q of a LISTEN socket)."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return int(out.split()[2])


def test_an_inbound_server_takes_a_burst_of_clients(cli_popen, tmp_path: Path) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 2048 or shutil.which("ss") is None:
        pytest.skip(f"hard limit of open files {hard}, or no ss(8)")

    def low_soft_limit() -> None:  # as a service manager starts it (systemd: 1,024 soft)
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    log = tmp_path / "inbox.log"
    with open(log, "w") as out:
        proc = cli_popen("inbox", "serve", "--port", "0", stderr=out, stdout=out, preexec_fn=low_soft_limit)
    try:
        deadline = time.monotonic() + 60  # a bound on a hung start, not a timing figure
        while not (found := re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert _open_files(proc.pid) == (hard, hard)
        somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
        assert _backlog(int(found.group(1))) == min(1024, somaxconn)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
