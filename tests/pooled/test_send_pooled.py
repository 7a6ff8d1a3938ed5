"""`mailroom send` and `mailroom outbound status/list/retry` through PgBouncer (transaction mode).

The sender's slots claim and finalize in autocommit statements; dozens of each in a row on one
connection is far past the five executions after which psycopg would prepare them.
"""

from __future__ import annotations

import collections
import time

import pytest
from outbound_support import Handler, SmtpServer, add_sender, counts, enqueue, enqueue_many
from pooled_support import POOLER_SELFTEST_WARNING, wait_until

FLAGS = ("--smtp-timeout", "5s", "--shutdown-grace", "1s")


@pytest.fixture
def sink():
    servers: list[SmtpServer] = []

    def start(mode: str = "accept", reply: str = "250 2.0.0 Ok") -> SmtpServer:
        server = SmtpServer(Handler(mode=mode, reply=reply)).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def test_send_through_the_pooler_delivers_each_message_once(conn, urls, sink, workers):
    """No listen URL: the default (the pooled URL) fails its self-test, says so once, and the sender polls."""
    smtp = sink()
    add_sender(conn, smtp.port)
    u = urls("sender")
    w = workers("send", *FLAGS, "--concurrency", "2", "--batch-size", "3", "--poll-interval", "0.2s",
                env={"MAILROOM_DATABASE_URL": u.database})
    w.wait_stderr(POOLER_SELFTEST_WARNING)
    enqueue_many(conn, 60)  # 20 claims and 20 finalizes of 3, most of them in a row on one slot
    wait_until(lambda: counts(conn) == {"sent": 60}, timeout=30, what="60 messages sent")
    ids = collections.Counter(smtp.handler.message_ids())
    assert len(ids) == 60 and set(ids.values()) == {1}
    assert w.stop() == 0
    assert w.stderr().count(POOLER_SELFTEST_WARNING) == 1
    assert "prepared statement" not in w.stderr() and "claim failed" not in w.stderr(), w.stderr()


def test_send_with_a_direct_listen_url_wakes_on_notify_and_recovers_its_listener(conn, urls, sink, workers):
    smtp = sink()
    add_sender(conn, smtp.port)
    u = urls("sender")
    w = workers("send", *FLAGS, "--poll-interval", "60s",
                env={"MAILROOM_DATABASE_URL": u.database, "MAILROOM_LISTEN_URL": u.listen})
    wait_until(lambda: conn.execute("SELECT 1 FROM pg_stat_activity WHERE application_name = 'mailroom-send-listen'"
                                    " AND query LIKE 'LISTEN%%'").fetchone(), what="the sender's LISTEN")
    time.sleep(1)  # every slot has found the queue empty and waits for a wake-up (the poll is 60 s away)
    for i in range(8):
        t0 = time.monotonic()
        enqueue(conn, 1, subject=f"woken {i}")
        wait_until(lambda n=i + 1: counts(conn).get("sent") == n, timeout=5, what=f"message {i + 1} sent")
        assert time.monotonic() - t0 < 3, "woken by NOTIFY, not by the 60 s poll"
    killed = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                          " WHERE application_name = 'mailroom-send-listen'").fetchone()[0]
    assert killed == 1
    w.wait_stderr("LISTEN mailroom_outbound: connection lost")
    w.wait_stderr("LISTEN mailroom_outbound: listening again")
    time.sleep(0.5)
    t0 = time.monotonic()
    enqueue(conn, 1, subject="after the reconnect")
    wait_until(lambda: counts(conn).get("sent") == 9, timeout=5, what="the message after the reconnect")
    assert time.monotonic() - t0 < 3
    assert len(smtp.handler.message_ids()) == 9
    assert POOLER_SELFTEST_WARNING not in w.stderr()
    assert w.stop() == 0
    assert "prepared statement" not in w.stderr() and "claim failed" not in w.stderr(), w.stderr()


def test_outbound_status_list_retry_through_the_pooler(conn, urls, sink, cli, workers):
    bad = sink("reply_rcpt", "550 5.1.1 user unknown")
    add_sender(conn, bad.port)
    ids = enqueue(conn, 8)
    u = urls("admin")
    env = {"MAILROOM_DATABASE_URL": u.database}
    w = workers("send", *FLAGS, "--until-idle", "--listen-url", "none", env=env)
    assert w.proc.wait(timeout=60) == 0, w.stderr()
    assert counts(conn) == {"failed": 8}
    for _ in range(6):
        out = cli("outbound", "status", env=env)
        assert out.returncode == 0, out.stderr
        assert any(line.split() == ["failed", "8"] for line in out.stdout.splitlines()), out.stdout
    for _ in range(6):
        out = cli("outbound", "list", "--status", "failed", env=env)
        assert out.returncode == 0, out.stderr
        assert len(out.stdout.strip().splitlines()) == 1 + 8
    # each single-recipient 5xx suppressed its recipient: a retry sends it anyway only when asked (issue 23)
    for message_id in ids[:6]:
        out = cli("outbound", "retry", str(message_id), "--include-suppressed", env=env)
        assert (out.returncode, out.stdout.strip()) == (0, f"1 message(s) queued again (ids {message_id})"), out.stderr
        assert "on the suppression list now and were queued anyway" in out.stderr
    out = cli("outbound", "retry", "--all-failed", "--include-suppressed", "--yes", env=env)
    assert (out.returncode, out.stdout.strip().split(" (ids")[0]) == (0, "2 message(s) queued again"), out.stderr
    assert counts(conn) == {"queued": 8}
    out = cli("outbound", "retry", str(ids[0]), env=env)  # an error through the pooler: one line, exit code
    assert out.returncode != 0 and out.stderr.startswith("mailroom: error: ") and "Traceback" not in out.stderr
