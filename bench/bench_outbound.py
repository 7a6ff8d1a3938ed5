"""Outbound queue: SQL-only claim + finalize rate, end-to-end delivery rate, claim latency vs size.

1. SQL-only cycle: claim_messages(batch) then finalize_messages(all 'sent'), each its own
   autocommit transaction (2 commits per batch), one worker, at batch 1, 100 and 500.
2. End to end: `mailroom send --until-idle` subprocesses (1 and 4 of them, --concurrency 4 each)
   draining 20,000 queued messages (quick: 1,000) to Postfix's smtp-sink (a C sink, the real
   ceiling) and to an aiosmtpd sink in this process; wall time includes process start-up. The
   ratio column compares with pgbench's single-row commit rate of the same run.
3. Claim latency (claim 100 + release, so the queue keeps its size) with 10^3, 10^5 and 10^6
   queued rows (quick: 10^3, 10^4, 10^5), after ANALYZE: p50 and max of 30 calls.
4. Priorities (issue 23) on the largest of those queues: the same claim latency once the rows carry
   priorities spread over -10..10, as a ratio of the single-priority latency of the same run; that
   each claim took the highest priority due; that the plan still walks outbound_messages_due_idx;
   and the cost of a tenth of the queue at the top priority that is not due yet (scheduled later):
   the claim steps over those index entries.

5. Postfix as the reference peer (issue 25, bench/postfix_peer.py): a private Postfix's hold queue
   of 10,000 ~2 KB messages (quick: 1,000) released to smtp-sink by its smtp(8) client, against
   `mailroom send` (1 and 4 senders) draining as many ~2 KB messages to the same sink; interleaved,
   3 rounds (quick: 2), medians and the ratio to Postfix of the same run.

The backlog is loaded with INSERT ... SELECT (the measured calls are the real SQL API).
"""

from __future__ import annotations

import collections
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from aiosmtpd.controller import Controller

from bench import postfix_peer, smtp_tools
from mailroom.outbound import sqlapi as outbound

AREA = "outbound"
ROOT = Path(__file__).resolve().parents[1]



def _row(benchmark: str, value: float, unit: str, note: str = "") -> dict:
    return {"area": AREA, "benchmark": benchmark, "value": value, "unit": unit, "note": note}


# ~2 KB on the wire (2,048 bytes with mailroom's headers): the size of smtp-source's -l 2000 message
# (2,000 bytes of body plus its own headers), for the rows compared with Postfix
TEXT_2KB = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod.\n" * 24


def _fill(conn: psycopg.Connection, n: int, text_body: str | None = None) -> None:
    """n queued messages of sender 'bench' in one statement (text_body: one plain-text body for all)."""
    if text_body is not None:
        conn.execute(
            """
            INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id)
            SELECT s.id, ARRAY['rcpt' || g || '@example.com'], 'bench ' || g, %s,
                   '<' || md5(random()::text || g) || '@mailroom.test>'
            FROM mailroom.senders AS s, generate_series(1, %s) AS g
            WHERE s.name = 'bench'
            """,
            (text_body, n),
        )
        return
    conn.execute(
        """
        INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, html_body, message_id)
        SELECT s.id, ARRAY['rcpt' || g || '@example.com'], 'bench ' || g, 'text body ' || g, '<p>html ' || g || '</p>',
               '<' || md5(random()::text || g) || '@mailroom.test>'
        FROM mailroom.senders AS s, generate_series(1, %s) AS g
        WHERE s.name = 'bench'
        """,
        (n,),
    )


def _sql_cycle(conn: psycopg.Connection, batch: int, total: int) -> float:
    conn.execute("TRUNCATE mailroom.outbound_messages")
    _fill(conn, total)
    conn.execute("VACUUM ANALYZE mailroom.outbound_messages")
    done = 0
    started = time.perf_counter()
    while True:
        rows = outbound.claim_messages.rows(conn, limit=batch, worker="bench")
        if not rows:
            break
        ids = [r.id for r in rows]
        outbound.finalize_messages.rows(conn, ids=ids, claim_tokens=[r.claim_token for r in rows],
                                        outcomes=["sent"] * len(ids))
        done += len(ids)
    elapsed = time.perf_counter() - started
    assert done == total, f"cycled {done} of {total}"
    return total / elapsed


