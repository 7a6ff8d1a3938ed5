"""A sender that keeps going reports a batch and claims the next in one call (finalize_and_claim, issue 37)."""

from __future__ import annotations

import time

from outbound_support import SEND_FLAGS, add_sender, enqueue, row


def _calls(conn) -> dict[str, int]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return dict(conn.execute(
        "SELECT funcname, calls::integer FROM pg_stat_user_functions WHERE schemaname = 'mailroom'"
        " AND funcname IN ('finalize_and_claim', 'finalize_messages', 'claim_messages')"
    ).fetchall())


def test_a_sender_that_keeps_going_reports_and_claims_in_one_call(conn, cli, smtp_server):
    server = smtp_server()
    add_sender(conn, server.port)
    conn.execute(f"ALTER DATABASE {conn.info.dbname} SET track_functions = 'pl'")  # the sender's sessions count calls
    ids = enqueue(conn, 5)
    result = cli("send", "--until-idle", *SEND_FLAGS, "--concurrency", "1", "--batch-size", "1", timeout=30)
    assert result.returncode == 0, result.stderr
    assert len(server.handler.received) == 5
    assert {(row(conn, i)["status"], row(conn, i)["attempts"]) for i in ids} == {("sent", 1)}
    deadline = time.monotonic() + 5
    calls = _calls(conn)
    while calls.get("finalize_and_claim") != 5 and time.monotonic() < deadline:  # the exiting backend's stats
        time.sleep(0.1)
        calls = _calls(conn)
    # one claim to start, then each outcome went with the next claim (the last one claimed nothing),
    # and a last claim found the queue empty: no finalize on its own
    assert calls.get("finalize_and_claim") == 5, calls
    assert calls.get("finalize_messages") == 5, calls
    assert calls.get("claim_messages") == 7, calls
