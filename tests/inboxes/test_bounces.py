"""Bounces end to end with real SMTP on 127.0.0.1, and the bounce parser on built samples.

- The asynchronous path: `mailroom send` delivers through an aiosmtpd relay that accepts; the
  envelope sender it saw is the VERP return path; an RFC 3464 DSN to that address, sent with
  aiosmtplib to the real `mailroom inbox serve` (login mr_inbound), marks the message bounced,
  suppresses the recipient, and the next enqueue to it is refused (MR318). A forged return path
  is refused at RCPT. (The synchronous path, a 550 at RCPT, is tests/outbound/test_suppress.py.)
- mailroom.inboxes.bounce.parse_bounce on RFC 3464 and plain-text (Postfix, qmail, Exim,
  Sendmail-style) bounces built here.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from email.message import EmailMessage, Message
from email.mime.base import MIMEBase
from email.mime.message import MIMEMessage
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

import aiosmtplib
import psycopg
import pytest
from aiosmtpd.controller import Controller

from mailroom.inboxes.bounce import parse_bounce

BOUNCE_DOMAIN = "bounces.mailroom.test"
RETURN_PATH = re.compile(r"^bounce\+(\d+)-(\d+)-([0-9a-f]{16})@" + re.escape(BOUNCE_DOMAIN) + "$")
SEND_FLAGS = ("--poll-interval", "0.2s", "--smtp-timeout", "5s", "--shutdown-grace", "1s")


# ---------------------------------------------------------------------------------------------
# a relay that accepts everything and remembers each envelope


class _Relay:
    def __init__(self) -> None:
        self.envelopes: list[tuple[str, list[str]]] = []
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd hook name
        with self.lock:
            self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        return "250 2.0.0 Ok: queued"


@pytest.fixture
def relay():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handler = _Relay()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    handler.port = port
    yield handler
    controller.stop()


def _send(conn, cli, relay, to: list[str], bcc: list[str] | None = None) -> tuple[int, dict[str, str]]:
    """Send one message through the relay: its id and the MAIL FROM each recipient's copy had."""
    conn.execute("SELECT mailroom.upsert_sender('main', 'noreply@mailroom.test', '127.0.0.1', %s)", (relay.port,))
    mid = conn.execute(
        "SELECT mailroom.enqueue_message('main', %s, 'Welcome', 'hello', p_bcc => %s)", (to, bcc or [])
    ).fetchone()[0]
    result = cli("send", "--until-idle", *SEND_FLAGS, timeout=60)
    assert result.returncode == 0, result.stderr
    seen = {rcpt: mail_from for mail_from, rcpts in relay.envelopes for rcpt in rcpts}
    assert sorted(seen) == sorted(to + (bcc or []))
    return mid, seen


def _send_and_get_return_path(conn, cli, relay, to: list[str]) -> tuple[int, str]:
    """One recipient: the message id and its return path."""
    mid, seen = _send(conn, cli, relay, to)
    assert len(relay.envelopes) == 1
    return mid, seen[to[0]]


# ---------------------------------------------------------------------------------------------
# DSN samples


def _dsn(reports: list[dict[str, str]], original_to: str = "gone@example.com") -> MIMEMultipart:
    """An RFC 3464 report as an MTA builds it: human text, delivery-status, original headers."""
    dsn = MIMEMultipart("report", report_type="delivery-status")
    dsn["From"] = "MAILER-DAEMON@relay.example.net"
    dsn["To"] = "noreply@mailroom.test"
    dsn["Subject"] = "Undelivered Mail Returned to Sender"
    dsn.attach(MIMEText("This is the mail system at host relay.example.net.\n\nI'm sorry to have to inform you...\n"))
    status = MIMEBase("message", "delivery-status")
    per_message = Message()
    per_message["Reporting-MTA"] = "dns; relay.example.net"
    per_message["Arrival-Date"] = "Mon, 23 Nov 2026 10:00:00 +0000"
    blocks = [per_message]
    for report in reports:
        block = Message()
        for name, value in report.items():
            block[name] = value
        blocks.append(block)
    status.set_payload(blocks)
    dsn.attach(status)
    original = Message()
    original["From"] = "noreply@mailroom.test"
    original["To"] = original_to
    original["Subject"] = "Welcome"
    headers = MIMEBase("text", "rfc822-headers")
    headers.set_payload(original.as_string())
    dsn.attach(headers)
    return dsn


