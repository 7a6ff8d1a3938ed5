"""Time partitions (issue 14): cost of the hot calls as the tables grow, and purge by partition drop.

1. Flat cost: with 10^3, 10^5 and 10^6 rows in each of outbound_messages, tokens and messages
   (quick: 10^3 and 10^4; MAILROOM_BENCH_PARTITIONS_MAX=7 adds 10^7), mostly done rows spread over
   30 days of daily partitions (tokens: weekly), a constant live part (500 queued messages,
   1,000 pending tokens, one inbox of 20 messages): claim_messages(100), dequeue_tokens(100),
   deliver_message and list_messages for that inbox. Each is EXPLAIN (ANALYZE, BUFFERS) of
   `SELECT … FROM mailroom.f(…)` in a transaction that is rolled back (so the live part stays the
   same): the Function Scan node's buffers count every buffer the function's own statements touch
   (PostgreSQL's buffer instrumentation is per backend). Median execution time of 5 runs; shared
   buffers hit + read of the last run; the ratio to the 10^3 figure.
2. Purge by drop: one day of 10^6 sent outbound rows (quick: 10^4) past outbound.retention,
   removed by maintain_partitions(), while a second session probes the parent every few ms with
   `SET lock_timeout = '100ms'; SELECT 1 FROM mailroom.outbound_messages LIMIT 1`: the call's time,
   the longest probe and the probes that timed out.

Rows are loaded with INSERT … SELECT generate_series as the owner, triggers off
(session_replication_role = replica) for the done rows; the measured calls are the real SQL API.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import psycopg
from psycopg.types.json import Jsonb

from mailroom.accounts import sqlapi as accounts
from mailroom.db import sqlapi as db_sqlapi
from mailroom.inboxes import sqlapi as inboxes
from mailroom.ops import sqlapi as ops
from mailroom.outbound import sqlapi as outbound

AREA = "partitions"
NOW = "2030-06-15 12:00:00+00"
QUEUED = 500
PENDING_TOKENS = 1000
INBOX_MESSAGES = 20


def _row(benchmark: str, value: float, unit: str, note: str = "") -> dict:
    return {"area": AREA, "benchmark": benchmark, "value": value, "unit": unit, "note": note}


def _pin(conn: psycopg.Connection, at: str | datetime) -> None:
    """mailroom.clock() for the rest of the session (the bench runs as a timekeeper)."""
    when = datetime.fromisoformat(at) if isinstance(at, str) else at
    db_sqlapi.pin_clock.call(conn, at=when, local=False)


def _layout(conn: psycopg.Connection) -> None:
    """Empty tables, daily partitions from 31 days before NOW to a week after (tokens weekly)."""
    conn.execute("TRUNCATE mailroom.outbound_messages, mailroom.messages, mailroom.tokens, "
                 "mailroom.outbound_idempotency_keys, mailroom.mailboxes, mailroom.accounts CASCADE")
    db_sqlapi.set_setting.call(conn, name="partitions.ahead", value="40 days")
    _pin(conn, datetime.fromisoformat(NOW) - timedelta(days=31))
    ops.maintain_partitions.rows(conn)
    db_sqlapi.set_setting.call(conn, name="partitions.ahead", value="7 days")
    _pin(conn, NOW)
    outbound.upsert_sender.call(conn, name="bench", from_address="bench@mailroom.test", host="127.0.0.1", port=2525)


def _fill(conn: psycopg.Connection, n: int) -> tuple[str, str]:
    """n rows in each table; returns (address, session token) of the measured inbox."""
    conn.execute("SET session_replication_role = replica")  # bulk load: no triggers, no FK checks
    conn.execute(
        """
        INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id, status,
            sent_at, created_at, updated_at)
        SELECT s.id, ARRAY['r' || g || '@example.com'], 'bench ' || g, 'body ' || g, '<' || g || '@bench>',
            CASE WHEN g <= %(q)s THEN 'queued' ELSE 'sent' END::mailroom.outbound_status,
            CASE WHEN g > %(q)s THEN x.ts END, x.ts, x.ts
        FROM mailroom.senders AS s, generate_series(1, %(n)s) AS g,
        LATERAL (SELECT CASE WHEN g <= %(q)s THEN %(now)s::timestamptz - (g %% 20) * interval '1 hour'
            ELSE %(now)s::timestamptz - (g %% 30) * interval '1 day' - (g %% 86000) * interval '1 second'
            END AS ts) AS x
        WHERE s.name = 'bench'
        """,
        {"n": n, "q": min(QUEUED, n // 2), "now": NOW},
    )
    conn.execute("SET session_replication_role = origin")
    # accounts (their activation tokens are the pending backlog), 10 minutes old: not expired
    _pin(conn, datetime.fromisoformat(NOW) - timedelta(minutes=10))
    conn.execute("INSERT INTO mailroom.accounts (email, login) SELECT 'u' || g || '@example.com', 'u' || g "
                 "FROM generate_series(1, %s) AS g", (PENDING_TOKENS,))
    created = inboxes.create_mailbox.row(conn, ttl_minutes=10080, plan="enterprise")
    box = (created.address, created.session_token)
    _pin(conn, NOW)
    conn.execute("SET session_replication_role = replica")
    conn.execute(
        """
        INSERT INTO mailroom.tokens (action, account, secret_digest, code_digest, expires_at, created_at,
            dispatched_at, consumed_at)
        SELECT 'activation', a.first + g %% %(accounts)s,
            sha256(('s' || g)::bytea), sha256(('c' || g)::bytea), x.ts + interval '15 minutes', x.ts,
            x.ts + interval '1 minute', x.ts + interval '2 minutes'
        FROM (SELECT min(id) AS first FROM mailroom.accounts) AS a, generate_series(1, %(n)s) AS g,
        LATERAL (SELECT %(now)s::timestamptz - interval '1 day' - (g %% 28) * interval '1 day'
            - (g %% 86000) * interval '1 second' AS ts) AS x
        """,
        {"n": max(n - PENDING_TOKENS, 0), "accounts": PENDING_TOKENS, "now": NOW},
    )
    boxes = max(10, n // 100)
    conn.execute(
        """
        INSERT INTO mailroom.mailboxes (address, plan, session_token_digest, expires_at, created_at)
        SELECT 'b' || g || '@bench.test', 'free', '\\x00', %(now)s::timestamptz + interval '1 day',
            %(now)s::timestamptz - interval '1 hour'
        FROM generate_series(1, %(boxes)s) AS g
        """,
        {"boxes": boxes, "now": NOW},
    )
    conn.execute(
        """
        INSERT INTO mailroom.messages (mailbox_id, raw, envelope_to, subject, text_body, size_bytes, received_at)
        SELECT b.first + g %% %(boxes)s, '\\x00', 'x@bench.test', 'm' || g, 'body', 1,
            %(now)s::timestamptz - (g %% 14) * interval '1 day' - (g %% 86000) * interval '1 second'
        FROM (SELECT min(id) AS first FROM mailroom.mailboxes WHERE address LIKE 'b%%@bench.test') AS b,
            generate_series(1, %(n)s) AS g
        """,
        {"n": max(n - INBOX_MESSAGES, 0), "boxes": boxes, "now": NOW},
    )
    conn.execute(
        """
        INSERT INTO mailroom.messages (mailbox_id, raw, envelope_to, subject, text_body, size_bytes, received_at)
        SELECT b.id, '\\x00', b.address, 'inbox ' || g, 'body', 1, %(now)s::timestamptz - g * interval '1 minute'
        FROM mailroom.mailboxes AS b, generate_series(1, %(k)s) AS g
        WHERE b.address = %(address)s
        """,
        {"k": INBOX_MESSAGES, "address": box[0], "now": NOW},
    )
    conn.execute("UPDATE mailroom.mailboxes SET message_count = %s WHERE address = %s", (INBOX_MESSAGES, box[0]))
    conn.execute("SET session_replication_role = origin")
    for table in ("outbound_messages", "tokens", "messages", "mailboxes", "accounts"):
        conn.execute(f"VACUUM ANALYZE mailroom.{table}")
    return box[0], box[1]


def _explain(conn: psycopg.Connection, query: str, params: dict, runs: int = 5) -> tuple[float, int, int]:
    """Median execution ms of EXPLAIN (ANALYZE, BUFFERS) of query (rolled back), buffers hit/read of the last."""
    times = []
    hit = read = 0
    for _ in range(runs):
        with conn.transaction(force_rollback=True):
            plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params).fetchone()[0][0]
        times.append(plan["Execution Time"])
        hit, read = plan["Plan"]["Shared Hit Blocks"], plan["Plan"]["Shared Read Blocks"]
    return statistics.median(times), hit, read


def _flat(conn: psycopg.Connection, sizes: list[int], progress: Callable[[str], None]) -> list[dict]:
    calls = {
        "claim_messages(100)": (outbound.claim_messages, lambda box: {"limit": 100, "worker": "bench"}),
        "dequeue_tokens(100)": (accounts.dequeue_tokens, lambda box: {"limit": 100}),
        # since issue 36 the parsed fields travel as one jsonb document (p_parsed), not one parameter each
        "deliver_message": (inboxes.deliver_message, lambda box: {"address": box[0], "raw": b"\x00",
                                                                  "envelope_from": "", "parsed": Jsonb({"subject": "bench"})}),
        "list_messages (one inbox, 20 messages)": (
            inboxes.list_messages, lambda box: {"address": box[0], "session_token": box[1]}),
    }
    base: dict[str, tuple[float, int]] = {}
    rows = []
    for n in sizes:
        progress(f"loading {n:,} rows per table")
        started = time.monotonic()
        _layout(conn)
        box = _fill(conn, n)
        partitions = conn.execute("SELECT count(*) FROM mailroom_internal._partitions('outbound_messages')").fetchone()[0]
        progress(f"loaded in {time.monotonic() - started:.0f}s ({partitions} outbound partitions)")
        for name, (fn, args) in calls.items():
            params = args(box)
            ms, hit, read = _explain(conn, fn.statement(params), params)
            base.setdefault(name, (ms, hit + read))
            b_ms, b_buf = base[name]
            rows.append(_row(
                f"{name}, 10^{len(str(n)) - 1} rows per table", ms, "ms",
                f"{hit + read} shared buffers (hit {hit}, read {read}); {ms / b_ms:.2f}x the time, "
                f"{(hit + read) / max(b_buf, 1):.2f}x the buffers of 10^3",
            ))
            progress(f"{name} at {n:,}: {ms:.2f} ms, {hit + read} buffers")
    return rows


def _purge(conn: psycopg.Connection, url: str, n: int, progress: Callable[[str], None]) -> list[dict]:
    """One day of n sent rows past retention, dropped by maintain_partitions under lock probes."""
    _layout(conn)
    day = conn.execute("SELECT %s::timestamptz - interval '31 days'", (NOW,)).fetchone()[0]
    conn.execute("SET session_replication_role = replica")
    conn.execute(
        """
        INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id, status,
            sent_at, created_at, updated_at)
        SELECT s.id, ARRAY['r' || g || '@example.com'], 'old ' || g, 'body', '<old' || g || '@bench>', 'sent',
            x.ts, x.ts, x.ts
        FROM mailroom.senders AS s, generate_series(1, %(n)s) AS g,
        LATERAL (SELECT mailroom_internal._partition_bound('1 day', %(day)s) + (g %% 86000) * interval '1 second' AS ts) AS x
        WHERE s.name = 'bench'
        """,
        {"n": n, "day": day},
    )
    conn.execute("SET session_replication_role = origin")
    conn.execute("VACUUM ANALYZE mailroom.outbound_messages")
    waits: list[float] = []
    timeouts = 0
    stop = threading.Event()

    def probe() -> None:
        nonlocal timeouts
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("SET lock_timeout = '100ms'")
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    other.execute("SELECT 1 FROM mailroom.outbound_messages LIMIT 1").fetchall()
                except psycopg.errors.LockNotAvailable:
                    timeouts += 1
                waits.append(time.monotonic() - t0)
                time.sleep(0.002)

    thread = threading.Thread(target=probe)
    thread.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    report = [(r.action, r.partition_name, r.row_count) for r in ops.maintain_partitions.rows(conn)]
    took = time.monotonic() - t0
    time.sleep(0.3)
    stop.set()
    thread.join()
    dropped = sum(r[2] for r in report if r[0] == "dropped")
    progress(f"purge by drop: {dropped:,} rows in {took * 1000:.0f} ms, longest probe {max(waits) * 1000:.1f} ms")
    return [
        _row(f"purge one day of 10^{len(str(n)) - 1} sent outbound rows by partition drop (maintain_partitions)",
             took * 1000, "ms", f"{dropped:,} rows dropped; {len(report)} report rows"),
        _row("longest lock wait of a second session's probe during that purge", max(waits) * 1000, "ms",
             f"{len(waits)} probes (lock_timeout 100ms), {timeouts} timed out"),
    ]


def run(url: str, quick: bool, progress: Callable[[str], None]) -> list[dict]:
    top = int(os.environ.get("MAILROOM_BENCH_PARTITIONS_MAX", "6"))
    sizes = [10**3, 10**4] if quick else [10**3, 10**5] + [10**e for e in range(6, top + 1)]
    with psycopg.connect(url, autocommit=True) as conn:
        rows = _flat(conn, sizes, progress)
        rows += _purge(conn, url, 10**4 if quick else 10**6, progress)
        conn.execute("TRUNCATE mailroom.outbound_messages, mailroom.messages, mailroom.tokens, "
                     "mailroom.outbound_idempotency_keys, mailroom.mailboxes, mailroom.accounts CASCADE")
    return rows


if __name__ == "__main__":  # pragma: no cover - handy for a scratch database
    for r in run(sys.argv[1], "--quick" in sys.argv, lambda m: print(m, file=sys.stderr)):
        print(r)
