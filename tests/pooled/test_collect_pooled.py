"""`mailroom collect` through PgBouncer (transaction mode): csv and --enqueue, polling or LISTEN direct.

Each test runs far more than five calls of the same statement in a row, the point where psycopg
would prepare it server-side (which a transaction pooler breaks; the test PgBouncer hands a
client's transactions to its server connections in turn). A ROLLBACK makes psycopg forget what it
prepared, so the backlog is inserted in one statement and drained in many committed batches.
"""

from __future__ import annotations

import time

import pytest
from collector_support import Collector, assert_exactly_once, bulk_accounts_sql, create_accounts, wait_committed
from pooled_support import POOLER_SELFTEST_WARNING, wait_until


@pytest.fixture
def collectors():
    started: list[Collector] = []

    def start(url: str, *args: str, **env: str) -> Collector:
        c = Collector(url, *args, env={k.upper(): v for k, v in env.items()})
        started.append(c)
        return c

    yield start
    for c in started:
        c.kill()


def wait_rows(conn, query: str, n: int, timeout: float = 20) -> list[tuple]:
    deadline = time.monotonic() + timeout
    rows: list[tuple] = []
    while time.monotonic() < deadline:
        rows = conn.execute(query).fetchall()
        if len(rows) >= n:
            return rows
        time.sleep(0.05)
    return rows


def test_collect_csv_through_the_pooler_polls_and_collects_every_token(collectors, conn, urls):
    """No listen URL: the default (the pooled URL) fails its self-test, says so once, and polls."""
    u = urls("collector")
    c = collectors(u.database, "--poll-interval", "100ms", mailroom_batch_limit="4")
    c.wait_stderr("polling every 100 ms until it is back")
    conn.execute(bulk_accounts_sql("bulk", 48))  # 12 committed batches of 4 in a row
    logins = [f"bulk{i}" for i in range(48)]
    records = c.records(48, timeout=15)
    for wave in range(3):
        logins += create_accounts(conn, f"w{wave}x", 5)
        records += c.records(len(logins) - len(records), timeout=15)
    c.assert_quiet(0.5)
    assert_exactly_once(records, logins)
    err = c.stderr_text()
    assert err.count(POOLER_SELFTEST_WARNING) == 1, err  # said once, not on every retry
    assert "prepared statement" not in err and "Traceback" not in err
    assert c.stop() == 0


def test_collect_enqueue_through_the_pooler(collectors, conn, urls):
    conn.execute("SELECT mailroom.upsert_sender('mailroom', 'noreply@example.test', '127.0.0.1', 2525)")
    u = urls("collector")
    c = collectors(u.database, "--enqueue", "--listen-url", "none", "--poll-interval", "100ms",
                   mailroom_batch_limit="3")
    c.wait_stderr("polling every 100 ms")
    conn.execute(bulk_accounts_sql("ebulk", 30))  # 10 committed batches of 3 in a row
    logins = [f"ebulk{i}" for i in range(30)]
    for wave in range(3):
        logins += create_accounts(conn, f"e{wave}x", 4)
        time.sleep(0.15)
    rows = wait_rows(conn, "SELECT to_addrs[1], idempotency_key FROM mailroom.outbound_messages", len(logins))
    assert sorted(r[0] for r in rows) == sorted(f"{login}@example.test" for login in logins), c.stderr_text()
    assert len({r[1] for r in rows}) == len(rows), "one message per token"
    c.assert_quiet(0.3)  # nothing on stdout in enqueue mode
    assert "no listen URL" in c.stderr_text()
    assert c.stop() == 0