class _Sink:
    """Accepts everything and counts deliveries per Message-ID (the exactly-once check)."""

    def __init__(self) -> None:
        self.count = 0
        self.ids: collections.Counter[bytes] = collections.Counter()
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):  # noqa: N802
        match = _MESSAGE_ID.search(envelope.original_content or b"")
        with self.lock:
            self.count += 1
            self.ids[match.group(1) if match else b""] += 1
        return "250 2.0.0 Ok"

    def reset(self) -> None:
        with self.lock:
            self.count = 0
            self.ids.clear()


_MESSAGE_ID = re.compile(rb"^Message-ID:\s*(\S+)", re.M | re.I)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _end_to_end(conn: psycopg.Connection, url: str, processes: int, total: int, sink: _Sink | None,
                port: int, extra: list[str] | None = None, text_body: str | None = None) -> float:
    if sink is not None:
        sink.reset()
    outbound.upsert_sender.call(conn, name="bench", from_address="bench@mailroom.test", host="127.0.0.1", port=port)
    conn.execute("TRUNCATE mailroom.outbound_messages")
    _fill(conn, total, text_body)
    conn.execute("VACUUM ANALYZE mailroom.outbound_messages")
    env = dict(os.environ, MAILROOM_DATABASE_URL=url, PYTHONPATH=str(ROOT / "driver"))
    argv = [sys.executable, "-m", "mailroom", "send", "--until-idle", "--concurrency", "4", "--batch-size", "100",
            "--poll-interval", "0.2s", "--reap-after", "0", *(extra or [])]
    started = time.perf_counter()
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(processes)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"mailroom send failed: {err.decode()[-300:]}")
    elapsed = time.perf_counter() - started
    sent = conn.execute("SELECT count(*) FROM mailroom.outbound_messages WHERE status = 'sent'").fetchone()[0]
    assert sent == total, f"{sent} of {total} sent"
    return total / elapsed


def _postfix_reference(conn: psycopg.Connection, url: str, quick: bool,
                       progress: Callable[[str], None]) -> list[dict]:
    """Postfix as the reference peer (issue 25): its hold queue drained by its smtp(8) client to
    Postfix's smtp-sink, and `mailroom send` (1 and 4 senders) draining the same count of ~2 KB
    messages to the same sink; interleaved (Postfix, mailroom x1, mailroom x4, Postfix, ...),
    medians and the ratio to Postfix's median of the same run."""
    benches = ("Postfix: hold queue released, smtp(8) -> smtp-sink", "mailroom send, 1 sender -> smtp-sink",
               "mailroom send, 4 senders -> smtp-sink")
    if not postfix_peer.available():
        return [_row(f"reference peer: {b}", float("nan"), "", postfix_peer.SKIPPED) for b in benches]
    total, reps = (1000, 2) if quick else (10000, 3)
    rates: dict[str, list[float]] = {b: [] for b in benches}
    sink = smtp_tools.SmtpSink()
    peer = None
    try:
        peer = postfix_peer.PostfixPeer("outbound", relay_port=sink.port)
        for rep in range(reps):
            progress(f"Postfix reference, run {rep + 1}/{reps}: injecting {total} messages on hold")
            smtp_tools.smtp_source(peer.port, 4, total, 2000, "bench@example.com", "rcpt@example.com")
            peer.wait_held(total)
            elapsed = peer.release_and_drain(total)
            rates[benches[0]].append(total / elapsed)
            progress(f"Postfix drained {total} in {elapsed:.2f}s ({total / elapsed:,.0f} msgs/s)")
            for procs, name in ((1, benches[1]), (4, benches[2])):
                rate = _end_to_end(conn, url, procs, total, None, sink.port, text_body=TEXT_2KB)
                rates[name].append(rate)
                progress(f"{name}: {rate:,.0f} msgs/s")
    finally:
        if peer is not None:
            peer.close()
        sink.close()
        conn.execute("TRUNCATE mailroom.outbound_messages")
    ref = statistics.median(rates[benches[0]])
    rows = []
    for name in benches:
        med = statistics.median(rates[name])
        runs = ", ".join(f"{r:,.0f}" for r in rates[name])
        if name == benches[0]:
            note = (f"reference: median of {reps} runs ({runs}); {total} msgs of ~2 KB (smtp-source -l 2000) "
                    "injected on hold (not timed), then postsuper -H ALL + postqueue -f until the queue is empty; "
                    "default_destination_concurrency_limit 20")
        else:
            note = (f"{med / ref:.2f}x Postfix ({ref:,.0f} msgs/s, same run, interleaved); median of {reps} runs "
                    f"({runs}); {total} queued msgs of ~2,050 bytes, --concurrency 4 each, "
                    "start-up included")
        rows.append(_row(f"reference peer: {name}", med, "msgs/s", note))
    return rows


