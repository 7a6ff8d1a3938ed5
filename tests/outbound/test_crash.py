"""Nothing lost, nothing doubled: SIGKILL mid-batch + reap, 4 concurrent senders, SIGTERM."""

from __future__ import annotations

import collections
import signal
import time

from outbound_support import SEND_FLAGS, add_sender, counts, enqueue, enqueue_many, wait_for


def test_sigkill_mid_batch_then_reap_delivers_everything(conn, cli, cli_popen, smtp_server):
    server = smtp_server(delay=0.01)
    add_sender(conn, server.port)
    enqueue_many(conn, 300)
    proc = cli_popen("send", *SEND_FLAGS, "--concurrency", "2", "--batch-size", "50", "--reap-after", "0")
    wait_for(lambda: len(server.handler.received) >= 40, what="first deliveries")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    stuck = counts(conn).get("processing", 0)
    assert stuck > 0, "the kill should leave claimed rows behind"

    reaped = cli("outbound", "reap", "--older-than", "0s")
    assert reaped.returncode == 0, reaped.stderr
    assert reaped.stdout.strip() == f"reaped {stuck} message(s)"

    result = cli("send", "--until-idle", *SEND_FLAGS, "--concurrency", "2", timeout=60)
    assert result.returncode == 0, result.stderr
    assert counts(conn) == {"sent": 300}

    rows = conn.execute("SELECT message_id, possibly_sent FROM mailroom.outbound_messages").fetchall()
    delivered = collections.Counter(server.handler.message_ids())
    flagged = {mid for mid, flag in rows if flag}
    assert all(delivered[mid] >= 1 for mid, _ in rows), "every message reached the relay"
    duplicates = {mid for mid, n in delivered.items() if n > 1}
    assert duplicates <= flagged, "duplicates only among rows flagged possibly_sent"
    assert len(flagged) == stuck


def test_four_senders_deliver_each_message_exactly_once(conn, cli_popen, smtp_server):
    n = 2000
    server = smtp_server()
    add_sender(conn, server.port)
    enqueue_many(conn, n)
    procs = [
        cli_popen("send", "--until-idle", *SEND_FLAGS, "--concurrency", "2", "--batch-size", "100", "--worker", f"w{i}")
        for i in range(4)
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()
    assert counts(conn) == {"sent": n}
    delivered = collections.Counter(server.handler.message_ids())
    assert len(delivered) == n and set(delivered.values()) == {1}
    assert conn.execute("SELECT count(*) FROM mailroom.outbound_messages WHERE possibly_sent").fetchone()[0] == 0
    workers = conn.execute(
        "SELECT count(DISTINCT claimed_by) FROM mailroom.outbound_messages"
    ).fetchone()[0]
    assert workers == 0  # claims are cleared once finalized


def test_sigterm_releases_unattempted_and_flags_abandoned_data(conn, cli_popen, smtp_server):
    server = smtp_server("stall_data")
    add_sender(conn, server.port)
    ids = enqueue(conn, 5)
    proc = cli_popen("send", *SEND_FLAGS, "--concurrency", "1", "--batch-size", "5", "--smtp-timeout", "30s")
    wait_for(lambda: server.handler.in_data >= 1, what="the first DATA")
    states = [r[0] for r in conn.execute(
        "SELECT state FROM pg_stat_activity WHERE application_name LIKE 'mailroom-send%%'"
    )]
    assert states and "idle in transaction" not in states, "no transaction is held open during SMTP"
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - started < 5
    rows = {
        r[0]: r[1:]
        for r in conn.execute("SELECT id, status::text, attempts, last_outcome, possibly_sent FROM mailroom.outbound_messages")
    }
    assert rows[ids[0]] == ("queued", 1, "uncertain", True)
    for mid in ids[1:]:
        assert rows[mid] == ("queued", 0, None, False)  # released untouched


def test_sigterm_finishes_the_message_on_the_wire(conn, cli_popen, smtp_server):
    server = smtp_server(delay=0.5)
    add_sender(conn, server.port)
    ids = enqueue(conn, 4)
    proc = cli_popen("send", *SEND_FLAGS, "--concurrency", "1", "--batch-size", "4")
    wait_for(lambda: server.handler.in_data >= 1, what="the first DATA")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    status = dict(conn.execute("SELECT id, status::text FROM mailroom.outbound_messages").fetchall())
    assert status[ids[0]] == "sent"
    assert [status[i] for i in ids[2:]] == ["queued", "queued"]
    assert "processing" not in status.values()


def test_sender_survives_pg_terminate_backend(conn, cli_popen, smtp_server):
    server = smtp_server(delay=0.005)
    add_sender(conn, server.port)
    enqueue_many(conn, 300)
    proc = cli_popen("send", *SEND_FLAGS, "--concurrency", "2", "--batch-size", "20", "--reap-after", "2s")
    try:
        wait_for(lambda: len(server.handler.received) >= 30, what="first deliveries")
        killed = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name LIKE 'mailroom-send%%' AND pid <> pg_backend_pid()"
        ).fetchone()[0]
        assert killed >= 3  # two slots, the listener (and the reaper)
        wait_for(lambda: counts(conn) == {"sent": 300}, timeout=30, what="every message sent")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    delivered = collections.Counter(server.handler.message_ids())
    flagged = {r[0] for r in conn.execute("SELECT message_id FROM mailroom.outbound_messages WHERE possibly_sent")}
    assert len(delivered) == 300
    assert {mid for mid, n in delivered.items() if n > 1} <= flagged
    err = proc.stderr.read().decode()
    assert "Traceback" not in err