def _failed(address: str, status: str = "5.1.1", code: str = "550") -> dict[str, str]:
    return {
        "Final-Recipient": f"rfc822; {address}",
        "Original-Recipient": f"rfc822;{address}",
        "Action": "failed",
        "Status": status,
        "Remote-MTA": "dns; mx.example.com",
        "Diagnostic-Code": f"smtp; {code} {status} <{address}>: Recipient address rejected: User unknown",
    }


async def _deliver(port: int, message, recipients: list[str]) -> aiosmtplib.SMTPResponse | Exception:
    """MAIL FROM:<> (a bounce), RCPT, DATA: the reply to DATA, or the exception of the step refused."""
    async with aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=15) as smtp:
        try:
            await smtp.mail("")
            for rcpt in recipients:
                await smtp.rcpt(rcpt)
            return await smtp.data(message.as_bytes())
        except aiosmtplib.SMTPException as exc:
            return exc


# ---------------------------------------------------------------------------------------------
# end to end


def test_a_dsn_to_the_verp_return_path_suppresses_the_recipient(conn, cli, relay, start_server):
    conn.execute("SELECT mailroom.set_setting('outbound.bounce_domain', %s)", (BOUNCE_DOMAIN,))
    mid, seen = _send(conn, cli, relay, ["gone@example.com", "stay@example.com"])
    assert len(relay.envelopes) == 2, "with VERP, one SMTP transaction per recipient"
    assert seen["gone@example.com"] != seen["stay@example.com"], "each recipient has its own return path"
    for n, rcpt in enumerate(["gone@example.com", "stay@example.com"], start=1):
        match = RETURN_PATH.match(seen[rcpt])
        assert match, "the relay saw no VERP return path in MAIL FROM"
        assert (int(match.group(1)), int(match.group(2))) == (mid, n)
    mail_from = seen["gone@example.com"]
    row = conn.execute("SELECT status::text FROM mailroom.outbound_messages WHERE id = %s", (mid,)).fetchone()
    assert row == ("sent",)

    server = start_server()
    # a delay notice first: noted, nobody suppressed
    delayed = _dsn([{"Final-Recipient": "rfc822; stay@example.com", "Action": "delayed", "Status": "4.4.1",
                     "Diagnostic-Code": "smtp; 451 4.4.1 try again later"}])
    reply = asyncio.run(_deliver(server.port, delayed, [seen["stay@example.com"]]))
    assert not isinstance(reply, Exception), reply
    assert reply.code == 250 and "bounce recorded" in reply.message
    assert conn.execute("SELECT mailroom.is_suppressed('stay@example.com')").fetchone()[0] is False

    # the failure of one of the two recipients: that one is suppressed, with this message as source
    reply = asyncio.run(_deliver(server.port, _dsn([_failed("Gone@Example.com")]), [mail_from]))
    assert not isinstance(reply, Exception), reply
    assert reply.code == 250
    assert conn.execute(
        "SELECT outcome, recipient, status FROM mailroom.outbound_bounces WHERE message_id = %s ORDER BY id", (mid,)
    ).fetchall() == [("delayed", "to[2]", "4.4.1"), ("hard_bounce", "to[1]", "5.1.1")]
    assert conn.execute(
        "SELECT reason, source_message FROM mailroom.suppressions WHERE address = 'gone@example.com'"
    ).fetchone() == ("hard_bounce", mid)
    assert conn.execute("SELECT mailroom.is_suppressed('stay@example.com')").fetchone()[0] is False
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT mailroom.enqueue_message('main', ARRAY['gone@example.com'], 'again', 'hello')")
    assert err.value.sqlstate == "MR318"

    # nothing stored in any inbox, no address in the server's log
    assert conn.execute("SELECT count(*) FROM mailroom.messages").fetchone()[0] == 0
    log = server.log()
    assert f"bounce for outbound message {mid}: hard_bounce (1 report(s), 1 suppressed)" in log
    assert "@" not in log.replace(f"{BOUNCE_DOMAIN}", "")