def _claim_latency(conn: psycopg.Connection, calls: int = 30) -> tuple[float, float]:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        rows = outbound.claim_messages.rows(conn, limit=100, worker="bench")
        times.append((time.perf_counter() - t0) * 1000)
        outbound.release_messages.call(conn, ids=[r.id for r in rows], claim_tokens=[r.claim_token for r in rows])
    return statistics.median(times), max(times)


def _priorities(conn: psycopg.Connection, size: int, single_p50: float, progress: Callable[[str], None]) -> list[dict]:
    """Section 4 of the module docstring, on the `size` queued rows the latency section left."""
    rows: list[dict] = []
    progress(f"priorities: spreading {size:,} queued rows over -10..10")
    conn.execute("UPDATE mailroom.outbound_messages SET priority = (id % 21) - 10 WHERE status = 'queued'")
    conn.execute("VACUUM ANALYZE mailroom.outbound_messages")
    plan = "\n".join(r[0] for r in conn.execute("SELECT * FROM mailroom_internal._explain_claim(100)"))
    uses_index = bool(re.search(r"Index Scan using outbound_messages_\w+_due_idx", plan))
    seq = re.findall(r"Seq Scan on (outbound_messages\w*)", plan)
    p50, worst = _claim_latency(conn)
    claimed = outbound.claim_messages.rows(conn, limit=100, worker="bench-prio")
    ids = [r.id for r in claimed]
    top = {p for (p,) in conn.execute("SELECT priority FROM mailroom.outbound_messages WHERE id = ANY(%s)", (ids,))}
    outbound.release_messages.call(conn, ids=ids, claim_tokens=[r.claim_token for r in claimed])
    rows.append(_row(f"claim_messages(100) latency, {size:,} queued over 21 priorities", p50, "ms",
                     f"p50 of 30 calls (max {worst:.1f} ms), {p50 / single_p50:.2f}x the one-priority latency of the "
                     f"same run; claimed priorities {sorted(top)} (10 = the highest); plan walks the due index: "
                     f"{'yes' if uses_index else 'NO'}{'' if not seq else ', seq scans: ' + ', '.join(seq)}"))
    scheduled = size // 10
    progress(f"priorities: {scheduled:,} top-priority rows scheduled later")
    conn.execute("UPDATE mailroom.outbound_messages SET priority = 10, next_retry_at = now() + interval '1 day'"
                 " WHERE id IN (SELECT id FROM mailroom.outbound_messages WHERE status = 'queued' ORDER BY id LIMIT %s)",
                 (scheduled,))
    conn.execute("VACUUM ANALYZE mailroom.outbound_messages")
    p50_sched, worst_sched = _claim_latency(conn)
    rows.append(_row(f"claim_messages(100) latency, {size:,} queued, {scheduled:,} of the top priority not due yet",
                     p50_sched, "ms", f"p50 of 30 calls (max {worst_sched:.1f} ms), {p50_sched / single_p50:.2f}x the "
                     "one-priority latency: the claim steps over the not-yet-due entries of higher priorities"))
    return rows


