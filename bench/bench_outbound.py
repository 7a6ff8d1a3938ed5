"""Outbound queue: SQL-only claim + finalize rate, end-to-end delivery rate, claim latency vs size.

1. SQL-only cycle: claim_messages(batch) then finalize_messages(all 'sent'), each its own
   autocommit transaction (2 commits per batch), one worker, at batch 1, 100 and 500.
2. End to end: `mailroom send --until-idle` subprocesses (1 and 4 of them, --concurrency 4 each)
   draining 10,000 queued messages (quick: 1,000) to Postfix's smtp-sink (a C sink, the real
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
   `mailroom send` (1 and 4 senders) draining as many ~2 KB messages to the same sink, two ways
   (issue 37): tuned (INSERT ... SELECT, VACUUM ANALYZE, --batch-size 100 --poll-interval 0.2s)
   and default, what a user meets (a burst enqueued through enqueue_message a moment before, no
   ANALYZE, `mailroom send --until-idle` with its defaults); both timed from process start;
   interleaved, 3 rounds (quick: 1; `bench.run --rounds N`), medians and the ratio to Postfix of
   the same run; the machine's fdatasync rate (bench.run, pg_test_fsync) in each row's note. Memory
   (bench.memory, PSS: the metric agreed in docs/architecture.md): Postfix's processes idle and
   draining, one idle `mailroom send`, and the sender processes at their peak while draining.

6. Batch 1, the sender keeping going (issue 37, item 5): finalize_and_claim (one round trip and one
   commit a message) and the two calls it replaces (claim_messages, then finalize_messages), each
   through the driver's contract (psycopg, as `mailroom send` calls it) and through pgbench running the
   same SQL from a script file (bench/finalize_and_claim.pgbench, bench/claim_then_finalize.pgbench);
   interleaved rounds, medians, and the ratio of each pair from the same run. Alone:
   `python -m bench.bench_outbound batch1 [MESSAGES]`.

7. What real senders do (issue 37, item 2; bench/bench_outbound_work.py, rows `real senders: ...`):
   a DKIM-signed drain against Postfix with a private opendkim as its milter (the same 2,048-bit key,
   selector and domain), and 5-recipient messages with per-recipient VERP against Postfix's own
   (sendmail -XV, hold released); default drains, 1 and 4 senders, interleaved, medians, the samples
   of both sides verified on a capturing sink (signature verifies, return paths) before any timing.

The backlog is loaded with INSERT ... SELECT (the measured calls are the real SQL API).
"""

from __future__ import annotations

import collections
import os
import re
import shutil
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
from psycopg.types.composite import CompositeInfo, register_composite

from bench import bench_outbound_work, knobs, memory, postfix_peer, smtp_tools
from mailroom.db import cluster as embedded
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


def _batch1_driver(conn: psycopg.Connection, total: int, together: bool) -> float:
    """msgs/s of one worker at batch 1 through the contract: claim_messages once, then either
    finalize_and_claim per message (together) or finalize_messages then claim_messages."""
    done = 0
    started = time.perf_counter()
    claimed = outbound.claim_messages.rows(conn, limit=1, worker="bench")
    while claimed:
        (message,) = claimed
        if together:
            answered = outbound.finalize_and_claim.rows(
                conn, limit=1, worker="bench", ids=[message.id], claim_tokens=[message.claim_token], outcomes=["sent"]
            )
            assert answered[0].result == "sent"
            claimed = [r.message for r in answered if r.message is not None]
        else:
            (result,) = outbound.finalize_messages.rows(
                conn, ids=[message.id], claim_tokens=[message.claim_token], outcomes=["sent"]
            )
            assert result.result == "sent"
            claimed = outbound.claim_messages.rows(conn, limit=1, worker="bench")
        done += 1
    elapsed = time.perf_counter() - started
    assert done == total, f"cycled {done} of {total}"
    return total / elapsed


def _batch1_pgbench(url: str, total: int, together: bool) -> float:
    """msgs/s of pgbench (1 client, -t total) running the same SQL from its script file: one message a
    script run (finalize_and_claim: one transaction; the two calls: two)."""
    script = ROOT / "bench" / ("finalize_and_claim.pgbench" if together else "claim_then_finalize.pgbench")
    exe = shutil.which("pgbench") or str(embedded.find_bindir() / "pgbench")
    out = subprocess.run([exe, "-n", "-c", "1", "-t", str(total), "-D", "id=0", "-D", "tok=0", "-f", str(script), url],
                         capture_output=True, text=True, timeout=600)
    match = re.search(r"tps = ([\d.]+)", out.stdout)
    if out.returncode != 0 or not match:
        raise RuntimeError(f"pgbench failed: {(out.stderr or out.stdout).strip()[-300:]}")
    return float(match.group(1))


