"""Memory of `mailroom run` (issue 37, item 8; issue 46, item 5): every worker process, idle.

`mailroom run` (inbound SMTP on a free port, the collector, the sender, the expiry worker, partition
maintenance and, with --http-port, the HTTP face) is started on the bench database; once it says
"running" (every child serves) and `settle` s more (60 in the full bench, the agreed metric of
docs/architecture.md: "Memory, measured one way"; 3 with --quick), the Pss of each process of its tree
is read (bench.memory.pss_kib: /proc/<pid>/smaps_rollup) and summed, one row per worker and one for the
whole tree (its summed VmRSS, the older figure that counts shared pages once per process, in the note).
The same workers under load are in the inboxes (`mailroom inbox serve`) and outbound (`mailroom send`)
areas, next to Postfix's processes measured the same way in the same run.

On its own, on a throwaway cluster of its own (a quick look, one table per process):

    python -m bench.bench_memory [--settle 60] [--url URL] [--postfix]

--postfix measures a private idle Postfix (bench/postfix_peer.py, inbound mode) the same way.
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


def run_idle(url: str, settle: float = 3.0, timeout: float = 90,
             reader: memory.Reader = memory.pss_kib) -> tuple[memory.Procs, memory.Procs]:
    """The `mailroom run` tree `settle` s after it said "running": ({pid: (name, Pss, Anonymous KiB)},
    {pid: (name, VmRSS, RssAnon KiB)}), read at the same moment."""
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
        scan = memory.processes()
        return memory.tree(proc.pid, scan, reader), memory.tree(proc.pid, scan)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log_path.unlink(missing_ok=True)


def run(url: str, quick: bool, progress: Callable[[str], None], settle: float | None = None) -> list[dict]:
    settle = (3.0 if quick else 60.0) if settle is None else settle
    progress(f"mailroom run (every worker, --http-port too): memory {settle:g} s after `running`")
    procs, rss = run_idle(url, settle)
    rows = [_row("memory: mailroom run, whole tree, idle (PSS)", memory.total_mib(procs), "MiB",
                 f"Pss summed over the supervisor and its workers, {settle:g} s after `running` (VmRSS summed: "
                 f"{memory.total_mib(rss):.1f} MiB): {memory.summary(procs)}")]
    for name, (count, total, top, anon) in sorted(memory.by_name(procs).items()):
        rows.append(_row(f"memory: {name}{' (the supervisor)' if name == 'mailroom run' else ''}, idle (PSS)",
                         total / 1024, "MiB", f"Pss; {count} process(es), largest {top / 1024:.1f} MiB, "
                         f"Anonymous {anon / 1024:.1f} MiB; under `mailroom run`, idle; the loaded figures are "
                         "in the inboxes and outbound areas"))
    for row in rows:
        progress(f"{row['benchmark']}: {row['value']:.1f} MiB")
    return rows


def table(title: str, procs: memory.Procs) -> str:
    """One line per process (pid, command, Pss, Anonymous MiB), largest first, and the total."""
    lines = [title, f"{'pid':>8}  {'process':<44} {'Pss MiB':>8} {'Anon MiB':>9}"]
    for pid, (name, pss, anon) in sorted(procs.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"{pid:>8}  {name:<44} {pss / 1024:>8.1f} {anon / 1024:>9.1f}")
    lines.append(f"{'':>8}  {'total (' + str(len(procs)) + ' processes)':<44} {memory.total_mib(procs):>8.1f} "
                 f"{memory.anon_mib(procs):>9.1f}")
    return "\n".join(lines)


def postfix_idle(settle: float) -> memory.Procs:
    """A private Postfix (inbound mode: smtpd -> virtual), `settle` s after its start: {pid: (name, Pss, Anon)}."""
    from bench.postfix_peer import PostfixPeer

    peer = PostfixPeer("inbound")
    try:
        time.sleep(settle)
        scan = memory.processes()
        return {pid: p for root in peer.pids() for pid, p in memory.tree(root, scan, memory.pss_kib).items()}
    finally:
        peer.close()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.bench_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--settle", type=float, default=60.0, help="seconds idle after `running` (default 60)")
    parser.add_argument("--url", help="a migrated database (default: a throwaway cluster of its own)")
    parser.add_argument("--postfix", action="store_true", help="measure a private idle Postfix the same way")
    args = parser.parse_args(argv)
    from mailroom import testing

    cluster = None
    url = args.url
    if url is None:
        cluster = testing.start_cluster("mailroom-memory-")
        url = testing.as_login(testing.migrated_database(cluster, "bench_memory"), "mr_worker")
    try:
        procs, rss = run_idle(url, args.settle)
        print(table(f"mailroom run, {args.settle:g} s idle after `running` (Pss, /proc/PID/smaps_rollup); "
                    f"VmRSS summed {memory.total_mib(rss):.1f} MiB", procs))
        if args.postfix:
            print()
            print(table(f"Postfix (private, inbound mode), {args.settle:g} s idle after its start", postfix_idle(args.settle)))
    finally:
        if cluster is not None:
            testing.stop_cluster(cluster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
