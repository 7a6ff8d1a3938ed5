"""`mailroom send --connections N`: a slot sends its batch over N SMTP connections at once, and
every message is still delivered exactly once."""

from __future__ import annotations

import collections

from outbound_support import SEND_FLAGS, add_sender, counts, enqueue_many


def test_connections_per_slot_deliver_each_message_exactly_once(conn, cli, smtp_server):
    n = 600
    server = smtp_server(delay=0.002)
    add_sender(conn, server.port)
    enqueue_many(conn, n)
    result = cli("send", "--until-idle", *SEND_FLAGS, "--concurrency", "2", "--connections", "3",
                 "--batch-size", "60", timeout=120)
    assert result.returncode == 0, result.stderr
    assert counts(conn) == {"sent": n}
    delivered = collections.Counter(server.handler.message_ids())
    assert len(delivered) == n and set(delivered.values()) == {1}
    assert server.handler.sessions == 6  # 2 slots x 3 connections, each reused for the whole run
    assert conn.execute("SELECT count(*) FROM mailroom.outbound_messages WHERE possibly_sent").fetchone()[0] == 0


def test_connections_must_be_positive(cli):
    result = cli("send", "--until-idle", "--connections", "0")
    assert result.returncode != 0
    assert result.returncode == 2 and "'--connections'" in result.stderr and "greater than or equal to 1" in result.stderr
