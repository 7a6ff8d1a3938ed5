"""Inbound SMTP against the real `mailroom inbox serve`, with smtplib and aiosmtplib clients."""

from __future__ import annotations

import asyncio
import hashlib
import json
import smtplib
import socket
import time
from email.message import EmailMessage

import aiosmtplib
import psycopg
import pytest
from inbox_support import as_sent

RAW = (
    b"From: Ann Example <ann@example.com>\r\n"
    b"To: someone\r\n"
    b"Subject: Activate your account\r\n"
    b"Message-ID: <1@example.com>\r\n"
    b"\r\n"
    b"Click https://example.com/activate/abc\r\n"
    b".leading dot line\r\n"
)


def stored(conn: psycopg.Connection, mailbox_id: int) -> list[dict]:
    cur = conn.execute(
        "SELECT id, raw, envelope_from, envelope_to, subject, from_header, text_body, html_body, attachments"
        " FROM mailroom.messages WHERE mailbox_id = %s ORDER BY id",
        (mailbox_id,),
    )
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def total_messages(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM mailroom.messages").fetchone()[0]


def test_accepted_mail_is_stored_byte_identical(server, conn, make_mailbox):
    box = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        refused = client.sendmail("ann@example.com", [box.address], RAW)
    assert refused == {}
    rows = stored(conn, box.id)
    assert len(rows) == 1
    assert as_sent(bytes(rows[0]["raw"])) == RAW  # dot-stuffing undone, CRLF kept, nothing but Received: added
    assert rows[0]["envelope_from"] == "ann@example.com"
    assert rows[0]["envelope_to"] == box.address
    assert rows[0]["subject"] == "Activate your account"
    assert rows[0]["from_header"] == "Ann Example <ann@example.com>"
    assert "activate/abc" in rows[0]["text_body"]
    # And the SQL API reads it back for the session token.
    listed = conn.execute(
        "SELECT message_id, envelope_from, subject FROM mailroom.list_messages(%s, %s)", (box.address, box.token)
    ).fetchall()
    assert listed == [(rows[0]["id"], "ann@example.com", "Activate your account")]


def test_ehlo_advertises_size_8bitmime_smtputf8(start_server):
    srv = start_server("--max-message-size", "5000")
    with smtplib.SMTP(srv.host, srv.port, timeout=10) as client:
        code, _ = client.ehlo()
        assert code == 250
        assert client.esmtp_features["size"] == "5000"
        assert "8bitmime" in client.esmtp_features
        assert "smtputf8" in client.esmtp_features


def test_aiosmtplib_multiple_recipients_one_message_each(server, conn, make_mailbox):
    a, b = make_mailbox(), make_mailbox(plan="pro")
    msg = EmailMessage()
    msg["From"] = "sender@example.org"
    msg["To"] = f"{a.address}, {b.address}"
    msg["Subject"] = "two of you"
    msg.set_content("hello both")

    async def send():
        return await aiosmtplib.send(
            msg, hostname=server.host, port=server.port, recipients=[a.address, b.address.upper(), a.address]
        )

    errors, reply = asyncio.run(send())
    assert errors == {}
    assert reply.startswith("2.0.0 OK: stored for 2 recipient(s)")
    rows_a, rows_b = stored(conn, a.id), stored(conn, b.id)
    assert len(rows_a) == 1 and len(rows_b) == 1  # the duplicate RCPT is stored once
    assert bytes(rows_a[0]["raw"]) == bytes(rows_b[0]["raw"])
    assert rows_b[0]["envelope_to"] == b.address.upper()
    assert rows_a[0]["id"] != rows_b[0]["id"]


def test_rcpt_unknown_and_deleted_are_refused_550(server, conn, make_mailbox):
    box = make_mailbox()
    conn.execute("SELECT mailroom.delete_mailbox(%s, %s)", (box.address, box.token))
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        client.mail("ann@example.com")
        for address in ("nobody@mailroom.test", box.address):
            code, text = client.rcpt(address)
            assert code == 550
            assert text.startswith(b"5.1.1")
            assert address.encode() not in text  # addresses are not echoed
    assert total_messages(conn) == 0


def test_rcpt_refused_for_expired_inbox_not_yet_swept(server, conn, make_mailbox):
    box = make_mailbox()
    # Expire it by time only: the sweep has not run, is_active is still true.
    conn.execute("UPDATE mailroom.mailboxes SET expires_at = clock_timestamp() - interval '1 second' WHERE id = %s",
                 (box.id,))
    assert conn.execute("SELECT is_active FROM mailroom.mailboxes WHERE id = %s", (box.id,)).fetchone()[0]
    with smtplib.SMTP(server.host, server.port, timeout=10) as client, pytest.raises(smtplib.SMTPRecipientsRefused) as err:
        client.sendmail("ann@example.com", [box.address], RAW)
    code, text = err.value.recipients[box.address]
    assert code == 550 and text.startswith(b"5.1.1")
    assert total_messages(conn) == 0


def test_rcpt_refused_after_expire_mailboxes_with_pinned_clock(server, conn, make_mailbox):
    """The lead's demo path: sweep with a clock pinned past expires_at, then RCPT is refused."""
    box = make_mailbox(ttl=5)
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        assert client.sendmail("a@example.com", [box.address], RAW) == {}
    with conn.transaction():
        conn.execute("SELECT mailroom.pin_clock(%s + interval '1 minute')", (box.expires_at,))
        assert conn.execute("SELECT mailroom.expire_mailboxes()").fetchone()[0] == 1
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        client.mail("a@example.com")
        code, _ = client.rcpt(box.address)
    assert code == 550
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT * FROM mailroom.list_messages(%s, %s)", (box.address, box.token))
    assert err.value.sqlstate == "MR205"


def test_guard_rechecked_at_data(server, conn, make_mailbox):
    box = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        client.mail("ann@example.com")
        assert client.rcpt(box.address)[0] == 250
        # The inbox expires between RCPT and DATA.
        conn.execute("UPDATE mailroom.mailboxes SET expires_at = clock_timestamp() WHERE id = %s", (box.id,))
        code, text = client.data(RAW)
    assert code == 550 and text.startswith(b"5.1.1")
    assert total_messages(conn) == 0


def test_mixed_outcome_at_data_keeps_nothing_and_asks_for_retry(server, conn, make_mailbox):
    good, going = make_mailbox(), make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        client.mail("ann@example.com")
        assert client.rcpt(good.address)[0] == 250
        assert client.rcpt(going.address)[0] == 250
        conn.execute("UPDATE mailroom.mailboxes SET expires_at = clock_timestamp() WHERE id = %s", (going.id,))
        code, _ = client.data(RAW)
        assert code == 451  # nothing kept, the client retries
        assert total_messages(conn) == 0
        client.rset()
        # The retry: RCPT now refuses the expired inbox, the good one gets exactly one copy.
        refused = client.sendmail("ann@example.com", [good.address, going.address], RAW)
    assert refused == {going.address: (550, b"5.1.1 Mailbox unavailable (unknown, deleted or expired)")}
    assert len(stored(conn, good.id)) == 1
    assert total_messages(conn) == 1


def test_oversize_552_declared_and_undeclared(start_server, conn, make_mailbox):
    srv = start_server("--max-message-size", "2000")
    box = make_mailbox()
    big = RAW + b"x" * 70 + b"\r\n"
    big = big * 30  # > 2000 bytes
    with smtplib.SMTP(srv.host, srv.port, timeout=10) as client:
        # smtplib declares SIZE=... since the server advertises SIZE: refused at MAIL FROM.
        with pytest.raises(smtplib.SMTPSenderRefused) as err:
            client.sendmail("ann@example.com", [box.address], big)
        assert err.value.smtp_code == 552
        client.rset()
        # Without a declared size the limit bites at the end of DATA.
        client.mail("ann@example.com")
        assert client.rcpt(box.address)[0] == 250
        code, _ = client.data(big)
        assert code == 552
    assert total_messages(conn) == 0


def test_plan_size_limit_552_at_rcpt_and_data(server, conn, make_mailbox):
    conn.execute("UPDATE mailroom.plans SET max_message_bytes = 500 WHERE name = 'free'")
    free, pro = make_mailbox(), make_mailbox(plan="pro")
    big = RAW + b"y" * 600 + b"\r\n"
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        client.mail("ann@example.com", [f"SIZE={len(big)}"])
        code, text = client.rcpt(free.address)
        assert code == 552 and text.startswith(b"5.3.4")
        assert client.rcpt(pro.address)[0] == 250
        assert client.data(big)[0] == 250
        # Undeclared size: the plan limit is enforced by deliver_message at DATA.
        client.mail("ann@example.com")
        assert client.rcpt(free.address)[0] == 250
        code, text = client.data(big)
        assert code == 552 and text.startswith(b"5.3.4")
    assert len(stored(conn, pro.id)) == 1
    assert stored(conn, free.id) == []


def test_mailbox_full_552(server, conn, make_mailbox):
    # a plan that refuses when full (the free plan's seed lets the oldest go: test_inbox_full.py)
    conn.execute("UPDATE mailroom.plans SET max_messages = 1, when_full = 'refuse' WHERE name = 'free'")
    box = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        assert client.sendmail("a@example.com", [box.address], RAW) == {}
        client.ehlo()
        client.mail("a@example.com")
        code, text = client.rcpt(box.address)
    assert code == 552 and text.startswith(b"5.2.2")
    assert len(stored(conn, box.id)) == 1


def test_too_many_recipients_452(start_server, conn, make_mailbox):
    srv = start_server("--max-recipients", "2")
    boxes = [make_mailbox() for _ in range(3)]
    with smtplib.SMTP(srv.host, srv.port, timeout=10) as client:
        client.ehlo()
        client.mail("ann@example.com")
        assert client.rcpt(boxes[0].address)[0] == 250
        assert client.rcpt(boxes[1].address)[0] == 250
        code, text = client.rcpt(boxes[2].address)
        assert code == 452 and text.startswith(b"4.5.3")
        assert client.data(RAW)[0] == 250
    assert [len(stored(conn, b.id)) for b in boxes] == [1, 1, 0]


def test_attachment_metadata(server, conn, make_mailbox):
    box = make_mailbox()
    pdf = b"%PDF-1.4 \x00\x01\x02 binary" * 50
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    msg = EmailMessage()
    msg["From"] = "ann@example.com"
    msg["To"] = box.address
    msg["Subject"] = "files"
    msg.set_content("see attached")
    msg.add_alternative("<p>see <img src='cid:logo@x'></p>", subtype="html")
    msg.add_attachment(pdf, maintype="application", subtype="pdf", filename="report.pdf")
    msg.add_attachment(png, maintype="image", subtype="png", filename="logo.png", cid="<logo@x>")
    raw = msg.as_bytes(policy=msg.policy.clone(linesep="\r\n"))
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        assert client.sendmail("ann@example.com", [box.address], raw) == {}
    (row,) = stored(conn, box.id)
    assert as_sent(bytes(row["raw"])) == raw
    assert row["text_body"].strip() == "see attached"
    assert "cid:logo@x" in row["html_body"]
    assert row["attachments"] == [
        {"filename": "report.pdf", "content_type": "application/pdf", "disposition": "attachment",
         "size": len(pdf), "content_id": None, "sha256": hashlib.sha256(pdf).hexdigest()},
        {"filename": "logo.png", "content_type": "image/png", "disposition": "attachment",
         "size": len(png), "content_id": "logo@x", "sha256": hashlib.sha256(png).hexdigest()},
    ]
    assert b"%PDF" not in json.dumps(row["attachments"]).encode()  # metadata only, not the bytes


def test_non_utf8_and_malformed_mime_still_stored(server, conn, make_mailbox):
    box = make_mailbox()
    raw = (
        b"From: =?x-unknown?q?Ren=E9?= <rene@example.fr>\r\n"
        b"Subject: caf\xe9 cr\xe8me\r\n"
        b"Content-Type: multipart/mixed; boundary=\"never-closed\"\r\n"
        b"\r\n"
        b"--never-closed\r\n"
        b"Content-Type: text/plain; charset=iso-8859-1\r\n"
        b"Content-Transfer-Encoding: 8bit\r\n"
        b"\r\n"
        b"Cr\xe8me br\xfbl\xe9e \x00 with a NUL\r\n"
        b"--never-closed\r\n"
        b"Content-Type: application/octet-stream\r\n"
        b"Content-Transfer-Encoding: base64\r\n"
        b"\r\n"
        b"%%%not base64%%%\r\n"
    )
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        code, _ = client.mail("rene@example.fr", ["BODY=8BITMIME"])
        assert code == 250
        assert client.rcpt(box.address)[0] == 250
        code, _ = client.data(raw)
    assert code == 250
    (row,) = stored(conn, box.id)
    assert as_sent(bytes(row["raw"])) == raw
    assert "Crème brûlée" in row["text_body"]
    assert row["subject"] is not None and "caf" in row["subject"]
    assert len(row["attachments"]) == 1


def test_line_too_long_is_refused_and_not_stored(server, conn, make_mailbox):
    box = make_mailbox()
    raw = b"Subject: long\r\n\r\n" + b"a" * 5000 + b"\r\n"
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        client.mail("ann@example.com")
        assert client.rcpt(box.address)[0] == 250
        code, _ = client.data(raw)
    assert code == 500
    assert total_messages(conn) == 0


def test_empty_message_is_refused_554(server, conn, make_mailbox):
    box = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        client.mail("ann@example.com")
        assert client.rcpt(box.address)[0] == 250
        code, text = client.data(b"\r\n  \r\n")
    assert code == 554 and text.startswith(b"5.6.0")
    assert total_messages(conn) == 0


def test_protocol_errors_keep_nothing(server, conn, make_mailbox):
    box = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        assert client.rcpt(box.address)[0] == 503  # RCPT before MAIL
        client.mail("ann@example.com")
        assert client.docmd("RCPT TO:<not an address>")[0] in (550, 553)
        assert client.docmd("DATA")[0] == 503  # no accepted recipient
    assert total_messages(conn) == 0


def test_idle_timeout_closes_connection(start_server):
    srv = start_server("--idle-timeout", "500ms")
    with socket.create_connection((srv.host, srv.port), timeout=10) as sock:
        assert sock.recv(1024).startswith(b"220")
        started = time.monotonic()
        sock.settimeout(5)
        assert sock.recv(1024) == b""  # the server hung up on an idle client
        assert time.monotonic() - started < 4


def test_a_killed_database_connection_does_not_lose_mail(server, conn, make_mailbox):
    box = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        assert client.sendmail("a@example.com", [box.address], RAW) == {}
        killed = conn.execute(
            # waits (up to 5 s) until each has exited: a kill still under way when RCPT is sent
            # would end that statement, which is answered 451, never re-run blindly
            "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE application_name = 'mailroom-inbox'"
        ).fetchone()[0]
        assert killed >= 1
        code, _ = client.ehlo()
        refused = client.sendmail("a@example.com", [box.address], RAW)
        assert refused == {}
        # Killed between RCPT and DATA: the stale connection is detected before anything is sent.
        client.mail("a@example.com")
        assert client.rcpt(box.address)[0] == 250
        conn.execute("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = 'mailroom-inbox'")
        assert client.data(RAW)[0] == 250
    assert len(stored(conn, box.id)) == 3
    assert "stale database connection" in server.log()


def test_delivery_notifies_ids_only(server, db_url, make_mailbox):
    box = make_mailbox()
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN mailroom_delivery")
        listener.execute("SELECT mailroom.listen(ARRAY['mailroom_delivery'])")  # sql/08: notified while registered
        with smtplib.SMTP(server.host, server.port, timeout=10) as client:
            assert client.sendmail("a@example.com", [box.address], RAW) == {}
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert len(notes) == 1
    payload = json.loads(notes[0].payload)
    assert set(payload) == {"mailbox_id", "message_id"}
    assert payload["mailbox_id"] == box.id


def test_server_log_has_no_addresses(server, conn, make_mailbox):
    box = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.sendmail("secret-sender@example.com", [box.address], RAW)
        client.ehlo()
        client.mail("secret-sender@example.com")
        client.rcpt("nobody@mailroom.test")
    assert server.stop() == 0
    log = server.log()
    assert "stored 1 message(s)" in log
    assert "@" not in log.replace("listening on", "")


def test_serve_bad_flags_exit_2(cli):
    result = cli("inbox", "serve", "--max-recipients", "0")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "mailroom: error: mailroom inbox serve: Invalid value for '--max-recipients' (env var: "
        "'MAILROOM_INBOX_MAX_RECIPIENTS'): Input should be greater than or equal to 1 (see `mailroom inbox serve "
        "--help`)")


