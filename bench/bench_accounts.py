"""Accounts and tokens: dequeue_tokens throughput by batch size, and its cost per call as the tokens
table grows (must stay flat: the partial index holds only pending tokens).

Backlogs are loaded with triggers off (session_replication_role = replica) and every column the
triggers would fill computed in one INSERT ... SELECT, so setup stays fast; the measured calls run
the real dequeue_tokens with its triggers, each in its own committed transaction.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from mailroom.accounts import sqlapi as accounts
from mailroom.db import cluster as embedded
from mailroom.db import sqlapi as db_sqlapi
from mailroom.db.contract import SqlFunction

AREA = "accounts"
SEED_SQL = Path(__file__).resolve().parent / "seed_accounts.sql"

PENDING_SQL = """
INSERT INTO mailroom.tokens (action, account, expires_at, created_at)
SELECT 'activation', a.id, now() + interval '1 day', now()
FROM mailroom.accounts AS a
WHERE a.id > %(after)s
"""  # pending tokens hold no secret, code or digest: the dequeue mints them (issue 20)

ACCOUNTS_SQL = """
INSERT INTO mailroom.accounts (email, login, status, created_at)
SELECT 'bench' || g || '@example.com', 'bench' || g, 'provisioned', now()
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
"""

# processed history: dispatched and consumed tokens of one account, secrets already wiped
HISTORY_SQL = """
INSERT INTO mailroom.tokens (action, account, secret_digest, code_digest, expires_at, created_at,
                             dispatched_at, consumed_at)