def test_a_recipient_cannot_get_the_others_suppressed_nor_replay(conn, cli, relay, start_server):
    """Issue 21, item 2: a recipient of a multi-recipient message sends a DSN naming the others (Bcc
    included) to the return path its copy carried: nobody else is suppressed. And a return path
    suppresses at most once: after an admin removes the entry, the same DSN replayed does nothing."""
    conn.execute("SELECT mailroom.set_setting('outbound.bounce_domain', %s)", (BOUNCE_DOMAIN,))
    mid, seen = _send(conn, cli, relay, ["mallory@example.com", "alice@example.com"], bcc=["bob@example.com"])
    server = start_server()
    forged = _dsn([_failed("alice@example.com"), _failed("bob@example.com")])
    reply = asyncio.run(_deliver(server.port, forged, [seen["mallory@example.com"]]))
    assert not isinstance(reply, Exception), reply
    assert reply.code == 250
    assert conn.execute("SELECT count(*) FROM mailroom.suppressions").fetchone()[0] == 0, \
        "a DSN to one recipient's return path suppressed another recipient"

    # alice's own bounce suppresses alice, once
    own = _dsn([_failed("alice@example.com")])
    reply = asyncio.run(_deliver(server.port, own, [seen["alice@example.com"]]))
    assert not isinstance(reply, Exception) and reply.code == 250, reply
    assert conn.execute("SELECT mailroom.is_suppressed('alice@example.com')").fetchone()[0] is True
    assert conn.execute("SELECT mailroom.unsuppress('alice@example.com')").fetchone()[0] is True
    reply = asyncio.run(_deliver(server.port, own, [seen["alice@example.com"]]))
    assert not isinstance(reply, Exception) and reply.code == 250, reply
    assert conn.execute("SELECT count(*) FROM mailroom.suppressions").fetchone()[0] == 0, \
        "a replayed DSN suppressed again after the admin removed the entry"


def test_a_forged_return_path_is_refused_at_rcpt(conn, cli, relay, start_server):
    conn.execute("SELECT mailroom.set_setting('outbound.bounce_domain', %s)", (BOUNCE_DOMAIN,))
    mid, mail_from = _send_and_get_return_path(conn, cli, relay, ["gone@example.com"])
    server = start_server("--max-bad-recipients", "2")
    forged = RETURN_PATH.sub(lambda m: f"bounce+{m.group(1)}-{m.group(2)}-{'a' * 16}@{BOUNCE_DOMAIN}", mail_from)
    assert forged != mail_from

    async def session() -> list[int]:
        async with aiosmtplib.SMTP(hostname="127.0.0.1", port=server.port, timeout=15) as smtp:
            await smtp.mail("")
            codes = []
            for rcpt in (forged, f"bounce+{mid + 1000}-1-{'b' * 16}@{BOUNCE_DOMAIN}"):
                try:
                    codes.append((await smtp.rcpt(rcpt))[0])
                except aiosmtplib.SMTPRecipientRefused as exc:
                    codes.append(exc.code)
            try:  # two unknown recipients: the session's limit is reached
                await smtp.rcpt(mail_from)
            except aiosmtplib.SMTPException as exc:
                codes.append(getattr(exc, "code", 0))
            return codes

    codes = asyncio.run(session())
    assert codes[:2] == [550, 550]
    assert codes[2] == 421, "forged return paths count as unknown recipients"
    reply = asyncio.run(_deliver(server.port, _dsn([_failed("gone@example.com")]), [forged]))
    assert isinstance(reply, aiosmtplib.SMTPRecipientRefused) and reply.code == 550
    assert conn.execute("SELECT count(*) FROM mailroom.suppressions").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM mailroom.outbound_bounces").fetchone()[0] == 0


def test_unparsed_bounce_is_accepted_and_noted_and_kinds_do_not_mix(conn, cli, relay, start_server, make_mailbox):
    conn.execute("SELECT mailroom.set_setting('outbound.bounce_domain', %s)", (BOUNCE_DOMAIN,))
    mid, mail_from = _send_and_get_return_path(conn, cli, relay, ["gone@example.com"])
    server = start_server()
    auto_reply = EmailMessage()
    auto_reply["Subject"] = "Out of office"
    auto_reply.set_content("I am away until Monday.")
    reply = asyncio.run(_deliver(server.port, auto_reply, [mail_from]))
    assert not isinstance(reply, Exception), reply
    assert reply.code == 250
    assert conn.execute(
        "SELECT outcome FROM mailroom.outbound_bounces WHERE message_id = %s", (mid,)
    ).fetchall() == [("unparsed",)]
    assert conn.execute("SELECT count(*) FROM mailroom.suppressions").fetchone()[0] == 0

    box = make_mailbox()

    async def mixed() -> list[int]:
        async with aiosmtplib.SMTP(hostname="127.0.0.1", port=server.port, timeout=15) as smtp:
            await smtp.mail("")
            first = (await smtp.rcpt(mail_from))[0]
            try:
                second = (await smtp.rcpt(box.address))[0]
            except aiosmtplib.SMTPRecipientRefused as exc:
                second = exc.code
            return [first, second]

    assert asyncio.run(mixed()) == [250, 452]