def test_collect_with_a_direct_listen_url_reacts_to_notify(collectors, conn, urls):
    """MAILROOM_LISTEN_URL direct, work through the pooler: a token inserted while idle is collected within the
    batch timeout, long before the 60 s poll would have found it."""
    u = urls("collector")
    c = collectors(u.database, "--poll-interval", "60s", mailroom_listen_url=u.listen,
                   mailroom_batch_limit="10", mailroom_batch_timeout="200ms", mailroom_healthcheck_interval="60s")
    c.wait_stderr("waiting for notifications on token_insert")
    time.sleep(0.5)  # idle: the backlog drain is over
    for i in range(8):  # one at a time: each wakes the collector through NOTIFY
        t0 = time.monotonic()
        logins = create_accounts(conn, f"n{i}x", 1)
        assert_exactly_once(c.records(1, timeout=5), logins)
        assert time.monotonic() - t0 < 3, "woken by NOTIFY, not by the 60 s poll"
    assert c.stderr_text().count("woke up (NOTIFY)") >= 8
    assert POOLER_SELFTEST_WARNING not in c.stderr_text()
    assert c.stop() == 0


def test_collect_listener_reconnects_after_its_backend_is_terminated(collectors, conn, urls):
    u = urls("collector")
    c = collectors(u.database, "--listen-url", u.listen, "--poll-interval", "60s",
                   mailroom_batch_timeout="100ms", mailroom_healthcheck_interval="60s")
    c.wait_stderr("waiting for notifications on token_insert")
    logins = create_accounts(conn, "before", 1)
    assert_exactly_once(c.records(1, timeout=5), logins)
    wait_committed(conn, logins)  # a kill between a write and its COMMIT rewrites the batch
    # the listen connection is a direct one named mailroom-collect; PgBouncer's server connections
    # take the name of their client while a transaction runs: ending those too is a harmless extra
    killed = conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'mailroom-collect'"
    ).fetchone()[0]
    assert killed >= 1
    c.wait_stderr("LISTEN token_insert: connection lost", timeout=10)
    c.wait_stderr("LISTEN token_insert: listening again", timeout=15)
    t0 = time.monotonic()
    logins = create_accounts(conn, "after", 1)
    assert_exactly_once(c.records(1, timeout=5), logins)
    assert time.monotonic() - t0 < 3, "heard through NOTIFY again"
    assert c.stop() == 0


def test_commit_lost_behind_the_pooler_is_not_fatal_nor_written_twice(conn, urls):
    """The server connection under a batch dies before its COMMIT: PgBouncer answers the COMMIT with
    two errors (psycopg: InternalError, connection closed). The collector reconnects and the batch,
    whose dispatch rolled back with the digests of the links written, comes back with new links and
    is written again (WARN)."""
    u = urls("collector")
    c = Collector(u.database, "--listen-url", u.listen,
                  env={"MAILROOM_BATCH_LIMIT": "1000", "MAILROOM_BATCH_TIMEOUT": "50ms"}, pump_stdout=False)
    try:
        c.wait_stderr("waiting for notifications")
        conn.execute(bulk_accounts_sql("cut", 1000))  # one ~130 kB line: the write blocks on the full pipe
        # the batch's backend, in this database, idle in its transaction for a while: the collector is
        # blocked writing to the full pipe (not between two statements of the batch); it is terminated
        wait_until(lambda: conn.execute(
            "SELECT bool_or(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'mailroom-collect'"
            " AND state = 'idle in transaction' AND state_change < now() - interval '300 milliseconds'").fetchone()[0],
            what="the batch's backend blocked on the full pipe, terminated")
        c.start_pump()  # the write completes, the COMMIT fails
        c.wait_stderr("connection lost while committing a written batch of 1000 tokens")
        c.wait_stderr("1000 tokens written before a lost commit came back: written again with new links")
        assert_exactly_once(c.records(1000), [f"cut{i}" for i in range(1000)])  # dead links
        assert_exactly_once(c.records(1000), [f"cut{i}" for i in range(1000)])  # the working ones
        logins = create_accounts(conn, "next", 2)
        assert_exactly_once(c.records(2), logins)
        c.assert_quiet(0.3)
        assert c.proc.poll() is None, c.stderr_text()
    finally:
        c.kill()
