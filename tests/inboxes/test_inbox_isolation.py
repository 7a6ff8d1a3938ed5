"""One session's mail never holds up or fails another's (issue 21, items 1 and 5), against the real
`mailroom inbox serve` on 127.0.0.1.

- While a 20 MB adversarial message is parsed (a bounce of dash lines to a valid return path, or
  deeply nested MIME to an inbox), another session sends NOOP every 100 ms: each is answered
  within 1 s. Before issue 21 the bounce parser was quadratic and ran with the GIL held (inline
  up to 64 KiB, in a thread above): a 60 KB bounce stalled another client's EHLO for 33 s.
- Messages of concurrent sessions are stored together (group commit, one pooled connection): a
  part with `Content-Type: application/x<NUL>y` and invalid UTF-8 no longer fails its group, and a
  message the database refuses for its content (a trigger raises 22P05 for it here) gets its own
  554 while the others of its group get 250.
"""

from __future__ import annotations

import asyncio
import time
from email.message import EmailMessage

import aiosmtplib
import pytest

BOUNCE_DOMAIN = "bounces.mailroom.test"
# seconds: an idle server answers in about a millisecond and the defect this test caught made a
# NOOP wait 33 s; the bound is generous (developers' guide) because the suite runs one worker
# per core, and 1.0 s failed at 1.03 s on a loaded 2-core machine with nothing wrong
NOOP_BUDGET = 5.0


