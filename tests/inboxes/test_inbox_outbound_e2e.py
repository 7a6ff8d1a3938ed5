"""The demo path across areas: the outbound sender delivers to `mailroom inbox serve` over SMTP."""

from __future__ import annotations

import smtplib
import time

import psycopg
import pytest


def test_outbound_sender_delivers_into_an_inbox(server, conn, make_mailbox, cli_popen):
    box = make_mailbox()
    conn.execute("SELECT mailroom.upsert_sender('demo', 'noreply@mailroom.test', '127.0.0.1', %s)", (server.port,))
    queued = conn.execute(
        "SELECT mailroom.enqueue_message('demo', ARRAY[%s], 'Activate your account', 'Click the link')",
        (box.address,),
    ).fetchone()[0]
    sender = cli_popen("send", "--poll-interval", "0.2s")
    deadline = time.monotonic() + 20
    rows: list = []
    while time.monotonic() < deadline and not rows:
        rows = conn.execute(
            "SELECT message_id, envelope_from, subject, text_body FROM mailroom.list_messages(%s, %s)",
            (box.address, box.token),
        ).fetchall()
        time.sleep(0.1)
    sender.terminate()
    sender.wait(timeout=10)
    assert len(rows) == 1, f"nothing arrived; outbound row {queued}"
    _, envelope_from, subject, text_body = rows[0]
    assert envelope_from == "noreply@mailroom.test"
    assert subject == "Activate your account"
    assert "Click the link" in text_body
    # Expire it with a pinned clock: the next delivery is refused at RCPT (550), as in the demo.
    with conn.transaction():
        conn.execute("SELECT mailroom.pin_clock(%s + interval '1 second')", (box.expires_at,))
        assert conn.execute("SELECT mailroom.expire_mailboxes()").fetchone()[0] == 1
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        client.mail("noreply@mailroom.test")
        assert client.rcpt(box.address)[0] == 550
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT * FROM mailroom.list_messages(%s, %s)", (box.address, box.token))
    assert err.value.sqlstate == "MR205"
