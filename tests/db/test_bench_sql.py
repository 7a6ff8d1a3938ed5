"""The bench's SQL against the current schema: `make bench` is not run by CI, so a function the
harness calls (or replaces, to measure an older rule beside the current one) that the schema renamed
or dropped is found here, not an hour into a bench run. The accounts area once aborted this way: its
0180 registry rule called mailroom_internal._notify, which migration 0571 had dropped.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
# `mailroom.f(…)` in bench_partitions' docstring stands for any function
PLACEHOLDERS = {"mailroom.f"}


def _bench_sources() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(BENCH.iterdir())
            if p.is_file() and p.suffix in (".py", ".sql", ".pgbench")}


def test_every_function_the_bench_calls_exists(conn):
    called: dict[str, set[str]] = {}
    for name, text in _bench_sources().items():
        for match in re.finditer(r"\b(mailroom(?:_internal)?)\.([a-z_][a-z0-9_]*)\(", text):
            called.setdefault(f"{match.group(1)}.{match.group(2)}", set()).add(name)
    assert "mailroom.create_account" in called  # the scan reads the harness
    existing = {row[0] for row in conn.execute(
        "SELECT n.nspname || '.' || p.proname FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace"
        " WHERE n.nspname IN ('mailroom', 'mailroom_internal')")}
    missing = {f: sorted(files) for f, files in called.items() if f not in existing and f not in PLACEHOLDERS}
    assert missing == {}, missing


def test_the_registry_rule_of_the_accounts_bench_runs(conn):
    sys.path.insert(0, str(ROOT))
    try:
        from bench.bench_accounts import REGISTRY_RULE
    finally:
        sys.path.remove(str(ROOT))
    with conn.transaction(force_rollback=True):
        conn.execute(REGISTRY_RULE)
        conn.execute("SELECT mailroom.create_account('bench-rule@example.com', 'benchrule')")
        # nobody registered on the token channel: the 0180 rule announces nothing
        assert conn.execute("SELECT count(*) FROM mailroom.accounts WHERE login = 'benchrule'").fetchone()[0] == 1
    with psycopg.connect(conn.info.dsn, autocommit=True) as other:
        assert other.execute("SELECT count(*) FROM mailroom.accounts WHERE login = 'benchrule'").fetchone()[0] == 0
