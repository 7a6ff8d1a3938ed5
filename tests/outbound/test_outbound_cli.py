"""`mailroom outbound …`: status, list, show, retry, purge, reap, sender — and their errors."""

from __future__ import annotations

from outbound_support import KEY_HEX, add_sender, enqueue, row


def fail(conn, mid: int, reply: str = "550 5.1.1 <bob@example.com> unknown") -> None:
    claimed_id, token = conn.execute("SELECT id, claim_token FROM mailroom.claim_messages(1, 't')").fetchone()
    assert claimed_id == mid
    conn.execute(
        "SELECT mailroom.finalize_messages(ARRAY[%s::bigint], ARRAY[%s::bigint], ARRAY['reply'], ARRAY[550],"
        " ARRAY['5.1.1'], ARRAY[%s])",
        (mid, token, reply),
    )


def test_status_list_show(conn, cli):
    add_sender(conn, 2525)
    a, b = enqueue(conn, 2, to=["bob@example.com"], subject="Secret subject")
    fail(conn, a)
    result = cli("outbound", "status")
    assert result.returncode == 0, result.stderr
    lines = dict(line.rsplit(None, 1) for line in result.stdout.splitlines())
    assert lines["queued"] == "1" and lines["failed"] == "1" and lines["due now"] == "1"

    listed = cli("outbound", "list", "--status", "failed")
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[0].split()[:3] == ["ID", "SENDER", "STATUS"]
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [str(a)]

    shown = cli("outbound", "show", str(a))
    assert shown.returncode == 0
    assert "status" in shown.stdout and "failed" in shown.stdout and "<redacted:" in shown.stdout
    for output in (result.stdout, listed.stdout, shown.stdout):
        assert "@example.com" not in output and "Secret subject" not in output


def test_retry_one_and_all(conn, cli):
    add_sender(conn, 2525)
    a, b, c = enqueue(conn, 3)
    fail(conn, a)
    fail(conn, b)
    result = cli("outbound", "retry", str(a))
    assert result.returncode == 0 and result.stdout.strip() == f"message {a} queued again"
    assert (row(conn, a)["status"], row(conn, a)["attempts"]) == ("queued", 0)
    again = cli("outbound", "retry", str(a))
    assert again.returncode == 1
    assert again.stderr.strip() == f"mailroom: error: message {a} is queued; only failed messages can be retried (SQLSTATE MR341)"
    result = cli("outbound", "retry", "--all-failed")
    assert result.returncode == 0 and result.stdout.strip() == "1 message(s) queued again"
    assert row(conn, b)["status"] == "queued"
    assert cli("outbound", "retry").returncode == 2
    assert cli("outbound", "retry", "5", "--all-failed").returncode == 2


def test_show_unknown_id(cli):
    result = cli("outbound", "show", "424242")
    assert result.returncode == 1
    assert result.stderr.strip() == "mailroom: error: no outbound message with id 424242 (SQLSTATE MR340)"


def test_purge_sent_before(conn, cli):
    add_sender(conn, 2525)
    ids = enqueue(conn, 5)
    conn.execute(
        "UPDATE mailroom.outbound_messages SET status = 'sent', sent_at = now() - interval '8 days' WHERE id = ANY(%s)",
        (ids[:3],),
    )
    conn.execute("UPDATE mailroom.outbound_messages SET status = 'sent', sent_at = now() WHERE id = %s", (ids[3],))
    result = cli("outbound", "purge", "--sent-before", "7d", "--batch", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("purged 3 sent message(s)")
    left = {r[0] for r in conn.execute("SELECT id FROM mailroom.outbound_messages")}
    assert left == {ids[3], ids[4]}
    bad = cli("outbound", "purge", "--sent-before", "a week")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_reap_command(conn, cli):
    add_sender(conn, 2525)
    (mid,) = enqueue(conn, 1)
    conn.execute("SELECT * FROM mailroom.claim_messages(10, 'dead-worker', NULL, '1 second')")
    conn.execute("SELECT pg_sleep(0)")
    result = cli("outbound", "reap", env={"PGOPTIONS": "-c mailroom.clock=2099-01-01Z"})
    assert result.returncode == 0 and result.stdout.strip() == "reaped 1 message(s)"
    r = row(conn, mid)
    assert (r["status"], r["attempts"], r["possibly_sent"]) == ("queued", 1, True)
    assert cli("outbound", "reap", "--older-than", "-5").returncode == 2


def test_sender_command(conn, cli):
    result = cli(
        "outbound", "sender", "relay1", "--from", "robot@mailroom.test", "--host", "127.0.0.1", "--port", "2525",
        "--username", "u", env={"MAILROOM_SMTP_PASSWORD": "pw", "MAILROOM_ENCRYPTION_KEY": KEY_HEX},
    )
    assert result.returncode == 0, result.stderr
    enc = conn.execute("SELECT smtp_password_encrypted FROM mailroom.senders WHERE name = 'relay1'").fetchone()[0]
    assert enc is not None and b"pw" not in bytes(enc)
    no_key = cli(
        "outbound", "sender", "relay2", "--from", "robot@mailroom.test", "--host", "127.0.0.1", "--port", "2525",
        "--username", "u", env={"MAILROOM_SMTP_PASSWORD": "pw"},
    )
    assert no_key.returncode == 2 and "MAILROOM_ENCRYPTION_KEY" in no_key.stderr
    bad = cli("outbound", "sender", "relay3", "--from", "not-an-address", "--host", "127.0.0.1", "--port", "25")
    assert bad.returncode == 2 and "MR303" in bad.stderr and "not-an-address" not in bad.stderr
