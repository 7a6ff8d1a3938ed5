"""Per recipient domain limits through real sessions and real SMTP (docs/limits.md).

- two claimers racing for a capped domain: the per-domain lock makes the loser skip, never wait,
  and the cap holds at every committed instant while several threads claim and finalize;
- four `mailroom send` processes against an aiosmtpd sink on 127.0.0.1 that counts, per
  recipient domain, the transactions inside DATA at the same time: the capped domain never
  exceeds its cap, the others go wider, every message arrives exactly once;
- a sink answering 421 for one domain: that domain backs off, the others keep flowing, and it
  flows again once the backoff is over.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from aiosmtpd.controller import Controller
from outbound_support import SEND_FLAGS, add_sender, free_port

from mailroom import testing

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
CLAIM = "SELECT id, claim_token FROM mailroom.claim_messages(%s, %s)"
FINALIZE = "SELECT count(*) FROM mailroom.finalize_messages(%s::bigint[], %s::bigint[], %s::text[])"


def enqueue_to(conn: psycopg.Connection, domain: str, n: int, tag: str = "") -> None:
    conn.execute(
        "SELECT count(mailroom.enqueue_message('main', ARRAY['r' || g || %s], %s || g, 'body')) "
        "FROM generate_series(1, %s) AS g",
        (f"@{domain}", f"{tag or domain} ", n),
    )


def in_flight(conn: psycopg.Connection, domain: str) -> int:
    return conn.execute(
        "SELECT count(*) FROM mailroom.outbound_messages WHERE status = 'processing' AND rcpt_domain = %s", (domain,)
    ).fetchone()[0]


def sender_url(db_url: str) -> str:
    return testing.as_login(db_url, "mr_sender")


# ---------------------------------------------------------------------------------------------
# two sessions


def test_a_claimer_skips_a_domain_another_claimer_holds(conn, db_url):
    add_sender(conn, 2525)
    conn.execute("SELECT mailroom.set_domain_limit('capped.test', 2, NULL)")
    # c1, o1..o9, c2..c5, o10..o20: a's claim of 1 locks its window of the queue (c1, o1..o9);
    # b's window then holds capped.test rows too, whose domain a is holding
    enqueue_to(conn, "capped.test", 1, tag="c1")
    enqueue_to(conn, "other.test", 9, tag="o1")
    enqueue_to(conn, "capped.test", 4, tag="c2")
    enqueue_to(conn, "other.test", 11, tag="o2")
    url = sender_url(db_url)
    with psycopg.connect(url) as a, psycopg.connect(url, autocommit=True) as b:
        # a fails instead of hanging if the claim ever waits for the other session's lock
        b.execute("SET statement_timeout = '5s'")
        rows_a = a.execute(CLAIM, (1, "a")).fetchall()  # a's transaction stays open: it holds capped.test
        domains_a = conn.execute(
            "SELECT rcpt_domain FROM mailroom.outbound_messages WHERE id = %s", (rows_a[0][0],)
        ).fetchone()[0]
        assert domains_a == "capped.test"
        rows_b = b.execute(CLAIM, (10, "b")).fetchall()
        got_b = collections.Counter(
            r[0] for r in conn.execute(
                "SELECT rcpt_domain FROM mailroom.outbound_messages WHERE id = ANY(%s)", ([r[0] for r in rows_b],)
            ).fetchall()
        )
        assert got_b == {"other.test": 10}, "b skips the domain a is claiming (no wait) and takes the others"
        a.commit()
        rows_b2 = b.execute(CLAIM, (10, "b")).fetchall()
        got_b2 = collections.Counter(
            r[0] for r in conn.execute(
                "SELECT rcpt_domain FROM mailroom.outbound_messages WHERE id = ANY(%s)", ([r[0] for r in rows_b2],)
            ).fetchall()
        )
        assert got_b2["capped.test"] == 1, "after a committed, b sees a's claim: one slot of two is left"
        assert in_flight(conn, "capped.test") == 2


def test_claim_with_limits_refuses_repeatable_read(conn, db_url):
    add_sender(conn, 2525)
    conn.execute("SELECT mailroom.set_domain_limit('capped.test', 2, NULL)")
    with psycopg.connect(sender_url(db_url)) as c:
        c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.Error) as err:
            c.execute(CLAIM, (1, "rr"))
        assert err.value.sqlstate == "MR323"


def test_racing_claimers_never_exceed_the_cap(conn, db_url):
    """Six sessions claim and finalize as fast as they can; a monitor samples the in-flight count
    of the capped domain after every commit it can see. A claim that read a stale count (say, its
    statement's snapshot taken before a rival's commit) would show up as more than the cap."""
    cap = 3
    add_sender(conn, 2525)
    conn.execute("SELECT mailroom.set_domain_limit('capped.test', %s, NULL)", (cap,))
    enqueue_to(conn, "capped.test", 300)
    enqueue_to(conn, "other.test", 100)
    url = sender_url(db_url)
    stop = threading.Event()
    seen: list[int] = []
    errors: list[BaseException] = []
    claimed = collections.Counter()

    def claimer(name: str) -> None:
        try:
            with psycopg.connect(url, autocommit=True) as c:
                while True:
                    rows = c.execute(CLAIM, (4, name)).fetchall()
                    if not rows:
                        left = c.execute("SELECT queued + processing FROM mailroom.outbound_stats").fetchone()[0]
                        if not left:
                            return
                        continue
                    for mid, _ in rows:
                        claimed[mid] += 1
                    c.execute(FINALIZE, ([r[0] for r in rows], [r[1] for r in rows], ["sent"] * len(rows)))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def monitor() -> None:
        with psycopg.connect(db_url, autocommit=True) as c:
            while not stop.is_set():
                seen.append(in_flight(c, "capped.test"))

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(6)]
    watcher = threading.Thread(target=monitor)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    stop.set()
    watcher.join(timeout=10)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    assert max(seen) <= cap, f"in flight for capped.test reached {max(seen)} (cap {cap})"
    assert max(seen) >= 1
    sent = conn.execute("SELECT count(*) FROM mailroom.outbound_messages WHERE status = 'sent'").fetchone()[0]
    assert sent == 400
    assert len(claimed) == 400 and max(claimed.values()) == 1, "every message claimed exactly once"


# ---------------------------------------------------------------------------------------------
# four senders against a sink that counts concurrent transactions per domain


class CountingSink:
    """Accepts mail, holds each DATA for `hold` seconds, and records per recipient domain the
    largest number of transactions inside DATA at once. `throttle`: domains answered with 421 at
    RCPT (while `throttling` is set)."""

    def __init__(self, hold: float, throttle: tuple[str, ...] = ()):
        self.hold = hold
        self.throttle = set(throttle)
        self.throttling = True
        self.lock = threading.Lock()
        self.now: collections.Counter[str] = collections.Counter()
        self.peak: collections.Counter[str] = collections.Counter()
        self.delivered: collections.Counter[str] = collections.Counter()  # by Message-ID
        self.by_domain: collections.Counter[str] = collections.Counter()
        self.refused: collections.Counter[str] = collections.Counter()

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802
        domain = address.rsplit("@", 1)[-1].lower()
        if self.throttling and domain in self.throttle:
            with self.lock:
                self.refused[domain] += 1
            return "421 4.7.0 too many connections from your host, slow down"
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802
        domain = envelope.rcpt_tos[0].rsplit("@", 1)[-1].lower()
        with self.lock:
            self.now[domain] += 1
            self.peak[domain] = max(self.peak[domain], self.now[domain])
        try:
            await asyncio.sleep(self.hold)
        finally:
            with self.lock:
                self.now[domain] -= 1
        mid = next(
            (line.split(b":", 1)[1].strip().decode() for line in envelope.original_content.splitlines()
             if line.lower().startswith(b"message-id:")),
            "",
        )
        with self.lock:
            self.delivered[mid] += 1
            self.by_domain[domain] += 1
        return "250 2.0.0 Ok: queued"


@pytest.fixture
def sink():
    started: list[Controller] = []

    def start(**kw) -> tuple[CountingSink, int]:
        handler = CountingSink(**kw)
        port = free_port()
        controller = Controller(handler, hostname="127.0.0.1", port=port)
        controller.start()
        started.append(controller)
        return handler, port

    yield start
    for controller in started:
        controller.stop()


def test_four_senders_hold_the_cap_of_one_domain(conn, cli_popen, sink):
    handler, port = sink(hold=0.25)
    add_sender(conn, port)
    conn.execute("SELECT mailroom.set_domain_limit('capped.test', 2, NULL)")
    # interleaved, so every claim sees the capped domain next to the others
    for _ in range(6):
        enqueue_to(conn, "capped.test", 4)
        enqueue_to(conn, "open1.test", 4)
        enqueue_to(conn, "open2.test", 4)
    total = 72
    procs = [
        cli_popen("send", "--until-idle", "--concurrency", "4", "--batch-size", "2", "--worker", f"s{i}",
                  "--reap-after", "0", *SEND_FLAGS)
        for i in range(4)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-500:]
    left = conn.execute("SELECT count(*) FROM mailroom.outbound_messages WHERE status <> 'sent'").fetchone()[0]
    assert left == 0
    assert len(handler.delivered) == total and max(handler.delivered.values()) == 1, "each message exactly once"
    assert handler.by_domain == {"capped.test": 24, "open1.test": 24, "open2.test": 24}
    assert handler.peak["capped.test"] <= 2, f"capped.test had {handler.peak['capped.test']} transactions at once"
    assert handler.peak["capped.test"] >= 1
    # the other domains are not held to the cap: 16 slots took them several at a time
    assert max(handler.peak["open1.test"], handler.peak["open2.test"]) > 2, dict(handler.peak)


def send_at(cli, when: datetime, *extra: str):
    env = {"PGOPTIONS": f"-c mailroom.clock={when.isoformat()}"}
    result = cli("send", "--until-idle", *SEND_FLAGS, *extra, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result


def test_a_throttling_domain_backs_off_and_the_others_flow(conn, cli, sink):
    handler, port = sink(hold=0.0, throttle=("slow.test",))
    add_sender(conn, port)
    for i in range(20):  # s, f, s, f, ... so the first batch holds both
        enqueue_to(conn, "slow.test", 1, tag=f"slow {i}")
        enqueue_to(conn, "fast.test", 1, tag=f"fast {i}")

    # one slot, batches of 5: the first batch is s, f, s, f, s; the three 421s back slow.test off
    send_at(cli, T0, "--concurrency", "1", "--batch-size", "5")
    assert handler.by_domain["fast.test"] == 20, "the other domain kept flowing"
    assert handler.refused["slow.test"] == 3, "only the first batch reached the throttling domain"
    state = conn.execute(
        "SELECT backoff_until, backoff_level FROM mailroom.domain_state WHERE domain = 'slow.test'"
    ).fetchone()
    assert state == (T0 + timedelta(minutes=1), 1)
    slow = dict(conn.execute(
        "SELECT attempts, count(*) FROM mailroom.outbound_messages WHERE rcpt_domain = 'slow.test' "
        "AND status = 'queued' GROUP BY attempts"
    ).fetchall())
    assert slow == {1: 3, 0: 17}, "the refused ones retry by attempts², the rest were never claimed"

    send_at(cli, T0 + timedelta(seconds=59))
    assert handler.refused["slow.test"] == 3 and handler.by_domain["slow.test"] == 0, "nothing during the backoff"

    handler.throttling = False
    send_at(cli, T0 + timedelta(minutes=1))
    assert handler.by_domain["slow.test"] == 20, "after the backoff the domain flows again"
    assert conn.execute(
        "SELECT backoff_until, backoff_level FROM mailroom.domain_state WHERE domain = 'slow.test'"
    ).fetchone() == (None, 0), "a success cleared the backoff"
    assert len(handler.delivered) == 40 and max(handler.delivered.values()) == 1


def test_limits_cli(conn, cli):
    result = cli("outbound", "limits", "set", "Example.COM", "--max-in-flight", "5", "--max-per-minute", "100")
    assert result.returncode == 0, result.stderr
    assert "example.com" in result.stdout
    result = cli("outbound", "limits", "set", "*.example.com", "--max-in-flight", "2")
    assert result.returncode == 0, result.stderr
    result = cli("outbound", "limits", "list")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["PATTERN", "MAX_IN_FLIGHT", "MAX_PER_MINUTE", "UPDATED_AT"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["*.example.com", "2", "-"], ["example.com", "5", "100"], ["*", "-", "-"]
    ]
    assert conn.execute(
        "SELECT max_in_flight FROM mailroom_internal._domain_limit('a.example.com')"
    ).fetchone()[0] == 2
    result = cli("outbound", "limits", "remove", "example.com")
    assert result.returncode == 0 and "removed" in result.stdout
    result = cli("outbound", "limits", "remove", "example.com")
    assert result.returncode == 1 and result.stderr.startswith("mailroom: error: ") and len(
        result.stderr.strip().splitlines()) == 1
    result = cli("outbound", "limits", "set", "bad pattern!", "--max-in-flight", "1")
    assert result.returncode == 2 and "MR370" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = cli("outbound", "limits", "remove", "*")
    assert result.returncode != 0 and "cannot be removed" in result.stderr
    result = cli("outbound", "limits", "status")
    assert result.returncode == 0, result.stderr