def test_serve_started_while_the_database_is_down_waits_then_stops_cleanly(cli_popen):
    """It says once that the database is unreachable and waits (issue 23); SIGTERM ends it with 0."""
    import signal
    import time

    proc = cli_popen("inbox", "serve", "--port", "0",
                     env={"MAILROOM_DATABASE_URL": "host=127.0.0.1 port=1 dbname=x connect_timeout=2"})
    time.sleep(4)
    assert proc.poll() is None, proc.stderr.read().decode()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    err = proc.stderr.read().decode()
    assert err.count("database unreachable") == 1 and "waiting and retrying" in err, err
    assert "listening on" not in err and "Traceback" not in err, err


def test_serve_port_in_use_is_one_line_exit_1(cli, server):
    result = cli("inbox", "serve", "--port", str(server.port), timeout=30)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"mailroom: error: cannot listen on 127.0.0.1:{server.port}")
    assert "Traceback" not in result.stderr


def test_concurrent_clients_while_inboxes_expire_every_250_is_stored_once(server, conn, make_mailbox):
    """4 aiosmtplib clients; half the inboxes expire mid-run and get swept: count(250) == rows.

    With the default server: refusals for expired inboxes never add up to a 421 hang-up."""
    boxes = [make_mailbox(plan="pro") for _ in range(4)]
    accepted: list[tuple[int, int]] = []  # (client, message number) answered 250

    async def client(i: int) -> None:
        smtp = aiosmtplib.SMTP(hostname=server.host, port=server.port, timeout=10)
        await smtp.connect()
        for n in range(12):
            if n == 6 and i == 0:
                # Mid-run, two inboxes expire; the sweep flips them while clients keep sending.
                conn.execute("UPDATE mailroom.mailboxes SET expires_at = clock_timestamp() WHERE id = ANY(%s)",
                             ([boxes[2].id, boxes[3].id],))
                conn.execute("SELECT mailroom.expire_mailboxes()")
            try:
                await smtp.sendmail("load@example.com", [boxes[i].address, boxes[(i + 1) % 4].address],
                                    RAW + f"n={i}/{n}\r\n".encode())
                accepted.append((i, n))
            except aiosmtplib.SMTPException:
                await smtp.rset()
        await smtp.quit()

    async def main() -> None:
        await asyncio.gather(*(client(i) for i in range(4)))

    asyncio.run(main())
    rows = conn.execute("SELECT raw FROM mailroom.messages").fetchall()
    stored_bodies = sorted(bytes(r[0]) for r in rows)
    # Each accepted message went to both recipients or (one refused at RCPT) to the open one only.
    assert len(set(stored_bodies)) == len(accepted)  # every 250 is stored, nothing else is
    assert accepted
    late = conn.execute(
        "SELECT count(*) FROM mailroom.messages AS g JOIN mailroom.mailboxes AS m ON m.id = g.mailbox_id"
        " WHERE g.received_at >= m.expires_at"
    ).fetchone()[0]
    assert late == 0  # nothing landed in an inbox at or after its expiry
    per_body = {b: stored_bodies.count(b) for b in set(stored_bodies)}
    assert all(count in (1, 2) for count in per_body.values())  # never doubled per recipient
    dupes = conn.execute(
        "SELECT count(*) FROM (SELECT mailbox_id, raw FROM mailroom.messages GROUP BY 1, 2 HAVING count(*) > 1) d"
    ).fetchone()[0]
    assert dupes == 0
