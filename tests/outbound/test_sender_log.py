"""What operators see of the sender (issue 34, item 6): one log line per deferral and per failure
(message id, relay, the reply's code and enhanced status, never its text: it quotes addresses; the
next try), rate-limited; successes as a summary line, not one each. And a batch goes out in
priority order (a real aiosmtpd sink)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from outbound_support import SEND_FLAGS, add_sender, enqueue, free_port, row

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def send_at(cli, when: datetime, *extra):
    env = {"PGOPTIONS": f"-c mailroom.clock={when.isoformat()}"}
    result = cli("send", "--until-idle", *SEND_FLAGS, *extra, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stderr


def test_dead_relay_logs_each_deferral_and_the_failure(conn, cli):
    port = free_port()  # nothing listens there
    add_sender(conn, port)
    conn.execute("SELECT mailroom.set_setting('outbound.max_attempts', '3')")
    (mid,) = enqueue(conn, 1, to=["dora.victim@victim.test"])
    logs = [send_at(cli, T0), send_at(cli, T0 + timedelta(minutes=1)), send_at(cli, T0 + timedelta(minutes=5))]
    assert row(conn, mid)["status"] == "failed"
    relay = f"127.0.0.1:{port}"
    first = re.findall(rf"deferred message {mid} via {re.escape(relay)}: (.*)", logs[0])
    assert first == ["connect (no reply), attempt 1, next try 2030-01-01 12:01:00Z"], logs[0]
    assert re.search(rf"deferred message {mid} via {re.escape(relay)}: connect \(no reply\), attempt 2, "
                     r"next try 2030-01-01 12:05:00Z", logs[1]), logs[1]
    assert re.search(rf"failed message {mid} via {re.escape(relay)}: connect \(no reply\), attempt 3, no more tries",
                     logs[2]), logs[2]
    # one line per outcome, and each run ends with its summary
    assert sum(log.count(f"message {mid} via") for log in logs) == 3
    assert "summary: sent 0, deferred 1, failed 0" in logs[0] and "summary: sent 0, deferred 0, failed 1" in logs[2]
    assert not any("dora" in log.lower() or "@" in log for log in logs)


def test_a_refusal_logs_its_codes_never_its_text(conn, cli, smtp_server):
    server = smtp_server("reply_rcpt", "451 4.7.1 <dora.victim@victim.test> greylisted, try again later")
    add_sender(conn, server.port)
    (mid,) = enqueue(conn, 1, to=["dora.victim@victim.test"])
    log = send_at(cli, T0)
    assert re.search(rf"deferred message {mid} via 127\.0\.0\.1:{server.port}: 1 recipient\(s\) refused: "
                     r"reply 451 4\.7\.1, attempt 1, "
                     r"next try 2030-01-01 12:01:00Z", log), log
    assert "dora" not in log.lower() and "greylisted" not in log


def test_deferral_lines_are_rate_limited(conn, cli):
    add_sender(conn, free_port())
    ids = enqueue(conn, 30)
    log = send_at(cli, T0)
    lines = re.findall(r"deferred message (\d+) via", log)
    assert len(lines) == 10 and set(map(int, lines)) <= set(ids), log
    assert re.search(r"\.\.\. and 20 more deferral\(s\) or failure\(s\) not logged", log), log
    assert "summary: sent 0, deferred 30, failed 0" in log


def test_successes_are_a_summary_not_a_line_each(conn, cli, smtp_server):
    server = smtp_server()
    add_sender(conn, server.port)
    ids = enqueue(conn, 5)
    log = send_at(cli, T0)
    assert all(row(conn, i)["status"] == "sent" for i in ids)
    assert not any(f"message {i} " in log for i in ids), log
    assert log.count("summary: sent 5, deferred 0, failed 0") == 1, log


def test_a_batch_goes_out_in_priority_order(conn, cli, smtp_server):
    """Issue 34: priorities -10, 0, 10, 3 enqueued in one transaction are delivered by priority at the
    default batch size (one slot: the order is the claim's)."""
    server = smtp_server()
    add_sender(conn, server.port)
    with conn.transaction():
        for p in (-10, 0, 10, 3):
            conn.execute("SELECT mailroom.enqueue_message('main', ARRAY['p@example.com'], %s, 'b', p_priority => %s)",
                         (f"priority {p}", p))
    send_at(cli, T0, "--concurrency", "1")
    assert [m.message["Subject"] for m in server.handler.received] == [
        "priority 10", "priority 3", "priority 0", "priority -10"]