def run(url: str, quick: bool, progress: Callable[[str], None]) -> list[dict]:
    rows: list[dict] = []
    sink = _Sink()
    port = _free_port()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            outbound.upsert_sender.call(conn, name="bench", from_address="bench@mailroom.test", host="127.0.0.1", port=port)

            for batch, total in ((1, 500 if quick else 3000), (100, 5000 if quick else 50000),
                                 (500, 10000 if quick else 100000)):
                progress(f"SQL-only claim+finalize, batch {batch}, {total} messages")
                rate = _sql_cycle(conn, batch, total)
                rows.append(_row(f"SQL-only claim+finalize cycle, batch {batch}", rate, "msgs/s",
                                 f"{total} msgs, 1 worker, 2 commits per batch"))

            total = 1000 if quick else 20000
            postfix = smtp_tools.SmtpSink()
            try:
                for procs in (1, 4):
                    progress(f"end to end to smtp-sink, {procs} sender process(es), {total} messages")
                    rate = _end_to_end(conn, url, procs, total, None, postfix.port)
                    rows.append(_row(f"end-to-end to Postfix smtp-sink, {procs} sender(s)", rate, "msgs/s",
                                     f"{total} msgs, --concurrency 4 --batch-size 100 each, start-up included; "
                                     "goal >= 2,000 (1 sender) / >= 3,000 (4), about 1.0x pgbench"))
                progress(f"end to end to smtp-sink, 1 sender with --connections 2, {total} messages")
                rate = _end_to_end(conn, url, 1, total, None, postfix.port, ["--connections", "2"])
                rows.append(_row("end-to-end to Postfix smtp-sink, 1 sender, --connections 2", rate, "msgs/s",
                                 f"{total} msgs, --concurrency 4 --connections 2 (8 SMTP connections)"))
            finally:
                postfix.close()
            rows += _postfix_reference(conn, url, quick, progress)
            for procs in (1, 4):
                progress(f"end to end to aiosmtpd sink, {procs} sender process(es), {total} messages")
                rate = _end_to_end(conn, url, procs, total, sink, port)
                rows.append(_row(f"end-to-end to aiosmtpd sink, {procs} sender(s)", rate, "msgs/s",
                                 f"{total} msgs, --concurrency 4 --batch-size 100 each, start-up included; "
                                 "the sink (one Python thread in the bench process) is the limit"))
            conn.execute("TRUNCATE mailroom.outbound_messages")
            have = 0
            for size in ((10**3, 10**4, 10**5) if quick else (10**3, 10**5, 10**6)):
                progress(f"claim latency with {size:,} queued rows")
                _fill(conn, size - have)
                have = size
                conn.execute("VACUUM ANALYZE mailroom.outbound_messages")
                p50, worst = _claim_latency(conn)
                rows.append(_row(f"claim_messages(100) latency, {size:,} queued", p50, "ms",
                                 f"p50 of 30 calls (max {worst:.1f} ms), claim + release keeps the size"))
            rows += _priorities(conn, have, p50, progress)
    finally:
        controller.stop()
    return rows


if __name__ == "__main__":  # the priorities section alone: python -m bench.bench_outbound [SIZE]
    from bench.run import progress as say
    from bench.run import start_cluster
    from mailroom import testing as _testing

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10**6
    cluster = start_cluster()
    try:
        db = _testing.migrated_database(cluster, "bench_priorities")
        with psycopg.connect(db, autocommit=True) as c:
            outbound.upsert_sender.call(c, name="bench", from_address="bench@mailroom.test", host="127.0.0.1", port=25)
            say(f"filling {n:,} queued rows")
            _fill(c, n)
            c.execute("VACUUM ANALYZE mailroom.outbound_messages")
            base, base_worst = _claim_latency(c)
            say(f"one priority: p50 {base:.2f} ms (max {base_worst:.1f})")
            for r in _priorities(c, n, base, say):
                say(f"{r['benchmark']}: {r['value']:.2f} {r['unit']} ({r['note']})")
    finally:
        _testing.stop_cluster(cluster)
