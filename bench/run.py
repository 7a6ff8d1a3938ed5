"""`make bench`: every benchmark on one dedicated cluster, written to bench/results.md.

    python -m bench.run [--quick] [--only AREA ...] [--rounds N] [--output bench/results.md]

The cluster runs with PostgreSQL's default durability (fsync on, synchronous_commit on), and
pgbench's single-row commit rate is measured first, in the same run, as the reference the
other rates are compared with: absolute numbers vary between machines, ratios travel better.
The storage's fdatasync rate (`pg_test_fsync -s 1`, its "one 8kB write" fdatasync line, on the
cluster's own file system) is measured with it: printed, in the machine table, a row of its own,
and in the notes of the outbound drain rows (env MAILROOM_BENCH_FDATASYNC hands it to the areas).

The table is written after every area (marked "in progress: N of M areas" until the last one), so a
run cut short keeps every area it finished; each area's wall time is a row of its own (`wall time`,
area `bench`). At start the run prints each area's expected duration (ESTIMATE_MIN, for the quiet
2-core development VM; a loaded machine takes longer). `--rounds N` sets the interleaved rounds of
the areas that read it (bench.knobs.rounds: the Postfix comparisons of outbound and inboxes, and
outbound's batch-1 rows; default 3, quick 1: a quick run says only that each row is produced).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench import knobs
from mailroom import testing
from mailroom.db import cluster as embedded
from mailroom.db.connect import connect

AREAS = ("accounts", "collector", "inboxes", "outbound", "partitions", "purge", "http", "citus", "memory")
# minutes each area is expected to take alone (full run, default rounds) on the quiet 2-core development
# VM: outbound and inboxes projected phase by phase from the quiet run of 2026-11-27 07:26 UTC with the
# new counts, the others from their wall time on a loaded machine (rough): docs/benchmarks.md "How long
# `make bench` takes"
# from the quiet full run of 2026-11-27 10:21 (--rounds 2: 1,798 s; docs/benchmarks.md), inboxes and
# outbound put back to 3 rounds
ESTIMATE_MIN = {"accounts": 3.7, "collector": 4.8, "inboxes": 14.0, "outbound": 14.0, "partitions": 1.2,
                "purge": 0.3, "http": 1.5, "citus": 1.8, "memory": 0.2}
HERE = Path(__file__).resolve().parent


def progress(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} bench: {message}", file=sys.stderr, flush=True)


def start_cluster() -> embedded.Cluster:
    home = Path(tempfile.mkdtemp(prefix="mailroom-bench-", dir="/tmp"))
    return embedded.up(home, fast=False)


def pgbench_reference(cluster: embedded.Cluster, seconds: int) -> dict:
    """Single-row INSERT commits per second, 1 client, as the machine's reference rate."""
    url = testing.create_database(cluster, "pgbench_ref")
    with connect(url) as conn:
        conn.execute("CREATE TABLE ref (id bigserial PRIMARY KEY, v int NOT NULL)")
    script = Path(tempfile.mkstemp(suffix=".sql")[1])
    script.write_text("INSERT INTO ref (v) VALUES (1);\n")
    script.chmod(0o644)
    exe = shutil.which("pgbench") or str(embedded.find_bindir() / "pgbench")
    argv = [exe, "-n", "-c", "1", "-T", str(seconds), "-f", str(script),
            "-h", str(cluster.home), "-p", str(cluster.port), "-U", "postgres", "pgbench_ref"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    script.unlink(missing_ok=True)
    match = re.search(r"tps = ([\d.]+)", out.stdout)
    if out.returncode != 0 or not match:
        raise RuntimeError(f"pgbench failed: {out.stderr.strip()[-200:]}")
    return {"area": "reference", "benchmark": "pgbench single-row INSERT commit rate (1 client)",
            "value": float(match.group(1)), "unit": "tx/s", "note": f"{seconds}s run, synchronous_commit=on"}


def fdatasync_rate(directory: Path, seconds: int = 1) -> dict:
    """fdatasync ops/sec of one 8 kB write from pg_test_fsync (PostgreSQL's bin dir), a file in `directory`."""
    exe = shutil.which("pg_test_fsync") or str(embedded.find_bindir() / "pg_test_fsync")
    target = directory / "pg_test_fsync.out"
    try:
        out = subprocess.run([exe, "-s", str(seconds), "-f", str(target)], capture_output=True, text=True,
                             timeout=30 * seconds + 120)
    finally:
        target.unlink(missing_ok=True)
    return {"area": "reference", "benchmark": "fdatasync rate of the cluster's file system (pg_test_fsync)",
            "value": parse_fdatasync(out.stdout), "unit": "ops/s",
            "note": f"pg_test_fsync -s {seconds}, one 8 kB write, fdatasync (wal_sync_method's Linux default): "
                    "the ceiling of one-commit-per-message paths on this disk"}


def parse_fdatasync(text: str) -> float:
    """The fdatasync ops/sec of pg_test_fsync's first section ("using one 8kB write")."""
    section = text.split("one 8kB write", 1)
    match = re.search(r"^\s*fdatasync\s+([\d.]+) ops/sec", section[-1], re.M) if len(section) == 2 else None
    if not match:
        raise RuntimeError(f"pg_test_fsync: no fdatasync rate in its output: {text.strip()[-200:]}")
    return float(match.group(1))


def machine(cluster: embedded.Cluster) -> list[tuple[str, str]]:
    with connect(cluster.url("postgres")) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
        shared = conn.execute("SHOW shared_buffers").fetchone()[0]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return [
        ("cores", str(os.cpu_count())),
        ("memory", f"{mem:.0f} GiB"),
        ("python", platform.python_version()),
        ("PostgreSQL", version),
        ("synchronous_commit", sync),
        ("fsync", fsync),
        ("shared_buffers", shared),
    ]


def fmt(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == int(value):
        return f"{int(value):,}"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:,.2f}"
    return f"{value:.4f}"


def ratio(row: dict, reference: float | None) -> str:
    if reference and row["unit"].endswith("/s") and row["area"] != "reference":
        return f"{row['value'] / reference:.2f}×"
    return ""


def render(rows: list[dict], info: list[tuple[str, str]], reference: float | None, quick: bool, took: float,
           progress_note: str = "") -> str:
    status = f" **In progress: {progress_note}** (the table so far; the run goes on)." if progress_note else ""
    lines = [
        f"# mailroom benchmark results{' (quick)' if quick else ''}{' (in progress)' if progress_note else ''}",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `make bench{'-quick' if quick else ''}` "
        f"in {took:.0f} s.{status} Rates are compared with pgbench's single-row commit rate measured in the same run "
        "(ratio column): absolute numbers vary between machines.",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in info],
        "",
        "| area | benchmark | value | unit | vs pgbench | note |",
        "|---|---|---:|---|---:|---|",
    ]
    for row in rows:
        value = fmt(row["value"]) if isinstance(row.get("value"), (int, float)) else str(row.get("value"))
        lines.append(
            f"| {row['area']} | {row['benchmark']} | {value} | {row['unit']} | {ratio(row, reference)} "
            f"| {row.get('note', '')} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and 1 round: each row is produced, not measured")
    parser.add_argument("--only", nargs="*", choices=AREAS, help="run only these areas")
    parser.add_argument("--rounds", type=int, metavar="N",
                        help="interleaved rounds of the Postfix comparisons (default 3, quick 1)")
    parser.add_argument("--output", type=Path, default=HERE / "results.md")
    args = parser.parse_args(argv)
    if args.rounds is not None:
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        os.environ[knobs.ROUNDS_ENV] = str(args.rounds)
    started = time.monotonic()
    areas = args.only or list(AREAS)
    progress(f"starting a dedicated cluster ({'quick' if args.quick else 'full'} run: {', '.join(areas)})")
    if not args.quick:
        scale = (args.rounds or 3) / 3
        guess = {a: ESTIMATE_MIN[a] * (scale if a in ("inboxes", "outbound") else 1) for a in areas}
        progress("expected (alone on the quiet 2-core VM; longer on a loaded machine): "
                 + ", ".join(f"{a} ~{m:.0f} min" for a, m in guess.items()) + f"; total ~{sum(guess.values()):.0f} min")
    cluster = start_cluster()
    rows: list[dict] = []
    failures = 0
    info: list[tuple[str, str]] = []
    reference = None

    def write(note: str = "") -> None:
        args.output.write_text(render(rows, info, reference, args.quick, time.monotonic() - started, note))

    try:
        info = machine(cluster)
        progress("pgbench reference (single-row commits)")
        ref_row = pgbench_reference(cluster, 2 if args.quick else 5)
        rows.append(ref_row)
        reference = ref_row["value"]
        progress(f"reference: {reference:,.0f} commits/s")
        progress("fdatasync rate (pg_test_fsync -s 1)")
        try:
            sync_row = fdatasync_rate(Path(cluster.home))
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            failures += 1
            sync_row = {"area": "reference", "benchmark": "fdatasync rate (pg_test_fsync)", "value": float("nan"),
                        "unit": "ops/s", "note": f"FAILED: {str(exc)[:160]}"}
        rows.append(sync_row)
        info.append(("fdatasync (pg_test_fsync -s 1, one 8 kB write)", f"{fmt(sync_row['value'])} ops/s"))
        os.environ["MAILROOM_BENCH_FDATASYNC"] = f"{sync_row['value']:.0f}"
        progress(f"fdatasync: {fmt(sync_row['value'])} ops/s")
        write(f"0 of {len(areas)} areas")
        for done, area in enumerate(areas, 1):
            dbname = f"bench_{area}"
            t0 = time.monotonic()
            url = testing.migrated_database(cluster, dbname)
            progress(f"{area}: running ({done} of {len(areas)})")
            try:
                module = importlib.import_module(f"bench.bench_{area}")
                area_rows = module.run(url, args.quick, lambda msg, a=area: progress(f"{a}: {msg}"))
            except Exception as exc:  # a broken benchmark is reported, the others still run
                failures += 1
                traceback.print_exc()
                area_rows = [{"area": area, "benchmark": "FAILED", "value": float("nan"), "unit": "",
                              "note": f"{type(exc).__name__}: {str(exc)[:120]}"}]
            took = time.monotonic() - t0
            rows.extend(area_rows)
            rows.append({"area": "bench", "benchmark": f"wall time: {area}", "value": round(took), "unit": "s",
                         "note": f"{took / 60:.1f} min, from its database's creation to its last row"})
            progress(f"{area}: done in {took:.1f}s")
            testing.drop_database(cluster, dbname)
            write("" if done == len(areas) else f"{done} of {len(areas)} areas")
            progress(f"wrote {args.output} ({done} of {len(areas)} areas)")
    finally:
        testing.stop_cluster(cluster)
    write()
    print(args.output.read_text())
    progress(f"wrote {args.output} in {time.monotonic() - started:.0f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