def batch1(conn: psycopg.Connection, url: str, total: int, rounds: int, progress: Callable[[str], None]) -> list[dict]:
    """Section 6 of the module docstring: the driver and pgbench at batch 1, interleaved, medians."""
    runs: dict[tuple[str, bool], list[float]] = collections.defaultdict(list)
    # finalize_and_claim's column message is a mailroom.claimed_message: read as a row, as the sender does
    register_composite(CompositeInfo.fetch(conn, "mailroom.claimed_message"), conn)
    for n in range(rounds):
        for together in (True, False):
            for who in ("driver", "pgbench"):
                progress(f"batch 1, round {n + 1}/{rounds}: {who}, "
                         f"{'finalize_and_claim' if together else 'claim then finalize'}, {total} messages")
                conn.execute("TRUNCATE mailroom.outbound_messages")
                # pgbench ends on a claim (its last run finalizes one message and claims the next): one more
                _fill(conn, total + (who == "pgbench"))
                conn.execute("VACUUM ANALYZE mailroom.outbound_messages")
                runs[who, together].append(_batch1_driver(conn, total, together) if who == "driver"
                                           else _batch1_pgbench(url, total, together))
    rows = []
    for together, name in ((True, "finalize_and_claim"), (False, "claim_messages then finalize_messages")):
        ours, ref = statistics.median(runs["driver", together]), statistics.median(runs["pgbench", together])
        rows.append(_row(
            f"batch 1, {name}: the driver vs pgbench running the same SQL", ours, "msgs/s",
            f"{ours / ref:.2f}x pgbench ({ours:,.0f} vs {ref:,.0f} msgs/s, the same SQL from "
            f"bench/{'finalize_and_claim' if together else 'claim_then_finalize'}.pgbench); 1 worker, {total} msgs, "
            f"medians of {rounds} interleaved rounds; {'one commit' if together else 'two commits'} a message"))
    ours_new, ours_old = statistics.median(runs["driver", True]), statistics.median(runs["driver", False])
    rows.append(_row("batch 1, finalize_and_claim vs claim then finalize (the driver)", ours_new / ours_old, "x",
                     f"{ours_new:,.0f} vs {ours_old:,.0f} msgs/s, the same run"))
    return rows


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
                port: int, extra: list[str] | None = None, text_body: str | None = None,
                default: bool = False, rss: list | None = None) -> float:
    """Drain `total` queued messages with `processes` `mailroom send --until-idle`, timed from their start.

    Tuned (the default of this function): filled by INSERT ... SELECT, VACUUM ANALYZE, then --concurrency 4
    --batch-size 100 --poll-interval 0.2s --reap-after 0. default=True is what a user meets: a burst enqueued
    through enqueue_message a moment before (no VACUUM, no ANALYZE) and `mailroom send --until-idle` with
    every other option at its default. rss: gets this drain's peak sample appended (bench.memory.Peak)."""
    if sink is not None:
        sink.reset()
    outbound.upsert_sender.call(conn, name="bench", from_address="bench@mailroom.test", host="127.0.0.1", port=port)
    conn.execute("TRUNCATE mailroom.outbound_messages")
    env = dict(os.environ, MAILROOM_DATABASE_URL=url, PYTHONPATH=str(ROOT / "driver"))
    if default:
        with conn.transaction():
            for g in range(total):
                outbound.enqueue_message.call(conn, sender="bench", to=[f"rcpt{g}@example.com"], subject=f"bench {g}",
                                              text_body=text_body or f"text body {g}")
        argv = [sys.executable, "-m", "mailroom", "send", "--until-idle", *(extra or [])]
        env = {k: v for k, v in env.items() if not k.startswith("MAILROOM_SEND_")}
    else:
        _fill(conn, total, text_body)
        conn.execute("VACUUM ANALYZE mailroom.outbound_messages")
        argv = [sys.executable, "-m", "mailroom", "send", "--until-idle", "--concurrency", "4", "--batch-size", "100",
                "--poll-interval", "0.2s", "--reap-after", "0", *(extra or [])]
    started = time.perf_counter()
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(processes)]
    with memory.Peak({"send": lambda: [p.pid for p in procs if p.poll() is None]}, reader=memory.pss_kib) as sampler:
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(f"mailroom send failed: {err.decode()[-300:]}")
    elapsed = time.perf_counter() - started
    if rss is not None:
        rss.append(sampler.peaks["send"])
    sent = conn.execute("SELECT count(*) FROM mailroom.outbound_messages WHERE status = 'sent'").fetchone()[0]
    assert sent == total, f"{sent} of {total} sent"
    return total / elapsed