SELECT 'activation', %(account)s, digest('h' || g, 'sha256'), digest('c' || g, 'sha256'),
       now() - interval '1 day', now() - interval '2 days', now() - interval '2 days', now() - interval '1 day'
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS g
"""


def _replica(conn: psycopg.Connection, sql: str, params: dict) -> None:
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(sql, params)


def _load_backlog(conn: psycopg.Connection, first: int, count: int) -> None:
    last_before = conn.execute("SELECT coalesce(max(id), 0) FROM mailroom.accounts").fetchone()[0]
    _replica(conn, ACCOUNTS_SQL, {"lo": first, "hi": first + count - 1})
    _replica(conn, PENDING_SQL, {"after": last_before})
    conn.execute("VACUUM ANALYZE mailroom.tokens")
    conn.execute("VACUUM ANALYZE mailroom.accounts")


def _dequeue_once(conn: psycopg.Connection, limit: int) -> int:
    with conn.transaction():
        rows = accounts.dequeue_tokens.rows(conn, limit=limit)
    return len(rows)


def _throughput(conn: psycopg.Connection, limit: int, calls: int) -> tuple[float, int]:
    total = 0
    start = time.perf_counter()
    for _ in range(calls):
        got = _dequeue_once(conn, limit)
        total += got
        if got < limit:
            raise RuntimeError(f"backlog ran dry at limit {limit}")
    elapsed = time.perf_counter() - start
    return total / elapsed, total


def _per_call_ms(conn: psycopg.Connection, limit: int, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        _dequeue_once(conn, limit)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _buffers_per_call(conn: psycopg.Connection, limit: int) -> int:
    """Shared buffers (hit + read) the dequeue statement touches: a noise-free measure of its work."""
    notes: list[str] = []

    def keep(diag: psycopg.errors.Diagnostic) -> None:
        notes.append(diag.message_primary or "")

    conn.add_notice_handler(keep)
    try:
        with conn.transaction():
            conn.execute("LOAD 'auto_explain'")
            conn.execute("SET LOCAL auto_explain.log_min_duration = 0")
            conn.execute("SET LOCAL auto_explain.log_nested_statements = on")
            conn.execute("SET LOCAL auto_explain.log_analyze = on")
            conn.execute("SET LOCAL auto_explain.log_buffers = on")
            conn.execute("SET LOCAL client_min_messages = log")
            accounts.dequeue_tokens.rows(conn, limit=limit)
    finally:
        conn.remove_notice_handler(keep)
    plan = next(n for n in notes if "CTE picked" in n)
    first = next(line for line in plan.splitlines() if "Buffers:" in line)
    return sum(int(v) for v in re.findall(r"(?:hit|read)=(\d+)", first))


def _median_ms(conn: psycopg.Connection, fn: SqlFunction, calls: list[dict]) -> float:
    times = []
    for kwargs in calls:
        start = time.perf_counter()
        fn.call(conn, **kwargs)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _consume_and_recovery(conn: psycopg.Connection, n: int, progress: Callable[[str], None]) -> list[dict]:
    """consume_token cost (recovery counts the code attempt in the same transaction) and request_password_recovery
    for an active account vs an unknown address (the same statements since issue 21: the request only records
    itself, the dequeue below issues the tokens)."""
    db_sqlapi.set_setting.call(conn, name="recovery.min_interval", value="0 seconds")
    db_sqlapi.set_setting.call(conn, name="recovery.daily_cap", value="1000")
    conn.execute("INSERT INTO mailroom.accounts (email, login, status) "
                 "SELECT 'live' || g || '@example.com', 'live' || g, 'active' FROM generate_series(1, %s) AS g", (n,))
    emails = [{"email": f"live{i}@example.com"} for i in range(1, n + 1)]
    unknown = [{"email": f"ghost{i}@example.com"} for i in range(1, n + 1)]
    request = accounts.request_password_recovery
    _median_ms(conn, request, unknown[:3])  # warm up
    known_ms = _median_ms(conn, request, emails)
    unknown_ms = _median_ms(conn, request, unknown)
    # the recovery tokens the requests lead to (the dequeue issues them), plus fresh activation tokens
    conn.execute("INSERT INTO mailroom.accounts (email, login) "
                 "SELECT 'fresh' || g || '@example.com', 'fresh' || g FROM generate_series(1, %s) AS g", (n,))
    issued = []
    for _ in range(2):  # a dequeue hands out what is due, then issues the requested recoveries: the next hands them out
        with conn.transaction():
            issued += [(d.action, d.signed, d.code) for d in accounts.dequeue_tokens.rows(conn, limit=1000000)
                       if d.login.startswith(("live", "fresh"))]
    consume = accounts.consume_token
    act_ms = _median_ms(conn, consume, [{"signed": s} for a, s, _ in issued if a == "activation"])
    rec_ms = _median_ms(conn, consume, [{"signed": s, "code": c} for a, s, c in issued
                                        if a == "password_recovery"])
    progress(f"consume {act_ms:.2f} ms (activation), {rec_ms:.2f} ms (recovery); "
             f"request_password_recovery {known_ms:.2f} ms (active) vs {unknown_ms:.2f} ms (unknown)")
    note = f"median of {n} calls, autocommit"
    return [
        {"area": AREA, "benchmark": "consume_token, activation", "value": round(act_ms, 3), "unit": "ms",
         "note": note},
        {"area": AREA, "benchmark": "consume_token, password recovery (code attempt counted in the same transaction)",
         "value": round(rec_ms, 3), "unit": "ms", "note": note},
        {"area": AREA, "benchmark": "request_password_recovery, active account (issued by the next dequeue)",
         "value": round(known_ms, 3), "unit": "ms", "note": note},
        {"area": AREA, "benchmark": "request_password_recovery, unknown address",
         "value": round(unknown_ms, 3), "unit": "ms",
         "note": note + "; the same statements as the line above (tests/accounts/test_recovery_work.py)"},
    ]


def _pgbench(url: str, script: str, seconds: int, options: str = "", clients: int = 1) -> float:
    """tps of `clients` pgbench clients running `script` (autocommit, one transaction a run)."""
    path = Path(tempfile.mkstemp(suffix=".sql")[1])
    path.write_text(script)
    path.chmod(0o644)
    env = {**os.environ, **({"PGOPTIONS": options} if options else {})}
    exe = shutil.which("pgbench") or str(embedded.find_bindir() / "pgbench")
    out = subprocess.run([exe, "-n", "-c", str(clients), "-j", str(clients), "-T", str(seconds), "-f", str(path), url],
                         capture_output=True, text=True, timeout=seconds + 60, env=env)
    path.unlink(missing_ok=True)
    match = re.search(r"tps = ([\d.]+)", out.stdout)
    if out.returncode != 0 or not match:
        raise RuntimeError(f"pgbench failed: {out.stderr.strip()[-200:]}")
    return float(match.group(1))


# The NOTIFY rule of migration 0180 for the token channel (registry: notified only while a session
# registered with mailroom.listen), put back in the bench database only, to measure what the seed's
# always-on token_insert (migration 0190) costs an account insert against it in the same run
# (tests/db/test_bench_sql.py runs it against the current schema: its helper once went away under it).
REGISTRY_RULE = """
CREATE OR REPLACE FUNCTION mailroom_internal._announce_tokens(p_count bigint)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_count > 0 THEN
        PERFORM mailroom_internal._notify_each(ARRAY[mailroom.setting('tokens.channel')], p_count::text);
    END IF;
END;
$$
"""


class _TokenListener:
    """A plain `LISTEN token_insert` session (no registration) that drains what it hears, in a thread."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute("LISTEN token_insert")
        self.heard = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while not self.stop.is_set():
            for _ in self.conn.notifies(timeout=0.2):
                self.heard += 1

    def close(self) -> int:
        self.stop.set()
        self.thread.join()
        self.conn.close()
        return self.heard


