"""Where a message's time goes on mailroom's side with VERP and the suppression check (issue 37, item 2).

    python -m bench.profile_outbound_work [MESSAGES] [--sender-profile FILE]

On a throwaway cluster, with 5-recipient messages (bench/bench_outbound_work.py's shape):

- enqueue_message with 5 recipients, and with 1, per call (one transaction, the app's round trip);
  the suppression check alone (_suppressed_recipients over the 5 addresses: per address a lookup
  and one HMAC, the erased form under the redaction pepper), as an SQL statement a message;
  is_suppressed (one address, one HMAC) per call, the application's own question.
- A/B, interleaved: the check of 5 addresses and the one-address test inside one statement (no round
  trip) by the current definitions (sql/38_outbound_suppressions.sql) and by the previous ones
  (PREVIOUS below, created in a schema ab_old of the throwaway database).
- claim_messages(50) of 5-recipient messages with VERP (a bounce domain) and without, per message:
  the return paths are computed in the claim (one per recipient, one HMAC each), so VERP adds no
  round trip; what it adds to the claim is measured here.
- round trips per message of the sender (pg_stat_statements when the cluster has it, else the
  statements counted from the sender's own calls: claim/finalize per batch, not per recipient).
- with --sender-profile FILE: one `mailroom send --until-idle` under cProfile draining the
  5-recipient VERP queue; its top functions by own time are printed.

Rounds are interleaved, medians printed; the numbers are for A/B on one machine, never absolute.
"""

from __future__ import annotations

import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from mailroom.outbound import sqlapi as outbound

ROOT = Path(__file__).resolve().parents[1]
TEXT_2KB = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod.\n" * 24


def _to(g: int, n: int) -> list[str]:
    return [f"rcpt{g}-{k}@example.com" for k in range(1, n + 1)]


def enqueue_per_call(conn: psycopg.Connection, n: int, recipients: int) -> float:
    """microseconds per enqueue_message (autocommit: its own transaction, as an app calls it)."""
    t0 = time.perf_counter()
    for g in range(n):
        outbound.enqueue_message.call(conn, sender="bench", to=_to(g, recipients), subject=f"b {g}", text_body=TEXT_2KB)
    return (time.perf_counter() - t0) / n * 1e6


def suppression_statement(conn: psycopg.Connection, n: int, recipients: int) -> float:
    """microseconds per message of the enqueue's suppression check alone (one statement a message)."""
    t0 = time.perf_counter()
    for g in range(n):
        conn.execute("SELECT mailroom_internal._suppressed_recipients(%s, '{}', '{}')", (_to(g, recipients),))
    return (time.perf_counter() - t0) / n * 1e6


# The previous definitions (before issue 37), for the A/B: one _suppression_id (an SQL function with SET:
# planned at every call; its keys and their HMAC two PL/pgSQL calls) per address
PREVIOUS = """
CREATE SCHEMA IF NOT EXISTS ab_old;
CREATE OR REPLACE FUNCTION ab_old._suppressed(p_address text) RETURNS boolean LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$ SELECT mailroom_internal._suppression_id(p_address) IS NOT NULL $$;
CREATE OR REPLACE FUNCTION ab_old._positions(p_kind text, p_addresses text[]) RETURNS text[] LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce(array_agg(format('%s[%s]', p_kind, a.n) ORDER BY a.n), '{}')
    FROM unnest(p_addresses) WITH ORDINALITY AS a (address, n) WHERE ab_old._suppressed(a.address) $$;
CREATE OR REPLACE FUNCTION ab_old._suppressed_recipients(p_to text[], p_cc text[], p_bcc text[]) RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT ab_old._positions('to', p_to) || ab_old._positions('cc', p_cc) || ab_old._positions('bcc', p_bcc) $$;
"""


def suppression_in_sql(conn: psycopg.Connection, n: int, recipients: int, schema: str) -> float:
    """microseconds per message of the check of `recipients` addresses, n messages in one statement
    (one round trip for all: the check's own cost), by the current or the previous definition."""
    t0 = time.perf_counter()
    conn.execute(
        f"SELECT count({schema}._suppressed_recipients(ARRAY(SELECT 'rcpt' || g || '-' || k || '@example.com'"
        " FROM generate_series(1, %s) AS k), '{}', '{}')) FROM generate_series(1, %s) AS g", (recipients, n))
    return (time.perf_counter() - t0) / n * 1e6


def one_address_in_sql(conn: psycopg.Connection, n: int, schema: str) -> float:
    """microseconds per address of the one-address test (is_suppressed's), n addresses in one statement."""
    t0 = time.perf_counter()
    conn.execute(f"SELECT count(*) FILTER (WHERE {schema}._suppressed('rcpt' || g || '@example.com'))"
                 " FROM generate_series(1, %s) AS g", (n,))
    return (time.perf_counter() - t0) / n * 1e6


def is_suppressed_per_call(conn: psycopg.Connection, n: int) -> float:
    t0 = time.perf_counter()
    for g in range(n):
        conn.execute("SELECT mailroom.is_suppressed(%s)", (f"rcpt{g}@example.com",))
    return (time.perf_counter() - t0) / n * 1e6