def test_no_bounce_domain_keeps_the_from_address(conn, cli, relay):
    _, mail_from = _send_and_get_return_path(conn, cli, relay, ["someone@example.com"])
    assert mail_from == "noreply@mailroom.test"


def test_a_senders_own_bounce_domain_from_the_cli(conn, cli, relay):
    conn.execute("SELECT mailroom.set_setting('outbound.bounce_domain', %s)", (BOUNCE_DOMAIN,))
    saved = cli("outbound", "sender", "main", "--from", "noreply@mailroom.test", "--host", "127.0.0.1",
                "--port", str(relay.port), "--bounce-domain", "Own.Example.org")
    assert saved.returncode == 0, saved.stderr
    mid, mail_from = _send_and_get_return_path(conn, cli, relay, ["someone@example.com"])
    assert re.fullmatch(rf"bounce\+{mid}-1-[0-9a-f]{{16}}@own\.example\.org", mail_from)
    bad = cli("outbound", "sender", "main", "--from", "noreply@mailroom.test", "--host", "127.0.0.1",
              "--port", str(relay.port), "--bounce-domain", "not a domain")
    assert bad.returncode != 0 and bad.stderr.startswith("mailroom: error:") and "Traceback" not in bad.stderr


# ---------------------------------------------------------------------------------------------
# the parser


def test_parse_rfc3464_report():
    raw = _dsn([_failed("gone@example.com"), {"Final-Recipient": "rfc822;late@example.com",
                                                "Action": "delayed", "Status": "4.4.1"}]).as_bytes()
    assert parse_bounce(raw) == [
        {"recipient": "gone@example.com", "action": "failed", "status": "5.1.1", "smtp_code": "550",
         "diagnostic": "smtp; 550 5.1.1 <gone@example.com>: Recipient address rejected: User unknown",
         "source": "rfc3464"},
        {"recipient": "late@example.com", "action": "delayed", "status": "4.4.1", "smtp_code": None,
         "diagnostic": None, "source": "rfc3464"},
    ]


def test_parse_rfc3464_original_recipient_and_text_form():
    # no Final-Recipient address of type rfc822: the Original-Recipient; the status part as plain
    # text (global-delivery-status, RFC 6533) is read too
    dsn = MIMEMultipart("report", report_type="global-delivery-status")
    dsn.attach(MIMEText("failed"))
    part = MIMEBase("message", "global-delivery-status")
    part.set_payload(
        "Reporting-MTA: dns; relay.example.net\r\n\r\n"
        "Original-Recipient: rfc822; Bob@Example.org\r\nFinal-Recipient: x400; bob\r\n"
        "Action: failed (bad mailbox)\r\nStatus: 5.2.1 (mailbox disabled)\r\n"
    )
    dsn.attach(part)
    (report,) = parse_bounce(dsn.as_bytes())
    assert (report["recipient"], report["action"], report["status"]) == ("Bob@Example.org", "failed", "5.2.1")