def account_insert(url: str, quick: bool, progress: Callable[[str], None]) -> list[dict]:
    """pgbench, 1 client: mailroom.create_account vs the seed's own schema (bench/seed_accounts.sql), and
    what the always-on NOTIFY token_insert costs: nobody listening, a session LISTENing, and the 0180
    registry rule with nobody registered (no NOTIFY), interleaved, median of the rounds."""
    seconds, rounds = (3, 1) if quick else (10, 3)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED_SQL.read_text())
        always_rule = conn.execute(
            "SELECT pg_get_functiondef('mailroom_internal._announce_tokens(bigint)'::regprocedure)").fetchone()[0]
    # from 9e18, not 2e9: the runs insert ~10^5-10^6 accounts in one database, and among that many draws
    # from 2e9 two are the same email (N^2 / 4e9 > 1), which aborted pgbench (MR: "already exists")
    pick = "\\set n random(1, 9000000000000000000)\n"
    create = pick + "SELECT mailroom.create_account('a' || :n || 'x@example.com', 'a' || :n || 'x');\n"

    def with_listener() -> float:
        listening = _TokenListener(url)
        try:
            return _pgbench(url, create, seconds)
        finally:
            if listening.close() == 0:
                raise RuntimeError("the LISTEN token_insert session heard nothing")

    def registry_rule(clients: int = 1) -> float:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(REGISTRY_RULE)
        try:
            return _pgbench(url, create, seconds, clients=clients)
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(always_rule)

    seed_insert = pick + "INSERT INTO accounts (email, login) VALUES ('s' || :n || 'x@example.com', 's' || :n || 'x');\n"
    runs: dict[str, list[float]] = {"ours": [], "listened": [], "registry": [], "seed": [], "ours4": [], "registry4": [],
                                    "seed4": []}
    for _ in range(rounds):
        # 4 clients: where NOTIFY costs (the commits of notifying transactions are serialized)
        runs["ours4"].append(_pgbench(url, create, seconds, clients=4))
        runs["registry4"].append(registry_rule(clients=4))
        runs["ours"].append(_pgbench(url, create, seconds))
        runs["listened"].append(with_listener())
        runs["registry"].append(registry_rule())
        runs["seed"].append(_pgbench(url, seed_insert, seconds, "-c search_path=seed,public"))
        # the seed's NOTIFY per row serializes its commits too: both sides at 4 clients (issue 46 item 3)
        runs["seed4"].append(_pgbench(url, seed_insert, seconds, "-c search_path=seed,public", clients=4))
    ours, listened, registry, seed, ours4, registry4, seed4 = (
        statistics.median(runs[k]) for k in ("ours", "listened", "registry", "seed", "ours4", "registry4", "seed4"))
    progress(f"account insert: create_account {ours:,.0f} tps (NOTIFY token_insert, nobody listening), "
             f"{listened:,.0f} with a LISTEN session, {registry:,.0f} under the 0180 registry rule (no NOTIFY); "
             f"the seed's schema {seed:,.0f} tps; 4 clients: {ours4:,.0f} always vs {registry4:,.0f} registry rule"
             f" vs {seed4:,.0f} the seed's schema")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA seed CASCADE")
    note = (f"pgbench 1 client, {seconds}s each, one account + activation token a transaction"
            + (f"; median of {rounds} interleaved rounds" if rounds > 1 else ""))
    return [
        {"area": AREA, "benchmark": "account insert: SELECT mailroom.create_account(...)", "value": round(ours, 1),
         "unit": "tx/s", "note": note + "; validation, CSPRNG code, digests, revocation, NOTIFY token_insert "
                                        "(always, since 0190; nobody listening)"},
        {"area": AREA, "benchmark": "account insert, a session LISTENing on token_insert", "value": round(listened, 1),
         "unit": "tx/s", "note": note + "; a plain LISTEN session draining every notification"},
        {"area": AREA, "benchmark": "account insert, the 0180 registry rule (nobody registered: no NOTIFY)",
         "value": round(registry, 1), "unit": "tx/s",
         "note": note + "; _announce_tokens of migration 0180 put back in the bench database for this row"},
        {"area": AREA, "benchmark": "account insert: always-on NOTIFY / registry rule", "value": round(ours / registry, 2),
         "unit": "ratio", "note": "the cost of the seed's always-on token_insert at 1 client (issue 33)"},
        {"area": AREA, "benchmark": "account insert, 4 clients: always-on NOTIFY / registry rule",
         "value": round(ours4 / registry4, 2), "unit": "ratio",
         "note": f"{ours4:,.0f} vs {registry4:,.0f} tx/s; pgbench 4 clients, {seconds}s each, interleaved with the rows above"},
        {"area": AREA, "benchmark": "reference: the seed's schema, INSERT INTO accounts (its triggers)",
         "value": round(seed, 1), "unit": "tx/s", "note": note + "; mailroom_accounts.txt as published"},
        {"area": AREA, "benchmark": "account insert: create_account / seed schema", "value": round(ours / seed, 2),
         "unit": "ratio", "note": "goal >= 1.0 (issue 46 item 3; issue 16: 2,700 tps vs the seed's 2,710)"},
        {"area": AREA, "benchmark": "reference: the seed's schema, 4 clients", "value": round(seed4, 1),
         "unit": "tx/s", "note": f"pgbench 4 clients, {seconds}s each, interleaved with the rows above"},
        {"area": AREA, "benchmark": "account insert, 4 clients: create_account / seed schema", "value": round(ours4 / seed4, 2),
         "unit": "ratio", "note": f"{ours4:,.0f} vs {seed4:,.0f} tx/s; goal >= 1.0 (issue 46 item 3: both sides NOTIFY,"
                                  " so both serialize their commits)"},
    ]


