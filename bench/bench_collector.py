"""Collector figures: start-up and a 10k drain against Python's floor, backlog drain rate, rate under
single-row inserts, trickle latency.

Each figure runs the real `python -m mailroom collect` subprocess and reads its stdout, so the
numbers include LISTEN, the SQL dequeue + HMAC, the CSV formatting and the pipe.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from mailroom.accounts import sqlapi as accounts

ROOT = Path(__file__).resolve().parents[1]
AREA = "collector"


class _Collector:
    """`mailroom collect` with a thread that timestamps every stdout record."""

    def __init__(self, url: str, limit: int, timeout_ms: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
        env.update(
            MAILROOM_DATABASE_URL=url,
            MAILROOM_BATCH_LIMIT=str(limit),
            MAILROOM_BATCH_TIMEOUT=f"{timeout_ms}ms",
            MAILROOM_HEALTHCHECK_INTERVAL=f"{max(timeout_ms, 60_000)}ms",
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mailroom", "collect"], env=env, cwd=ROOT,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=1 << 16,
        )
        self.arrivals: dict[str, float] = {}  # login -> monotonic time its line was read
        self.count = 0
        self.first_at: float | None = None
        self.ready = threading.Event()
        self.done = threading.Event()
        self.want = 0
        self.stderr_tail: list[bytes] = []
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.monotonic()
            fields = line.rstrip(b"\n").split(b",")
            if self.first_at is None:
                self.first_at = now
            for i in range(2, len(fields), 5):
                self.arrivals[fields[i].decode()] = now
            self.count += len(fields) // 5
            if self.want and self.count >= self.want:
                self.done.set()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail = [*self.stderr_tail[-20:], line]
            if b"waiting for notifications" in line:
                self.ready.set()

    def wait_ready(self, timeout: float = 60) -> float:
        if not self.ready.wait(timeout):
            raise RuntimeError("collector did not start: " + b"".join(self.stderr_tail).decode(errors="replace"))
        return time.monotonic()

    def wait_count(self, n: int, timeout: float) -> float:
        self.want = n
        if self.count >= n:
            self.done.set()
        if not self.done.wait(timeout):
            raise RuntimeError(f"collector emitted {self.count} of {n} tokens within {timeout}s")
        return time.monotonic()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _bulk(conn: psycopg.Connection, prefix: str, n: int) -> None:
    """n accounts in one statement."""
    accounts.create_account.each(conn, [{"email": f"{prefix}{g}@bench.test", "login": f"{prefix}{g}"}
                                        for g in range(1, n + 1)])


def _row(benchmark: str, value: float, unit: str, note: str) -> dict:
    return {"area": AREA, "benchmark": benchmark, "value": round(value, 3), "unit": unit, "note": note}


def backlog_rates(url: str, total: int, plan: list[tuple[int, int]], progress: Callable[[str], None]) -> list[dict]:
    """One backlog of `total` tokens, drained in turn at each limit of `plan` [(limit, share)].

    Creating 100,000 accounts takes far longer than draining them, so the limits share one
    backlog: each collector drains its share from what is left, then gets SIGTERM (it finishes
    its in-flight batch); the last one drains the rest.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        progress(f"collector: creating a backlog of {total} tokens")
        _bulk(conn, "b", total)
    rows = []
    left = total
    for i, (limit, share) in enumerate(plan):
        n = left if i == len(plan) - 1 else min(share, left)
        c = _Collector(url, limit, 5000)
        try:
            progress(f"collector: draining {n} of {left} queued at limit {limit}")
            start = time.monotonic()
            end = c.wait_count(n, timeout=300)
            first = c.first_at or start
        finally:
            c.stop()
        left -= c.count  # it may finish a batch or two past its share before SIGTERM lands
        rows.append(_row(
            f"backlog drain, limit {limit}", n / max(end - first, 1e-9), "tokens/s",
            f"{n} tokens of a {total}-token backlog; first line to last "
            f"({end - start:.2f}s incl. process start)",
        ))
    return rows


def insert_rate(url: str, n: int, progress: Callable[[str], None]) -> list[dict]:
    c = _Collector(url, 100, 100)
    try:
        c.wait_ready()
        progress(f"collector: {n} single-row autocommit inserts while it runs (limit 100, timeout 100 ms)")
        with psycopg.connect(url, autocommit=True) as conn:
            start = time.monotonic()
            for i in range(n):
                accounts.create_account.call(conn, email=f"s{i}@bench.test", login=f"s{i}")
            inserted = time.monotonic()
        end = c.wait_count(n, timeout=120)
    finally:
        c.stop()
    return [
        _row("single-row inserts while collecting", n / (end - start), "tokens/s",
             f"{n} autocommit create_account calls, first insert to last line out"),
        _row("  of which the insert loop alone", n / (inserted - start), "inserts/s",
             "the producer's own rate (the bound for the line above)"),
        _row("  lag after the last insert", (end - inserted) * 1000, "ms", "last commit to its line on stdout"),
    ]