def _plain(body: str, original: str | None = None) -> bytes:
    msg = MIMEText(body) if original is None else MIMEMultipart()
    if original is not None:
        msg.attach(MIMEText(body))
        inner = EmailMessage()
        inner["To"] = "other@example.com"
        inner.set_content(original)
        msg.attach(MIMEMessage(inner))
    msg["From"] = "MAILER-DAEMON@relay.example.net"
    msg["Subject"] = "failure notice"
    return msg.as_bytes()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (  # Postfix
            "This is the mail system at host relay.example.net.\n\n"
            "I'm sorry to have to inform you that your message could not\nbe delivered to one or more recipients.\n\n"
            "<bob@example.com>: host mx.example.com[192.0.2.45] said: 550 5.1.1\n"
            "    <bob@example.com>: Recipient address rejected: User unknown (in reply to\n    RCPT TO command)\n",
            ("bob@example.com", "5.1.1", "550"),
        ),
        (  # qmail
            "Hi. This is the qmail-send program at mail.example.net.\n"
            "I'm afraid I wasn't able to deliver your message to the following addresses.\n"
            "This is a permanent error; I've given up. Sorry it didn't work out.\n\n"
            "<carol@example.com>:\n192.0.2.1 does not like recipient.\n"
            "Remote host said: 554 mailbox disabled\nGiving up on 192.0.2.1.\n\n"
            "--- Below this line is a copy of the message.\n\nTo: dave@example.com\n550 5.1.1 noise\n",
            ("carol@example.com", None, "554"),
        ),
        (  # Exim
            "This message was created automatically by mail delivery software.\n\n"
            "A message that you sent could not be delivered to one or more of its\n"
            "recipients. This is a permanent error. The following address(es) failed:\n\n"
            "  erin@example.com\n    host mx.example.com [192.0.2.7]\n"
            "    SMTP error from remote mail server after RCPT TO:<erin@example.com>:\n"
            "    550-5.1.1 The email account that you tried to reach does not exist.\n",
            ("erin@example.com", "5.1.1", "550"),
        ),
        (  # Sendmail style
            "   ----- The following addresses had permanent fatal errors -----\n"
            "<frank@example.com>\n    (reason: 550 5.7.1 Relaying denied)\n\n"
            "   ----- Transcript of session follows -----\n... while talking to mx.example.com.:\n"
            ">>> RCPT To:<frank@example.com>\n<<< 550 5.7.1 <frank@example.com>... Relaying denied\n",
            ("frank@example.com", "5.7.1", "550"),
        ),
        (  # a 4xx is passed on as it is (SQL decides: no suppression)
            "<gina@example.com>: host mx.example.com[192.0.2.8] said: 452 4.2.2 Mailbox full\n",
            ("gina@example.com", "4.2.2", "452"),
        ),
    ],
    ids=["postfix", "qmail", "exim", "sendmail", "4xx"],
)
def test_parse_plain_text_bounces(body, expected):
    reports = parse_bounce(_plain(body))
    assert [(r["recipient"], r["status"], r["smtp_code"]) for r in reports][:1] == [expected]
    assert all(r["action"] == "failed" and r["source"] == "text" for r in reports)
    assert "dave@example.com" not in [r["recipient"] for r in reports]


def test_parse_ignores_the_attached_original_and_non_bounces():
    # the copy of the original message names an address and a code: not a report
    assert parse_bounce(_plain("Your message could not be delivered.", "Call 550 5.1.1 me@example.com")) == []
    plain = EmailMessage()
    plain["Subject"] = "hello"
    plain.set_content("Meet me at 10:45 in room 12, bring alice@example.com's notes (4521 bytes).\n\nRegards")
    assert parse_bounce(plain.as_bytes()) == []
    assert parse_bounce(b"") == []
    assert parse_bounce(b"\xff\xfe\x00garbage\r\n\r\n\x00") == []
    assert parse_bounce(_dsn([]).as_bytes()) == []


# ---------------------------------------------------------------------------------------------
# complaints (ARF, RFC 5965) and mailto unsubscribes (RFC 2369), issue 27 items 2-3


def _arf(feedback_type: str, original_headers: dict[str, str], original_mail_from: str | None = None) -> MIMEMultipart:
    """An ARF report as a mailbox provider's feedback loop sends it."""
    arf = MIMEMultipart("report", report_type="feedback-report")
    arf["From"] = "fbl@provider.example"
    arf["Subject"] = "complaint about message"
    arf.attach(MIMEText("This is an email abuse report for an email message received from IP 192.0.2.1.\n"))
    report = MIMEBase("message", "feedback-report")
    lines = [f"Feedback-Type: {feedback_type}", "User-Agent: SomeFBL/1.0", "Version: 1"]
    if original_mail_from:
        lines.append(f"Original-Mail-From: <{original_mail_from}>")
    lines.append("Original-Rcpt-To: <victim@example.com>")  # unsigned: never trusted
    report.set_payload("\r\n".join(lines) + "\r\n")
    arf.attach(report)
    original = Message()
    for name, value in original_headers.items():
        original[name] = value
    original.set_payload("the original body\n")
    arf.attach(MIMEMessage(original))
    return arf


def test_parse_arf_report():
    raw = _arf("abuse", {"Return-Path": "<bounce+7-2-0123456789abcdef@b.test>",
                         "List-Unsubscribe": "<https://x.test/unsubscribe/7-2-fedcba9876543210>, "
                                             "<mailto:unsubscribe+7-2-fedcba9876543210@b.test>"},
               original_mail_from="bounce+7-2-0123456789abcdef@b.test").as_bytes()
    assert parse_bounce(raw) == [{
        "feedback_type": "abuse",
        "signed": ["bounce+7-2-0123456789abcdef@b.test", "unsubscribe+7-2-fedcba9876543210@b.test", "7-2-fedcba9876543210"],
        "source": "arf",
    }]