def run(url: str, quick: bool, progress: Callable[[str], None]) -> list[dict]:
    rows: list[dict] = account_insert(url, quick, progress)
    backlog = 5_000 if quick else 100_000
    # (limit, calls): together they take at most 80% of the backlog, so every limit runs against a deep queue
    plan = [(10, 50), (100, 15), (1000, 2)] if quick else [(10, 500), (100, 200), (1000, 50)]
    with psycopg.connect(url, autocommit=True) as conn:
        progress(f"creating {backlog:,} accounts with one activation token each")
        start = time.perf_counter()
        with conn.transaction():
            conn.execute(
                "INSERT INTO mailroom.accounts (email, login) "
                "SELECT 'bulk' || g || '@example.com', 'bulk' || g FROM generate_series(1, %s) AS g",
                (min(backlog, 10_000),),
            )
        bulk_s = time.perf_counter() - start
        rows.append({
            "area": AREA, "benchmark": "bulk INSERT into accounts (trigger issues each activation token)",
            "value": round(min(backlog, 10_000) / bulk_s, 1), "unit": "accounts/s",
            "note": f"{min(backlog, 10_000):,} accounts in one statement, one NOTIFY",
        })
        progress(f"{rows[-1]['value']:,} accounts/s through the triggers")
        if backlog > 10_000:
            _load_backlog(conn, 10_001, backlog - 10_000)
        pending = conn.execute("SELECT count(*) FROM mailroom.tokens WHERE dispatched_at IS NULL").fetchone()[0]
        for limit, calls in plan:
            rate, total = _throughput(conn, limit, calls)
            progress(f"limit {limit}: {rate:,.0f} tokens/s ({total:,} tokens)")
            rows.append({
                "area": AREA, "benchmark": f"dequeue_tokens throughput, limit {limit}",
                "value": round(rate, 1), "unit": "tokens/s",
                "note": f"{calls} calls, one commit each, from a backlog of {pending:,} (signing included)",
            })

        rows += _consume_and_recovery(conn, 15 if quick else 100, progress)

        # flat cost per call as processed history grows
        small, large = (1_000, 50_000) if quick else (10_000, 1_000_000)
        calls = 15 if quick else 30
        conn.execute("TRUNCATE mailroom.tokens, mailroom.accounts")
        _load_backlog(conn, 1, 10_000)
        account = conn.execute("SELECT min(id) FROM mailroom.accounts").fetchone()[0]
        results = {}
        have = 0
        for size in (small, large):
            progress(f"growing tokens to {size:,} processed rows")
            chunk = 250_000
            lo = have
            while lo < size:
                hi = min(size, lo + chunk)
                _replica(conn, HISTORY_SQL, {"account": account, "lo": lo + 1, "hi": hi})
                lo = hi
            have = size
            conn.execute("VACUUM ANALYZE mailroom.tokens")
            conn.execute("CHECKPOINT")
            _per_call_ms(conn, 100, 3)  # warm up
            results[size] = _per_call_ms(conn, 100, calls)
            buffers = _buffers_per_call(conn, 100)
            total = conn.execute("SELECT count(*) FROM mailroom.tokens").fetchone()[0]
            progress(f"{total:,} rows in tokens: {results[size]:.2f} ms and {buffers} buffers "
                     "per dequeue_tokens(100)")
            rows.append({
                "area": AREA, "benchmark": f"dequeue_tokens(100) time per call, {size:,} processed rows in tokens",
                "value": round(results[size], 3), "unit": "ms",
                "note": f"median of {calls} committed calls; {buffers} shared buffers touched per call (EXPLAIN BUFFERS)",
            })
        rows.append({
            "area": AREA, "benchmark": f"dequeue_tokens(100) time ratio, {large:,} vs {small:,} rows",
            "value": round(results[large] / results[small], 2), "unit": "x",
            "note": "about 1 = flat (partial index on pending tokens)",
        })
    return rows