def _return_path(conn) -> str:
    conn.execute("SELECT mailroom.set_setting('outbound.bounce_domain', %s)", (BOUNCE_DOMAIN,))
    conn.execute("SELECT mailroom.upsert_sender('main', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    mid = conn.execute("SELECT mailroom.enqueue_message('main', ARRAY['gone@example.com'], 's', 'b')").fetchone()[0]
    return conn.execute("SELECT mailroom_internal._return_path(id, sender_id) FROM mailroom.outbound_messages WHERE id = %s",
                        (mid,)).fetchone()[0]


def _adversarial_bounce(size: int) -> bytes:
    # lines of dashes (the old _ORIGINAL backtracked over each of them, O(n^2) a line) and blank lines
    head = (b"From: MAILER-DAEMON@relay.example.net\r\nSubject: Undelivered\r\nContent-Type: text/plain\r\n\r\n"
            b"<gone@example.com>: host mx said: 550 5.1.1 unknown\r\n")
    unit = b"-" * 990 + b"\r\n" + b"\r\n" * 8
    return head + unit * (size // len(unit))


def _adversarial_message(size: int) -> bytes:
    head = b"From: a@x.test\r\nSubject: nested\r\nMIME-Version: 1.0\r\n"
    parts = [head]
    for i in range(200):
        parts.append(b'Content-Type: multipart/mixed; boundary="b%d"\r\n\r\n--b%d\r\n' % (i, i))
    parts.append(b"Content-Type: text/plain\r\n\r\n")
    body = b"".join(parts)
    line = b"--b" + b"x" * 60 + b"\r\n"
    return body + line * ((size - len(body)) // len(line))


async def _command(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: bytes) -> bytes:
    writer.write(line + b"\r\n")
    await writer.drain()
    reply = b""
    while True:
        got = await reader.readline()
        reply += got
        if not got or got[3:4] != b"-":
            return reply


async def _session(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    await reader.readline()  # greeting
    await _command(reader, writer, b"EHLO client.test")
    return reader, writer


async def _noops_while_data(port: int, mail_from: bytes, rcpt: bytes, data: bytes) -> tuple[bytes, list[float]]:
    """Send `data` in one session; meanwhile NOOP from another, every 100 ms, until its reply."""
    reader, writer = await _session(port)
    assert (await _command(reader, writer, b"MAIL FROM:" + mail_from)).startswith(b"250")
    assert (await _command(reader, writer, b"RCPT TO:" + rcpt)).startswith(b"250")
    assert (await _command(reader, writer, b"DATA")).startswith(b"354")
    writer.write(data.replace(b"\r\n.", b"\r\n..") + b"\r\n.\r\n")
    done = asyncio.ensure_future(writer.drain())
    reply = asyncio.ensure_future(reader.readline())
    other_reader, other_writer = await _session(port)
    latencies: list[float] = []
    try:
        while not reply.done():
            started = time.monotonic()
            try:
                answer = await asyncio.wait_for(_command(other_reader, other_writer, b"NOOP"), 30)
            except TimeoutError:
                latencies.append(float("inf"))
                break
            assert answer.startswith(b"250"), answer
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(0.1)
        final = await asyncio.wait_for(reply, 120) if not latencies or latencies[-1] != float("inf") else b""
    finally:
        done.cancel()
        reply.cancel()
        writer.close()
        other_writer.close()
    return final, latencies


@pytest.mark.parametrize("kind", ["bounce", "message"])
def test_another_session_is_answered_while_a_20_mb_adversarial_mail_is_parsed(kind, conn, start_server, make_mailbox):
    server = start_server()
    if kind == "bounce":
        rcpt = b"<" + _return_path(conn).encode() + b">"
        data, mail_from = _adversarial_bounce(20 * 1024 * 1024), b"<>"
    else:
        rcpt = b"<" + make_mailbox(plan="enterprise").address.encode() + b">"
        data, mail_from = _adversarial_message(20 * 1024 * 1024), b"<a@x.test>"
    reply, latencies = asyncio.run(_noops_while_data(server.port, mail_from, rcpt, data))
    assert latencies, "no NOOP was sent"
    assert max(latencies) <= NOOP_BUDGET, f"a NOOP waited {max(latencies):.1f} s while the {kind} was parsed"
    assert reply.startswith(b"250"), reply


def _group_message(address: str, subject: str, poison: bool = False) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = "sender@example.org"
    msg["To"] = address
    msg["Subject"] = subject
    msg.set_content("hello")
    if poison:
        msg.add_attachment(b"%PDF", maintype="application", subtype="pdf", filename="x.pdf")
    return msg


def _with_nul_part(address: str, subject: str) -> bytes:
    return (f"From: sender@example.org\r\nTo: {address}\r\nSubject: {subject}\r\n".encode()
            + b'MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="b"\r\n\r\n'
            b"--b\r\nContent-Type: text/plain; charset=utf-8\r\n\r\ncaf\xe9 \xff\xfe\r\n"
            b"--b\r\nContent-Type: application/x\x00y\r\nContent-Disposition: attachment; filename=\"a\xff\x00.bin\"\r\n\r\n"
            b"data\r\n--b--\r\n")


def test_one_message_never_fails_another_of_its_group(conn, start_server, make_mailbox):
    """Eight sessions over one pooled connection: their messages are stored in shared statements."""
    # a message the database refuses for its content, whatever the parser made of it
    conn.execute("""
        CREATE FUNCTION public.poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.subject LIKE 'poison%' THEN
                RAISE EXCEPTION 'refused for the test' USING ERRCODE = '22P05';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER poison BEFORE INSERT ON mailroom.messages FOR EACH ROW EXECUTE FUNCTION public.poison();
    """)
    server = start_server("--pool-size", "1", "--log-messages")  # the group commit's own line
    box = make_mailbox(plan="pro")
    replies: dict[str, int] = {}

    async def client(n: int) -> None:
        smtp = aiosmtplib.SMTP(hostname=server.host, port=server.port, timeout=60)
        await smtp.connect()
        try:
            for i in range(8):
                # each session's poison at another step, so groups mix poison and fine messages
                kind = "poison" if i == n % 4 + 2 else "nul" if i == 1 else "fine"
                subject = f"{kind} {n}-{i}"
                raw = _with_nul_part(box.address, subject) if i == 1 else _group_message(box.address, subject).as_bytes()
                try:
                    await smtp.sendmail("sender@example.org", [box.address], raw)
                    replies[subject] = 250
                except aiosmtplib.SMTPResponseException as exc:
                    replies[subject] = exc.code
                    await smtp.rset()
        finally:
            await smtp.quit()

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(client(n) for n in range(8))), timeout=120)

    asyncio.run(main())
    assert "group commit:" in server.log(), "the messages were stored in shared statements"
    assert "delivering them one by one" in server.log(), "a group holding the refused message went one by one"
    wrong = {s: code for s, code in replies.items() if (code != 250) != s.startswith("poison")}
    assert not wrong, f"replies that depend on another message: {wrong}"
    assert {code for s, code in replies.items() if s.startswith("poison")} == {554}, replies
    stored = {r[0] for r in conn.execute("SELECT subject FROM mailroom.messages WHERE mailbox_id = %s", (box.id,))}
    assert stored == {s for s in replies if not s.startswith("poison")}
    nul = conn.execute("SELECT attachments FROM mailroom.messages WHERE subject = 'nul 0-1'").fetchone()[0]
    assert nul[0]["filename"] == "a\ufffd\ufffd.bin" and nul[0]["content_type"] == "text/plain"