def trickle_latency(url: str, n: int, progress: Callable[[str], None]) -> list[dict]:
    c = _Collector(url, 10, 5000)
    committed: dict[str, float] = {}
    try:
        c.wait_ready()
        progress(f"collector: trickle of {n} inserts, one per 5 ms (limit 10, timeout 5 s)")
        with psycopg.connect(url, autocommit=True) as conn:
            next_at = time.monotonic()
            for i in range(n):
                login = f"t{i}"
                accounts.create_account.call(conn, email=f"{login}@bench.test", login=login)
                committed[login] = time.monotonic()
                next_at += 0.005
                delay = next_at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            # a steady trickle has no end; fill the last partial batch (one statement, payload 10)
            # so the measured tail does not sit out the 5 s timeout
            _bulk(conn, "fill", 10)
        c.wait_count(n + 10, timeout=30)
    finally:
        c.stop()
    lat = sorted((c.arrivals[k] - t) * 1000 for k, t in committed.items())
    p95 = lat[min(len(lat) - 1, int(len(lat) * 0.95))]
    note = f"{n} inserts; INSERT commit returned -> line read from stdout"
    return [
        _row("trickle latency p50 (1 insert / 5 ms, limit 10)", statistics.median(lat), "ms", note),
        _row("trickle latency p95", p95, "ms", note),
        _row("trickle latency max", lat[-1], "ms", note + "; 10 filler tokens end the run"),
    ]


def _floor_seconds(runs: int) -> float:
    """Wall time of `python -c 'import psycopg, typer'`: the floor any Python collector starts from."""
    times = []
    for _ in range(runs):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-c", "import psycopg, typer"], check=True, cwd=ROOT)
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def start_and_drain(url: str, n: int, runs: int, progress: Callable[[str], None]) -> list[dict]:
    """Issue 16, row 5: from process start to the last of n tokens written, at --batch-limit 1000,
    and from process start to listening on an empty queue, each next to the import floor."""
    floor = _floor_seconds(max(runs, 5))
    ready, drains = [], []
    for i in range(runs):
        c = _Collector(url, 1000, 50)
        t0 = time.monotonic()
        try:
            ready.append(c.wait_ready() - t0)
        finally:
            c.stop()
        with psycopg.connect(url, autocommit=True) as conn:
            _bulk(conn, f"sd{i}_", n)
        progress(f"collector: draining a {n}-token backlog from process start ({i + 1}/{runs})")
        t0 = time.monotonic()
        c = _Collector(url, 1000, 50)
        try:
            drains.append(c.wait_count(n, 120) - t0)
        finally:
            c.stop()
    start, drain = statistics.median(ready), statistics.median(drains)
    note = f"median of {runs} runs; floor: `python -c 'import psycopg, typer'` {floor * 1000:.0f} ms (median of {max(runs, 5)})"
    return [
        _row("floor: python -c 'import psycopg, typer'", floor * 1000, "ms", f"median of {max(runs, 5)} runs"),
        _row("collect: process start to listening (empty queue)", start * 1000, "ms",
             f"{start / floor:.2f}x the floor; imports, config, connect, LISTEN and its self-test; {note}"),
        _row(f"collect: process start to the last of {n:,} tokens written (limit 1000)", drain * 1000, "ms",
             f"floor + {(drain - floor) * 1000:.0f} ms (goal: floor + 100 ms); {note}"),
    ]


def run(url: str, quick: bool, progress: Callable[[str], None]) -> list[dict]:
    rows: list[dict] = start_and_drain(url, 10_000, 1 if quick else 3, progress)
    if quick:
        rows += backlog_rates(url, 6_000, [(10, 1_000), (100, 2_000), (1000, 3_000)], progress)
    else:
        rows += backlog_rates(url, 100_000, [(10, 20_000), (100, 30_000), (1000, 50_000)], progress)
    rows += insert_rate(url, 500 if quick else 10_000, progress)
    rows += trickle_latency(url, 300 if quick else 2_000, progress)
    return rows


if __name__ == "__main__":  # scratch run: python -m bench.bench_collector URL [--quick]
    for r in run(sys.argv[1], "--quick" in sys.argv, lambda m: print(m, file=sys.stderr)):
        print(f"{r['benchmark']:<50} {r['value']:>12} {r['unit']:<9} {r['note']}")
