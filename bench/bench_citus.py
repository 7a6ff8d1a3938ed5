"""Citus: the per-operation overhead of the distributed layout against a single node, same run.

A coordinator with two workers (mailroom.testing.start_citus, all on 127.0.0.1, 8 shards a table,
one a worker for the outbound queue) is started beside the bench cluster; each operation runs on
the single node and on the coordinator in alternating rounds (A B A B), one session each, and
the row gives the median time per call on both and their ratio. These 2 cores cannot show a
speed-up: the rows measure the coordinator's overhead per call (planning, routing, two-phase
commits), which is what a deployment of one coordinator and N workers pays per operation
(docs/scale.md). Skipped when Citus is not installed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import psycopg
from psycopg.types.json import Jsonb

from mailroom import testing
from mailroom.db import citus as citus_db
from mailroom.db.connect import connect

AREA = "citus"
CLAIM = "claim_messages(10) + finalize_messages (per call, 10 messages)"
RAW = ("From: a@example.com\r\nTo: x@mailroom.test\r\nSubject: bench\r\n\r\n" + "x" * 1900 + "\r\n").encode()
PARSED = Jsonb({"subject": "bench", "from_header": "a@example.com", "text_body": "x" * 1900 + "\n"})  # as the server parses RAW


def _setup(conn: psycopg.Connection) -> None:
    conn.execute("SELECT mailroom.upsert_sender('bench', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    conn.execute("SELECT (mailroom.create_mailbox(60)).address")
    # every round delivers to one inbox: the plan's message cap must not end the run
    conn.execute("UPDATE mailroom.plans SET max_messages = 100000000")


def _ops(conn: psycopg.Connection, n: int, claimed: list[int]) -> dict[str, Callable[[int], None]]:
    box = conn.execute("SELECT (mailroom.create_mailbox(60)).address").fetchone()[0]
    tag = str(time.monotonic_ns())

    def enqueue(i: int) -> None:
        conn.execute("SELECT mailroom.enqueue_message('bench', ARRAY[%s], 's', 'b')", (f"r{tag}{i}@example.com",))

    def claim_finalize(i: int) -> None:
        # the queue holds more than the round claims (_fill_queue): every claim finds work, as a
        # busy sender's does; how many rows each got is reported beside the time
        rows = conn.execute("SELECT id, claim_token FROM mailroom.claim_messages(10, 'bench')").fetchall()
        claimed.append(len(rows))
        if rows:
            conn.execute(
                "SELECT count(*) FROM mailroom.finalize_messages(%s, %s, %s)",
                ([r[0] for r in rows], [r[1] for r in rows], ["sent"] * len(rows)),
            )

    def create_mailbox(i: int) -> None:
        conn.execute("SELECT (mailroom.create_mailbox(60)).address")

    def deliver(i: int) -> None:
        # the form the inbound server calls (the parsed fields as one document), not the previous
        # release's field-by-field form, a SQL wrapper over it (parsed and planned at every call)
        conn.execute(
            "SELECT mailroom.deliver_message(p_address => %s, p_raw => %s, p_envelope_from => %s, p_parsed => %s)",
            (box, RAW, "bench@example.com", PARSED),
        )

    def create_account(i: int) -> None:
        conn.execute("SELECT mailroom.create_account(%s, %s)", (f"a{tag}{i}@example.com", f"l{tag}{i}"))

    links: list[str] = []

    def dequeue_token(i: int) -> None:
        # the token create_account made in this round (oldest pending first): on Citus a fan-out
        # read of pending tokens, then one statement on the token's shard
        row = conn.execute("SELECT signed FROM mailroom.dequeue_tokens(1)").fetchone()
        if row:
            links.append(row[0])

    def consume_token(i: int) -> None:
        # by the link's digest: on Citus its first read fans out to every shard of tokens
        if links:
            conn.execute("SELECT outcome FROM mailroom.consume_token(%s)", (links.pop(0),)).fetchone()

    def empty_claim(i: int) -> None:
        conn.execute("SELECT count(*) FROM mailroom.claim_messages(10, 'idle')").fetchone()

    return {
        "enqueue_message": enqueue,
        CLAIM: claim_finalize,
        "create_mailbox": create_mailbox,
        "deliver_message (2 KB)": deliver,
        "create_account": create_account,
        "dequeue_tokens(1)": dequeue_token,
        "consume_token (activation link)": consume_token,
        "claim_messages(10), nothing due": empty_claim,
    }


def _fill_queue(conn: psycopg.Connection, count: int) -> None:
    """Queue `count` messages (untimed) before a round of claims, so no claim of the round finds the queue empty."""
    tag = time.monotonic_ns()
    conn.execute(
        "SELECT count(mailroom.enqueue_message('bench', ARRAY['q' || %s || '-' || g || '@example.com'], 's', 'b'))"
        " FROM generate_series(1, %s) AS g",
        (str(tag), count),
    )


def _time(op: Callable[[int], None], start: int, n: int) -> float:
    t0 = time.perf_counter()
    for i in range(start, start + n):
        op(i)
    return (time.perf_counter() - t0) / n * 1000


def run(url: str, quick: bool, progress: Callable[[str], None]) -> list[dict]:
    if not citus_db.citus_installed():
        return [{"area": AREA, "benchmark": "skipped: the Citus extension is not installed (../shared/citus/build.sh)",
                 "value": float("nan"), "unit": "", "note": ""}]
    n, rounds = (20, 2) if quick else (100, 5)
    progress("starting a coordinator and two workers")
    topology = testing.start_citus(workers=2, fast=False)  # durable, as the bench cluster
    try:
        curl = testing.citus_database(topology, "mailroom_bench")
        with connect(url, autocommit=True) as single, connect(curl, autocommit=True) as coordinator:
            for conn in (single, coordinator):
                _setup(conn)
            claimed: dict[str, list[int]] = {"single": [], "citus": []}
            ops = {kind: _ops(c, n, claimed[kind]) for kind, c in (("single", single), ("citus", coordinator))}
            times: dict[str, dict[str, list[float]]] = {name: {"single": [], "citus": []} for name in ops["single"]}
            for r in range(rounds):
                progress(f"round {r + 1} of {rounds}")
                for name in times:
                    for kind in ("single", "citus"):  # A B A B: the same machine state for both
                        if name == CLAIM:
                            _fill_queue(single if kind == "single" else coordinator, 10 * n + 20)
                        times[name][kind].append(_time(ops[kind][name], r * n, n))
    finally:
        testing.stop_citus(topology)
    rows = []
    for name, t in times.items():
        single_ms, citus_ms = statistics.median(t["single"]), statistics.median(t["citus"])
        note = f"single node {single_ms:.2f} ms; overhead {citus_ms / single_ms:.1f}x; median of {rounds} rounds of {n}"
        if name == CLAIM:
            # a claim on Citus stays on one worker once it has rows (sql/citus/20): fewer rows a call
            # than on one node when the queue's head is spread over the workers
            note += "; rows a claim: " + ", ".join(
                f"{kind} {statistics.mean(claimed[kind]):.1f}" for kind in ("single", "citus") if claimed[kind]
            )
        rows.append({
            "area": AREA, "benchmark": f"{name}: coordinator with 2 workers, per call", "value": citus_ms, "unit": "ms",
            "note": note,
        })
    return rows
