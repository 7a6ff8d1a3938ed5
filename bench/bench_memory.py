"""Resident memory of `mailroom run` (issue 37, item 8): every worker process, idle.

`mailroom run` (inbound SMTP on a free port, the collector, the sender, the expiry worker, partition
maintenance and, with --http-port, the HTTP face) is started on the bench database; once it says
"running" (every child serves) and 3 s more, the VmRSS of each process of its tree is read
(bench.memory: /proc/<pid>/status), one row per worker and one for the whole tree. The same workers
under load are in the inboxes (`mailroom inbox serve`) and outbound (`mailroom send`) areas, next to
Postfix's processes measured the same way in the same run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench import memory, smtp_tools

AREA = "memory"


def _row(benchmark: str, value: float, unit: str, note: str = "") -> dict:
    return {"area": AREA, "benchmark": benchmark, "value": value, "unit": unit, "note": note}


def run_idle(url: str, settle: float = 3.0, timeout: float = 90) -> dict[int, tuple[str, int]]:
    """The `mailroom run` tree's {pid: (name, VmRSS KiB)}, `settle` s after it said "running"."""
    log_path = Path(tempfile.mkstemp(prefix="bench-run-", suffix=".log")[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAILROOM_RUN_", "MAILROOM_SEND_"))}
    env |= {"MAILROOM_DATABASE_URL": url, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "mailroom", "run", "--inbox-port", str(smtp_tools.free_port()),
            "--http-port", str(smtp_tools.free_port())]
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while "running:" not in log_path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mailroom run did not start: {log_path.read_text(errors='replace')[-300:]}")
            time.sleep(0.1)
        time.sleep(settle)
        if proc.poll() is not None:
            raise RuntimeError(f"mailroom run exited: {log_path.read_text(errors='replace')[-300:]}")
        return memory.tree(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log_path.unlink(missing_ok=True)


def run(url: str, quick: bool, progress: Callable[[str], None]) -> list[dict]:
    progress("mailroom run (every worker, --http-port too): idle resident memory")
    procs = run_idle(url)
    rows = [_row("memory: mailroom run, whole tree, idle", memory.total_mib(procs), "MiB",
                 f"VmRSS summed over the supervisor and its workers, 3 s after `running`: {memory.summary(procs)}")]
    for name, (count, total, top, anon) in sorted(memory.by_name(procs).items()):
        rows.append(_row(f"memory: {name}{' (the supervisor)' if name == 'mailroom run' else ''}, idle",
                         total / 1024, "MiB", f"VmRSS; {count} process(es), largest {top / 1024:.1f} MiB, "
                         f"RssAnon {anon / 1024:.1f} MiB; under `mailroom run`, idle; the loaded figures are "
                         "in the inboxes and outbound areas"))
    for row in rows:
        progress(f"{row['benchmark']}: {row['value']:.1f} MiB")
    return rows