def _idle_sender_rss(url: str, port: int) -> dict:
    """PSS of one `mailroom send` with its defaults, waiting on an empty queue (2 s after start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_SEND_")}
    env |= {"MAILROOM_DATABASE_URL": url, "PYTHONPATH": str(ROOT / "driver")}
    proc = subprocess.Popen([sys.executable, "-m", "mailroom", "send"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(2)
        if proc.poll() is not None:
            raise RuntimeError(f"mailroom send exited with {proc.returncode} on an empty queue")
        return memory.tree(proc.pid, reader=memory.pss_kib)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _fdatasync_note() -> str:
    rate = os.environ.get("MAILROOM_BENCH_FDATASYNC")
    return f"; fdatasync {int(rate):,}/s (pg_test_fsync, same run)" if rate and rate.isdigit() else ""


_TUNED = "tuned: INSERT ... SELECT, VACUUM ANALYZE, --concurrency 4 --batch-size 100"
_DEFAULT = "default: burst enqueued a moment before, no ANALYZE, `send --until-idle` defaults"


def _postfix_reference(conn: psycopg.Connection, url: str, quick: bool,
                       progress: Callable[[str], None]) -> list[dict]:
    """Postfix as the reference peer (issue 25): its hold queue drained by its smtp(8) client to
    Postfix's smtp-sink, and `mailroom send` (1 and 4 senders) draining the same count of ~2 KB
    messages to the same sink, tuned and default (issue 37: see _end_to_end); interleaved (Postfix,
    tuned x1, tuned x4, default x1, default x4, Postfix, ...), medians and the ratio to Postfix's
    median of the same run. Resident memory (bench.memory): Postfix's tree idle and while it drains,
    one idle `mailroom send`, and the sender processes at their peak while they drain."""
    benches = ("Postfix: hold queue released, smtp(8) -> smtp-sink",
               f"mailroom send ({_TUNED}), 1 sender -> smtp-sink",
               f"mailroom send ({_TUNED}), 4 senders -> smtp-sink",
               f"mailroom send ({_DEFAULT}), 1 sender -> smtp-sink",
               f"mailroom send ({_DEFAULT}), 4 senders -> smtp-sink",
               f"mailroom send ({_DEFAULT}), --workers 4 (4 forked senders) -> smtp-sink")
    # each drain: (processes, a user's defaults, extra flags, the key of its memory samples)
    runs_of = {benches[1]: (1, False, [], "1"), benches[2]: (4, False, [], "4"), benches[3]: (1, True, [], "1"),
               benches[4]: (4, True, [], "4"), benches[5]: (1, True, ["--workers", "4"], "workers 4")}
    if not postfix_peer.available():
        return [_row(f"reference peer: {b}", float("nan"), "", postfix_peer.SKIPPED) for b in benches]
    total, reps = (1000 if quick else 10000), knobs.rounds(quick)
    rates: dict[str, list[float]] = {b: [] for b in benches}
    rss: dict[str, dict] = {}
    postfix_loads: list[dict] = []
    drains: dict[str, list[dict]] = {"1": [], "4": [], "workers 4": []}
    sink = smtp_tools.SmtpSink()
    peer = None
    try:
        peer = postfix_peer.PostfixPeer("outbound", relay_port=sink.port)
        time.sleep(1)
        rss["postfix idle"] = {pid: p for root in peer.pids() for pid, p in memory.tree(root, reader=memory.pss_kib).items()}
        for rep in range(reps):
            progress(f"Postfix reference, run {rep + 1}/{reps}: injecting {total} messages on hold")
            smtp_tools.smtp_source(peer.port, 4, total, 2000, "bench@example.com", "rcpt@example.com")
            peer.wait_held(total)
            with memory.Peak({"postfix": peer.pids}, reader=memory.pss_kib) as sampler:
                elapsed = peer.release_and_drain(total)
            postfix_loads.append(sampler.peaks["postfix"])
            rates[benches[0]].append(total / elapsed)
            progress(f"Postfix drained {total} in {elapsed:.2f}s ({total / elapsed:,.0f} msgs/s){_fdatasync_note()}")
            for name, (procs, default, extra, key) in runs_of.items():
                rate = _end_to_end(conn, url, procs, total, None, sink.port, extra=extra, text_body=TEXT_2KB,
                                   default=default, rss=drains[key])
                rates[name].append(rate)
                progress(f"{name}: {rate:,.0f} msgs/s ({rate / rates[benches[0]][-1]:.2f}x this round's Postfix)")
        conn.execute("TRUNCATE mailroom.outbound_messages")
        rss["sender idle"] = _idle_sender_rss(url, sink.port)
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
                    f"default_destination_concurrency_limit 20{_fdatasync_note()}")
        elif runs_of[name][1]:
            note = (f"{med / ref:.2f}x Postfix ({ref:,.0f} msgs/s, same run, interleaved); median of {reps} runs "
                    f"({runs}); {total} msgs of ~2,050 bytes enqueued by enqueue_message in one transaction just "
                    "before (not timed), no VACUUM/ANALYZE, `mailroom send --until-idle` and nothing else (MAILROOM_SEND_* "
                    f"unset), timed from process start{_fdatasync_note()}")
        else:
            note = (f"{med / ref:.2f}x Postfix ({ref:,.0f} msgs/s, same run, interleaved); median of {reps} runs "
                    f"({runs}); {total} queued msgs of ~2,050 bytes by INSERT ... SELECT, VACUUM ANALYZE, "
                    f"--concurrency 4 --batch-size 100 each, timed from process start{_fdatasync_note()}")
        rows.append(_row(f"reference peer: {name}", med, "msgs/s", note))
    rss["postfix load"] = max(postfix_loads, key=memory.total_mib)  # the round that peaked highest
    for key, samples in drains.items():  # the drain whose processes together peaked highest
        rss[f"sender {key}"] = max(samples, key=memory.total_mib)
    for key, label, note in (
            ("postfix idle", "Postfix (outbound), idle", "the master's tree before the first injection: master, "
             "qmgr, pickup, smtpd, ..."),
            ("postfix load", "Postfix (outbound), draining (peak)", "the processes alive at the sample with the "
             "largest sum while Postfix drained its queue (every 250 ms, the round that peaked highest)"),
            ("sender idle", "mailroom send, idle", "one `mailroom send` with its defaults, 2 s after start, "
             "empty queue"),
            ("sender 1", "mailroom send, 1 sender draining (peak)", "the process's largest PSS, sampled every "
             "250 ms, in the drain (tuned or default) where it was largest"),
            ("sender 4", "mailroom send, 4 senders draining (peak)", "the 4 processes' PSS at the sample "
             "(every 250 ms) where their sum was largest, in the drain (tuned or default) where it was largest"),
            ("sender workers 4", "mailroom send --workers 4, draining (peak)", "the parent and its 4 forked "
             "senders (they share the imports and keys the parent loaded), PSS at the sample where their sum was "
             "largest")):
        value = memory.total_mib(rss[key])
        rows.append(_row(f"memory: {label}", value, "MiB", f"PSS: {memory.summary(rss[key])}; {note}"))
        progress(f"memory: {label}: {value:.1f} MiB")
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

            rows += batch1(conn, url, 500 if quick else 2000, knobs.rounds(quick), progress)
            for batch, total in ((1, 500 if quick else 1500), (100, 5000 if quick else 25000),
                                 (500, 10000 if quick else 50000)):
                progress(f"SQL-only claim+finalize, batch {batch}, {total} messages")
                rate = _sql_cycle(conn, batch, total)
                rows.append(_row(f"SQL-only claim+finalize cycle, batch {batch}", rate, "msgs/s",
                                 f"{total} msgs, 1 worker, 2 commits per batch"))

            total = 1000 if quick else 10000
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
            rows += bench_outbound_work.run(conn, url, quick, progress)
            outbound.upsert_sender.call(conn, name="bench", from_address="bench@mailroom.test", host="127.0.0.1",
                                        port=port)
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


if __name__ == "__main__":  # one section alone: python -m bench.bench_outbound [SIZE] | batch1 [MESSAGES]
    from bench.run import progress as say
    from bench.run import start_cluster
    from mailroom import testing as _testing

    if len(sys.argv) > 1 and sys.argv[1] == "batch1":
        messages = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
        cluster = start_cluster()
        try:
            db = _testing.migrated_database(cluster, "bench_batch1")
            with psycopg.connect(db, autocommit=True) as c:
                outbound.upsert_sender.call(c, name="bench", from_address="bench@mailroom.test", host="127.0.0.1",
                                            port=25)
                for r in batch1(c, db, messages, 3, say):
                    say(f"{r['benchmark']}: {r['value']:,.2f} {r['unit']} ({r['note']})")
        finally:
            _testing.stop_cluster(cluster)
        sys.exit(0)
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