def claim_per_message(conn: psycopg.Connection, verp: bool, n: int, recipients: int, batch: int = 50) -> float:
    """microseconds per claimed message of claim_messages(batch) over `recipients`-recipient messages."""
    outbound.set_sender_bounce_domain.call(conn, sender="bench", domain="bounces.mailroom.test" if verp else None)
    conn.execute("TRUNCATE mailroom.outbound_messages")
    conn.execute(
        """
        INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id, rcpt_domain)
        SELECT s.id, ARRAY(SELECT 'rcpt' || g || '-' || k || '@example.com' FROM generate_series(1, %s) AS k),
               'bench ' || g, %s, '<' || md5(random()::text || g) || '@mailroom.test>', 'example.com'
        FROM mailroom.senders AS s, generate_series(1, %s) AS g
        WHERE s.name = 'bench'
        """, (recipients, TEXT_2KB, n))
    conn.execute("VACUUM ANALYZE mailroom.outbound_messages")
    spent, got = 0.0, 0
    while True:
        t0 = time.perf_counter()
        rows = outbound.claim_messages.rows(conn, limit=batch, worker="profile")
        spent += time.perf_counter() - t0
        if not rows:
            break
        got += len(rows)
        if verp:
            assert all(r.return_paths and len(r.return_paths) == recipients for r in rows)
        else:
            assert all(r.return_paths is None for r in rows)
    assert got == n, f"claimed {got} of {n}"
    return spent / n * 1e6


def sender_profile(url: str, conn: psycopg.Connection, n: int, out: Path) -> None:
    """One `mailroom send --until-idle` under cProfile draining n 5-recipient VERP messages to smtp-sink."""
    from bench import smtp_tools

    sink = smtp_tools.SmtpSink()
    try:
        outbound.upsert_sender.call(conn, name="bench", from_address="bench@mailroom.test", host="127.0.0.1",
                                    port=sink.port)
        outbound.set_sender_bounce_domain.call(conn, sender="bench", domain="bounces.mailroom.test")
        conn.execute("TRUNCATE mailroom.outbound_messages")
        with conn.transaction():
            for g in range(n):
                outbound.enqueue_message.call(conn, sender="bench", to=_to(g, 5), subject=f"b {g}", text_body=TEXT_2KB)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_SEND_")}
        env |= {"MAILROOM_DATABASE_URL": url, "PYTHONPATH": str(ROOT / "driver")}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "mailroom", "send", "--until-idle"],
                       env=env, check=True, stdout=subprocess.DEVNULL, timeout=600)
        print(f"sender under cProfile: {n} msgs x 5 recipients in {time.perf_counter() - t0:.2f}s")
        pstats.Stats(str(out)).sort_stats("tottime").print_stats(25)
    finally:
        sink.close()


def main() -> None:
    from bench.run import start_cluster
    from mailroom import testing

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n = int(args[0]) if args else 500
    profile_to = None
    if "--sender-profile" in sys.argv:
        profile_to = Path(sys.argv[sys.argv.index("--sender-profile") + 1])
    cluster = start_cluster()
    try:
        url = testing.migrated_database(cluster, "profile_outbound_work")
        with psycopg.connect(url, autocommit=True) as conn:
            outbound.upsert_sender.call(conn, name="bench", from_address="bench@mailroom.test", host="127.0.0.1",
                                        port=25)
            conn.execute(PREVIOUS)
            runs: dict[str, list[float]] = {}
            for _ in range(3):
                for name, fn in (
                    ("enqueue_message, 5 recipients (us/call)", lambda: enqueue_per_call(conn, n, 5)),
                    ("enqueue_message, 1 recipient (us/call)", lambda: enqueue_per_call(conn, n, 1)),
                    ("suppression check of 5 addresses, a statement (us/msg)", lambda: suppression_statement(conn, n, 5)),
                    ("A/B suppression check of 5 addresses in SQL, now (us/msg)",
                     lambda: suppression_in_sql(conn, n, 5, "mailroom_internal")),
                    ("A/B suppression check of 5 addresses in SQL, before (us/msg)",
                     lambda: suppression_in_sql(conn, n, 5, "ab_old")),
                    ("A/B one address in SQL, now (us/address)", lambda: one_address_in_sql(conn, n, "mailroom_internal")),
                    ("A/B one address in SQL, before (us/address)", lambda: one_address_in_sql(conn, n, "ab_old")),
                    ("is_suppressed, 1 address (us/call)", lambda: is_suppressed_per_call(conn, n)),
                    ("claim_messages(50), 5 recipients, VERP (us/msg)", lambda: claim_per_message(conn, True, n, 5)),
                    ("claim_messages(50), 5 recipients, no VERP (us/msg)", lambda: claim_per_message(conn, False, n, 5)),
                ):
                    runs.setdefault(name, []).append(fn())
                conn.execute("TRUNCATE mailroom.outbound_messages")
            for name, values in runs.items():
                print(f"{name}: median {statistics.median(values):,.0f} ({', '.join(f'{v:,.0f}' for v in values)})")
            if profile_to is not None:
                sender_profile(url, conn, n, profile_to)
    finally:
        testing.stop_cluster(cluster)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
