"""The Received: trace header of mail stored over SMTP (issue 44; docs/inboxes.md, "Received:"),
against the real `mailroom inbox serve`: one header in front of the client's bytes, with the client's
address, its HELO name, the protocol and the date of mailroom.clock(); a HELO holding CR cannot add a
header of its own; the plan's size limit still counts the client's bytes."""

from __future__ import annotations

import email
import email.policy
import re
import smtplib
import socket

import psycopg

RAW = (
    b"Received: from upstream.example.net (upstream.example.net [198.51.100.1])\r\n"
    b"\tby relay.example.net with ESMTP; Sun, 06 Dec 2026 10:00:00 +0000\r\n"
    b"From: Ann Example <ann@example.com>\r\n"
    b"Subject: traced\r\n"
    b"\r\n"
    b"body\r\n"
)
HEADER = re.compile(
    rb"\AReceived: from (?P<helo>[^ ]+) \((?P<client>[^)]*)\)\r\n"
    rb"\tby (?P<by>[^ ]+) \(mailroom\) with (?P<with>[A-Z0-9]+) id (?P<id>[0-9A-F]{12})\r\n"
    rb"\tfor <(?P<rcpt>[^>]+)>; (?P<date>[A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d \+0000)\r\n"
)


def stored(conn: psycopg.Connection, mailbox_id: int) -> tuple[bytes, int, str]:
    """The message's raw bytes, size_bytes and received_at as the header writes it (UTC)."""
    raw, size, date = conn.execute(
        "SELECT raw, size_bytes, to_char(received_at AT TIME ZONE 'UTC', 'Dy, DD Mon YYYY HH24:MI:SS')"
        " FROM mailroom.messages WHERE mailbox_id = %s", (mailbox_id,),
    ).fetchone()
    return bytes(raw), size, date + " +0000"


def test_one_received_header_on_top_with_the_client_and_its_helo(server, conn, make_mailbox):
    box = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo("client.example.test")
        assert client.sendmail("ann@example.com", [box.address], RAW) == {}
    raw, size, date = stored(conn, box.id)
    match = HEADER.match(raw)
    assert match, raw[:400]
    assert raw[match.end():] == RAW  # the client's bytes follow unchanged, its own Received: kept below
    assert match["helo"] == b"client.example.test"
    assert match["client"] == b"[127.0.0.1]"
    assert match["with"] == b"ESMTP"
    assert match["rcpt"].decode() == box.address  # one recipient: for <it>
    assert match["date"].decode() == date  # mailroom.clock() at store time, as received_at
    assert size == len(raw)
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert len(parsed.get_all("Received")) == 2  # exactly one new one
    assert parsed["Subject"] == "traced"


def test_a_helo_holding_cr_cannot_add_a_header(server, conn, make_mailbox):
    """aiosmtpd ends a command at LF, so a bare CR (and any control) reaches the HELO name: SQL keeps
    only a domain's characters, the rest written '?', so the header stays one field."""
    box = make_mailbox()
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        reader = sock.makefile("rb")

        def command(line: bytes) -> bytes:
            sock.sendall(line + b"\r\n")
            reply = reader.readline()
            while reply[3:4] == b"-":
                reply = reader.readline()
            return reply

        assert reader.readline().startswith(b"220")
        assert command(b"EHLO evil\rX-Injected: yes\x0b(\x01)").startswith(b"250")
        assert command(b"MAIL FROM:<ann@example.com>").startswith(b"250")
        assert command(b"RCPT TO:<" + box.address.encode() + b">").startswith(b"250")
        assert command(b"DATA").startswith(b"354")
        assert command(b"Subject: helo\r\n\r\nbody\r\n.").startswith(b"250")
        command(b"QUIT")
    raw, _, _ = stored(conn, box.id)
    match = HEADER.match(raw)
    assert match, raw[:400]
    assert match["helo"] == b"evil?X-Injected:?yes????"
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert parsed["X-Injected"] is None
    assert [name for name, _ in parsed.items()] == ["Received", "Subject"]
    assert b"\r\nX-Injected" not in raw and b"\rX-Injected" not in raw


def test_the_size_limit_counts_the_client_bytes_not_the_header(server, conn, make_mailbox):
    """A plan of 2,000 bytes: a message of exactly 2,000 (SIZE=2000 declared) is stored, the header
    in front (size_bytes counts what is stored); one byte more is 552."""
    conn.execute(
        "INSERT INTO mailroom.plans (name, default_ttl_minutes, max_ttl_minutes, max_message_bytes, max_messages)"
        " VALUES ('received_tiny', 10, 10, 2000, 10) ON CONFLICT (name) DO NOTHING"
    )
    box = make_mailbox(plan="received_tiny")
    def message_of(size: int) -> bytes:
        head = b"Subject: sized\r\n\r\n"
        count, rest = divmod(size - len(head), 100)  # lines of 98 octets and CRLF, then one of rest + 100
        return head + (b"x" * 98 + b"\r\n") * (count - 1) + b"y" * (rest + 98) + b"\r\n"

    exact = message_of(2000)
    assert len(exact) == 2000 and len(message_of(2001)) == 2001
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo("sizer.example.test")
        assert client.sendmail("ann@example.com", [box.address], exact, mail_options=["SIZE=2000"]) == {}
        client.mail("ann@example.com")
        assert client.rcpt(box.address)[0] == 250
        assert client.data(message_of(2001))[0] == 552
    raw, size, _ = stored(conn, box.id)
    match = HEADER.match(raw)
    assert match and raw[match.end():] == exact
    assert size == len(raw) > 2000
