"""purge_mailboxes (issue 25): reclaiming inactive inboxes and their messages, against the cascading
foreign key it replaced (migration 0181), in the same run and database.

n inactive inboxes, two messages each spread over the daily partitions of the last three weeks, are
loaded with triggers off; purge_mailboxes then runs batch after batch (inbox.purge_batch, one
commit each, as run_expiry does) until nothing is left. The reference is the same purge with the
link kept the old way: ON DELETE CASCADE restored and the two triggers disabled.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import psycopg

AREA = "purge"

LOAD = """
INSERT INTO mailroom.mailboxes (address, plan, owner_type, session_token_digest, created_at, expires_at,
    is_active, inactive_since)
SELECT 'purge' || g || '@bench.invalid', 'free', 'anonymous', digest('t' || g, 'sha256'),
    now() - interval '21 days', now() - interval '20 days', false, now() - interval '20 days'
FROM generate_series(1, %(n)s) AS g
"""

MESSAGES = """
INSERT INTO mailroom.messages (mailbox_id, raw, envelope_to, size_bytes, received_at)
SELECT m.id, 'raw', m.address, 3, now() - (k * 7 + mod(m.id, 7)) * interval '1 day'
FROM mailroom.mailboxes AS m CROSS JOIN generate_series(1, 2) AS k
WHERE m.address LIKE 'purge%'
"""


def _load(conn: psycopg.Connection, n: int) -> None:
    conn.execute("DELETE FROM mailroom.mailboxes WHERE address LIKE 'purge%'")  # an earlier run's
    conn.execute("SET session_replication_role = replica")
    conn.execute(LOAD, {"n": n})
    conn.execute(MESSAGES)
    conn.execute("SET session_replication_role = origin")
    conn.execute("VACUUM ANALYZE mailroom.mailboxes")
    conn.execute("VACUUM ANALYZE mailroom.messages")


def _purge_all(conn: psycopg.Connection) -> tuple[float, int]:
    t0 = time.perf_counter()
    total = 0
    while True:
        got = conn.execute("SELECT mailroom.purge_mailboxes('1 day')").fetchone()[0]
        total += got
        if got == 0:
            return time.perf_counter() - t0, total


def _cascade(conn: psycopg.Connection, on: bool) -> None:
    """The link as before migration 0181 (on) or as now (off)."""
    if on:
        conn.execute("ALTER TABLE mailroom.messages DISABLE TRIGGER before_message_insert")
        conn.execute("ALTER TABLE mailroom.mailboxes DISABLE TRIGGER after_mailboxes_deleted")
        conn.execute("ALTER TABLE mailroom.messages ADD CONSTRAINT messages_mailbox_id_fkey FOREIGN KEY (mailbox_id)"
                     " REFERENCES mailroom.mailboxes (id) ON DELETE CASCADE")
    else:
        conn.execute("ALTER TABLE mailroom.messages DROP CONSTRAINT IF EXISTS messages_mailbox_id_fkey")
        conn.execute("ALTER TABLE mailroom.messages ENABLE TRIGGER before_message_insert")
        conn.execute("ALTER TABLE mailroom.mailboxes ENABLE TRIGGER after_mailboxes_deleted")


def run(url: str, quick: bool, progress: Callable[[str], None]) -> list[dict]:
    n = 10**4 if quick else int(os.environ.get("MAILROOM_BENCH_PURGE_INBOXES", "100000"))
    rows: list[dict] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT mailroom.maintain_partitions()")
        partitions = conn.execute("SELECT count(*) FROM pg_inherits"
                                  " WHERE inhparent = 'mailroom.messages'::regclass").fetchone()[0]
        times: dict[str, list[float]] = {"triggers": [], "cascade": []}
        for round_ in range(2):
            for how in ("cascade", "triggers") if round_ % 2 == 0 else ("triggers", "cascade"):
                _load(conn, n)
                _cascade(conn, how == "cascade")
                took, purged = _purge_all(conn)
                left = conn.execute("SELECT count(*) FROM mailroom.messages").fetchone()[0]
                _cascade(conn, False)
                assert purged == n and left == 0, (how, purged, left)
                times[how].append(took)
                progress(f"purge_mailboxes of {n:,} inboxes ({how}): {took:.2f} s")
    ours, ref = min(times["triggers"]), min(times["cascade"])
    note = f"{n:,} inactive inboxes, 2 messages each over {partitions} partitions of messages; best of 2, alternated"
    rows.append({"area": AREA, "benchmark": "purge_mailboxes, every batch until none (statement trigger)",
                 "value": round(n / ours), "unit": "inboxes/s", "note": note})
    rows.append({"area": AREA, "benchmark": "reference: the same purge through ON DELETE CASCADE (before 0181)",
                 "value": round(n / ref), "unit": "inboxes/s", "note": note})
    rows.append({"area": AREA, "benchmark": "purge_mailboxes speed-up over the cascade",
                 "value": round(ref / ours, 1), "unit": "ratio",
                 "note": "goal: no slower than before partitioning (issue 25; 10^6 inboxes: MAILROOM_BENCH_PURGE_INBOXES)"})
    return rows


if __name__ == "__main__":  # pragma: no cover - handy for a scratch database
    for r in run(sys.argv[1], "--quick" in sys.argv, lambda m: print(m, file=sys.stderr)):
        print(r)
