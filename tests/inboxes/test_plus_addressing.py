"""Plus-addressing through the real `mailroom inbox serve` (issue 35 item 1): mail to box+tag@domain
is accepted at RCPT by box's verdict and stored in box@domain with the tag, decided in the server's
own SQL calls (check_bounce_recipient at RCPT, deliver_messages at DATA); one copy per box however
its tags were written; a catch-all domain makes the box, not the tagged address; a fault of the box
answers its plus addresses; erasing an address erases the mail of its plus forms."""

from __future__ import annotations

import smtplib

MESSAGE = b"From: Ann <ann+news@example.com>\r\nSubject: tagged\r\n\r\nhello\r\n"


def _rows(conn, mailbox_id: int) -> list[tuple]:
    return conn.execute(
        "SELECT envelope_to, tags FROM mailroom.messages WHERE mailbox_id = %s ORDER BY id", (mailbox_id,)
    ).fetchall()


def test_plus_addresses_over_smtp(server, conn, make_mailbox):
    box, other = make_mailbox(), make_mailbox()
    tagged = box.address.replace("@", "+Invoices@")
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        assert client.sendmail("ann+news@example.com", [tagged], MESSAGE) == {}
        # two tags of one box in one envelope: one copy, the first tag; another box's plus form too
        assert client.sendmail("ann@example.com", [box.address.replace("@", "+a@"), box.address.replace("@", "+b@"),
                                                   other.address.replace("@", "+x@")], MESSAGE) == {}
        # an invalid tag: still the box's mail, untagged; a plus form of no box: 550 like any unknown
        assert client.sendmail("ann@example.com", [box.address.replace("@", "+no!tag@")], MESSAGE) == {}
        client.mail("ann@example.com")
        code, _ = client.rcpt("nobody+x@mailroom.test")
        assert code == 550
        client.rset()
    assert _rows(conn, box.id) == [
        (tagged, ["invoices"]), (box.address.replace("@", "+a@"), ["a"]), (box.address.replace("@", "+no!tag@"), []),
    ]
    assert _rows(conn, other.id) == [(other.address.replace("@", "+x@"), ["x"])]

    # the box's fault answers its plus addresses (the same RCPT call)
    conn.execute("SELECT mailroom.set_inbox_fault(%s, %s, 'rcpt', '451 4.3.0 try later')", (box.address, box.token))
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        client.mail("ann@example.com")
        assert client.rcpt(box.address.replace("@", "+later@")) == (451, b"4.3.0 try later")
        client.rset()
    conn.execute("SELECT mailroom.clear_inbox_fault(%s, %s)", (box.address, box.token))

    # erasing ann@example.com erases the mail from ann+news@example.com (its plus form)
    erased = dict(conn.execute("SELECT item, affected FROM mailroom.erase_address('ann@example.com')").fetchall())
    assert erased["messages"] == 4
    assert conn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id IN (%s, %s)",
                        (box.id, other.id)).fetchone()[0] == 0

    # a catch-all domain makes the box, not the tagged address (one server for both: CI time)
    conn.execute("SELECT mailroom.set_catchall_domain('catch.test', 'team-catch')")
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        assert client.sendmail("ann@example.com", ["Shop+Orders@catch.test"], MESSAGE) == {}
        assert client.sendmail("ann@example.com", ["shop@catch.test"], MESSAGE) == {}
    boxes = conn.execute("SELECT id, address FROM mailroom.mailboxes WHERE catchall_domain = 'catch.test'").fetchall()
    assert [b[1] for b in boxes] == ["shop@catch.test"]
    assert _rows(conn, boxes[0][0]) == [("Shop+Orders@catch.test", ["orders"]), ("shop@catch.test", [])]