def test_complaints_and_mailto_unsubscribes_suppress_exactly_their_recipient(conn, cli, relay, start_server):
    conn.execute("SELECT mailroom.set_setting('outbound.bounce_domain', %s)", (BOUNCE_DOMAIN,))
    conn.execute("SELECT mailroom.set_setting('outbound.feedback_address', %s)", (f"fbl@{BOUNCE_DOMAIN}",))
    conn.execute("SELECT mailroom.upsert_sender('main', 'noreply@mailroom.test', '127.0.0.1', %s)", (relay.port,))
    conn.execute("SELECT mailroom.enqueue_bulk_message('main', ARRAY['c1@example.com', 'c2@example.com', "
                 "'c3@example.com', 'c4@example.com'], 'News', 'hello')")
    result = cli("send", "--until-idle", *SEND_FLAGS, timeout=60)
    assert result.returncode == 0, result.stderr
    seen = {rcpt: mail_from for mail_from, rcpts in relay.envelopes for rcpt in rcpts}
    unsubscribe = {r: re.sub(r"^bounce\+", "unsubscribe+", p) for r, p in seen.items()}  # the form, not the signature
    server = start_server()

    def reasons() -> list[tuple[str, str]]:
        return conn.execute("SELECT address, reason FROM mailroom.suppressions ORDER BY address").fetchall()

    # a complaint at the feedback address names c1 by the return path its original quotes
    arf = _arf("abuse", {"Return-Path": f"<{seen['c1@example.com']}>", "Subject": "News"})
    reply = asyncio.run(_deliver(server.port, arf, [f"fbl@{BOUNCE_DOMAIN}"]))
    assert not isinstance(reply, Exception) and reply.code == 250, reply
    assert reasons() == [("c1@example.com", "complaint")]
    # a complaint at c2's return path: c2, whatever the report quotes (Original-Rcpt-To is unsigned)
    arf = _arf("abuse", {"Subject": "News"}, original_mail_from=seen["c3@example.com"])
    reply = asyncio.run(_deliver(server.port, arf, [seen["c2@example.com"]]))
    assert not isinstance(reply, Exception) and reply.code == 250, reply
    assert reasons() == [("c1@example.com", "complaint"), ("c2@example.com", "complaint")]
    # not-spam is no complaint; a replay after the admin removed c1 does nothing
    arf = _arf("not-spam", {"Return-Path": f"<{seen['c4@example.com']}>"})
    assert asyncio.run(_deliver(server.port, arf, [f"fbl@{BOUNCE_DOMAIN}"])).code == 250
    conn.execute("SELECT mailroom.unsuppress('c1@example.com')")
    arf = _arf("abuse", {"Return-Path": f"<{seen['c1@example.com']}>"})
    assert asyncio.run(_deliver(server.port, arf, [f"fbl@{BOUNCE_DOMAIN}"])).code == 250
    assert reasons() == [("c2@example.com", "complaint")]

    # the List-Unsubscribe mailto of c3 (the third envelope recipient): any mail to it unsubscribes c3
    mailto = conn.execute(
        "SELECT u[1] FROM (SELECT regexp_match((mailroom_internal._list_unsubscribe(m.id, m.sender_id, 4))[3], "
        "'mailto:([^>]+)') AS u FROM mailroom.outbound_messages AS m) AS x"
    ).fetchone()[0]
    assert mailto.startswith("unsubscribe+") and mailto != unsubscribe["c3@example.com"]
    note = EmailMessage()
    note["Subject"] = "unsubscribe"
    note.set_content("")
    reply = asyncio.run(_deliver(server.port, note, [mailto]))
    assert not isinstance(reply, Exception) and reply.code == 250, reply
    assert reasons() == [("c2@example.com", "complaint"), ("c3@example.com", "unsubscribe")]
    # a forged unsubscribe address (another recipient's position under c3's signature) is refused at RCPT
    forged = re.sub(r"-3-", "-4-", mailto)
    reply = asyncio.run(_deliver(server.port, note, [forged]))
    assert isinstance(reply, aiosmtplib.SMTPRecipientRefused) and reply.code == 550
    assert reasons() == [("c2@example.com", "complaint"), ("c3@example.com", "unsubscribe")]
