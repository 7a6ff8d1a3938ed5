"""The inbound server writes only the replies SQL gives it: a refusing verdict's SMTP reply is a row of
mailroom.error_codes, at RCPT and at DATA, and the choice between a retry (451 4.2.0) and a refusal is
deliver_messages'. Changing a row changes what the client reads; no reply is kept in Python."""

from __future__ import annotations

import smtplib


def _set_reply(conn, code: str, reply: str) -> None:
    conn.execute("UPDATE mailroom.error_codes SET smtp_reply = %s WHERE code = %s", (reply, code))
    # a full inbox is refused only under a plan that refuses (the free plan's seed lets the oldest go)
    conn.execute("UPDATE mailroom.plans SET when_full = 'refuse' WHERE name = 'free'")


def test_rcpt_answers_the_reply_of_the_verdict_in_the_vocabulary(server, conn, make_mailbox):
    box = make_mailbox()
    conn.execute("UPDATE mailroom.mailboxes SET message_count = 1000000 WHERE id = %s", (box.id,))  # full
    _set_reply(conn, "MR208", "552 5.2.2 This test's own words for a full mailbox")
    _set_reply(conn, "MR203", "550 5.1.1 This test's own words for nobody")
    with smtplib.SMTP(server.host, server.port, timeout=30) as client:
        client.ehlo()
        client.mail("ann@example.com")
        assert client.rcpt(box.address) == (552, b"5.2.2 This test's own words for a full mailbox")
        assert client.rcpt("nobody@mailroom.test") == (550, b"5.1.1 This test's own words for nobody")


def test_data_answers_the_reply_deliver_messages_chose(server, conn, make_mailbox):
    first, second = make_mailbox(), make_mailbox()
    _set_reply(conn, "MR208", "552 5.2.2 Full, as the vocabulary says")
    with smtplib.SMTP(server.host, server.port, timeout=30) as client:
        client.ehlo()
        client.mail("ann@example.com")
        assert client.rcpt(first.address)[0] == 250
        assert client.rcpt(second.address)[0] == 250
        # between RCPT and DATA the second inbox fills up: the first would take the message, so SQL
        # answers a retry (RCPT refuses the full one next time) and keeps nothing
        conn.execute("UPDATE mailroom.mailboxes SET message_count = 1000000 WHERE id = %s", (second.id,))
        assert client.data(b"Subject: hi\r\n\r\nhello\r\n") == (
            451, b"4.2.0 A recipient became unavailable; please try again")
        client.mail("ann@example.com")
        assert client.rcpt(second.address) == (552, b"5.2.2 Full, as the vocabulary says")
        # alone, the full one's refusal is the vocabulary's reply at DATA too
        conn.execute("UPDATE mailroom.mailboxes SET message_count = 0 WHERE id = %s", (second.id,))
        client.mail("ann@example.com")
        assert client.rcpt(second.address)[0] == 250
        conn.execute("UPDATE mailroom.mailboxes SET message_count = 1000000 WHERE id = %s", (second.id,))
        assert client.data(b"Subject: hi\r\n\r\nhello\r\n") == (552, b"5.2.2 Full, as the vocabulary says")
    assert conn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id IN (%s, %s)",
                        (first.id, second.id)).fetchone()[0] == 0
