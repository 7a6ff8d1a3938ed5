"""SMTP PIPELINING (RFC 2920): where the relay's EHLO offers it, `mailroom send` writes MAIL FROM,
every RCPT TO and DATA at once and reads the replies in order; the message content follows a 354.

Every scenario runs twice in one `mailroom send`: a message to a relay offering PIPELINING and the
same message to a relay that does not (the command-by-command path). Both must end the same way
(status, outcome, reply code, error text, refused recipients, possibly_sent) and deliver the same
bytes; the pipelining relay must see MAIL, RCPT and DATA arrive in one read (the plain one never
does), and no content is ever sent for a transaction the relay refused before DATA.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP as ServerSMTP
from outbound_support import SEND_FLAGS, Handler, add_sender, free_port

from mailroom.core import fastpaths

VARIANTS = ("pipe", "plain")  # the relay offers PIPELINING / does not


@dataclass
class PipeHandler(Handler):
    """outbound_support.Handler, plus: PIPELINING in EHLO (or not), a scripted reply to MAIL and to
    the DATA command itself, and every chunk the server read (to see what arrived together)."""

    pipelining: bool = True
    mail_reply: str | None = None
    data_command_reply: str | None = None
    broken_data: bool = False  # answer DATA with 354 even when no RCPT succeeded
    chunks: list[bytes] = field(default_factory=list)

    async def handle_EHLO(self, server, session, envelope, hostname, responses):  # noqa: N802
        responses = await super().handle_EHLO(server, session, envelope, hostname, responses)
        if self.pipelining:
            responses.insert(1, "250-PIPELINING")
        return responses

    async def handle_MAIL(self, server, session, envelope, address, mail_options):  # noqa: N802
        if self.mail_reply:
            return self.mail_reply
        envelope.mail_from = address
        envelope.mail_options.extend(mail_options)
        return "250 OK"

    def pipelined_reads(self) -> list[bytes]:
        """The reads holding MAIL FROM, RCPT TO and DATA together."""
        with self.lock:
            return [c for c in self.chunks if b"MAIL FROM:" in c and b"RCPT TO:" in c and c.endswith(b"DATA\r\n")]

    def envelope_reads(self) -> list[bytes]:
        with self.lock:
            return [c for c in self.chunks if b"MAIL FROM:" in c or b"RCPT TO:" in c]


class RecordingSMTP(ServerSMTP):
    def data_received(self, data: bytes) -> None:
        handler = self.event_handler
        with handler.lock:
            handler.chunks.append(bytes(data))
        super().data_received(data)

    async def smtp_DATA(self, arg: str) -> None:
        reply = self.event_handler.data_command_reply
        if reply and self.envelope is not None and self.envelope.rcpt_tos:
            await self.push(reply)  # the DATA command refused (its recipients were accepted)
            return
        if self.event_handler.broken_data and self.envelope is not None and not self.envelope.rcpt_tos:
            await self.push("354 go ahead")  # against RFC 2920: no recipient, yet content is invited
            return
        await super().smtp_DATA(arg)


class RecordingController(Controller):
    def factory(self):
        return RecordingSMTP(self.handler, **self.SMTP_kwargs)


@pytest.fixture
def relays():
    """Two relays with the same script: one offers PIPELINING, one does not."""
    started: list[Controller] = []

    def start(**script) -> dict[str, tuple[PipeHandler, int]]:
        out = {}
        for variant in VARIANTS:
            handler = PipeHandler(pipelining=variant == "pipe", **script)
            port = free_port()
            controller = RecordingController(handler, hostname="127.0.0.1", port=port)
            controller.start()
            started.append(controller)
            out[variant] = (handler, port)
        return out

    yield start
    for controller in started:
        try:
            controller.stop()
        except Exception:  # noqa: BLE001 - a stalled handler must not fail teardown
            pass


def _enqueue(conn, variant: str, to: list[str], cc: list[str] = (), bcc: list[str] = (), **kw) -> int:
    """The same message for each variant's sender; its addresses carry the variant (a refusal
    suppresses an address, so the variants must not share one)."""
    def addresses(xs):
        return [f"{variant}-{x}" for x in xs]
    return conn.execute(
        "SELECT mailroom.enqueue_message(%s, %s, %s, %s, %s, %s, %s, %s)",
        (variant, addresses(to), kw.get("subject", "Grüße — pipelined ünïcode"), kw.get("text", "text body\n.dot line"),
         kw.get("html", "<p>html body</p>"), addresses(cc), addresses(bcc), kw.get("headers", '{"X-Campaign": "c1"}')),
    ).fetchone()[0]


def _outcome(conn, message_id: int) -> dict:
    cols = ("status", "attempts", "last_outcome", "last_smtp_code", "last_enhanced_code", "error_log",
            "possibly_sent", "suppressed_recipients", "sent_at IS NOT NULL", "next_retry_at IS NOT NULL")
    values = conn.execute(f"SELECT {', '.join(cols)} FROM mailroom.outbound_messages WHERE id = %s",
                          (message_id,)).fetchone()
    bounces = conn.execute(
        "SELECT outcome, recipient, action, status, smtp_code, diagnostic FROM mailroom.outbound_bounces"
        " WHERE message_id = %s ORDER BY id", (message_id,)).fetchall()
    return dict(zip(cols, values, strict=True)) | {"bounces": bounces}


_VOLATILE = [(re.compile(rb"^Date: .*\r\n", re.M), b"Date: -\r\n"),
             (re.compile(rb"^Message-ID: .*\r\n", re.M), b"Message-ID: -\r\n"),
             (re.compile(rb"={15}\d{19}=="), b"BOUNDARY"),
             (re.compile(rb"\b(pipe|plain)-"), b"X-")]


def _normalized(content: bytes) -> bytes:
    """A delivered message without what differs between two enqueued copies (enqueue time,
    Message-ID, the random boundary, the variant in the addresses)."""
    for pattern, repl in _VOLATILE:
        content = pattern.sub(repl, content)
    return content


def run_both(conn, cli, relays, script: dict, to: list[str], cc=(), bcc=(), extra=(), messages=1, **kw):
    if not fastpaths.enabled():
        pytest.skip("MAILROOM_FAST_PATHS=off: nothing is pipelined (test_pipelining_follows_the_switch checks it)")
    servers = relays(**script)
    ids = {}
    for variant, (_handler, port) in servers.items():
        add_sender(conn, port, name=variant, from_address="robot@mailroom.test")
        ids[variant] = [_enqueue(conn, variant, to, cc, bcc, **kw) for _ in range(messages)]
    result = cli("send", "--until-idle", "--concurrency", "1", *SEND_FLAGS, *extra, timeout=60)
    assert result.returncode == 0, result.stderr
    outcomes = {v: [_outcome(conn, i) for i in ids[v]] for v in VARIANTS}
    assert outcomes["pipe"] == outcomes["plain"], "the pipelined exchange must end as the plain one does"
    handlers = {v: servers[v][0] for v in VARIANTS}
    got = {v: [(_normalized(r.mail_from.encode()), [_normalized(a.encode()) for a in r.rcpt_tos],
                _normalized(r.content)) for r in handlers[v].received] for v in VARIANTS}
    assert got["pipe"] == got["plain"], "the same envelopes and bytes are delivered"
    # the plain relay never saw two envelope commands in one read
    assert all(c.count(b"\r\n") == 1 for c in handlers["plain"].envelope_reads())
    return handlers, outcomes["pipe"], got["pipe"]


def test_pipelined_delivery_is_pipelined_and_byte_identical(conn, cli, relays):
    handlers, outcomes, got = run_both(conn, cli, relays, {}, ["alice@example.com", "al@example.org"],
                                       cc=["carol@example.com"], bcc=["bob@example.com"], messages=3)
    assert [o["status"] for o in outcomes] == ["sent"] * 3 and outcomes[0]["last_smtp_code"] == 250
    assert len(got) == 3
    mail_from, rcpts, content = got[0]
    assert mail_from == b"robot@mailroom.test"
    assert rcpts == [b"X-alice@example.com", b"X-al@example.org", b"X-carol@example.com", b"X-bob@example.com"]
    assert b"Subject: =?utf-8?" in content and b"bob@example.com" not in content
    reads = handlers["pipe"].pipelined_reads()
    assert len(reads) == 3, handlers["pipe"].chunks  # each message's MAIL, 4 RCPTs and DATA in one read
    assert all(r.count(b"RCPT TO:") == 4 for r in reads)
    assert handlers["pipe"].sessions == 1 and handlers["plain"].sessions == 1  # the connection is reused


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_pipelining_follows_the_switch(conn, cli, relays, loop):
    """The guard of the pipelining built on aiosmtplib's internals (outbound/smtp.py, AIOSMTPLIB_TESTED):
    with the fast paths on, a relay offering PIPELINING gets the envelope in one read, so an aiosmtplib
    on which it silently stops fails here; with MAILROOM_FAST_PATHS=off, never. On both event loops:
    uvloop's transport binds the protocol's methods when it is given one, so the pipelining protocol
    reads the replies only when it is given to the transport again (once it was not, and every
    pipelined message waited for replies already read, then timed out)."""
    import aiosmtplib

    handler, port = relays()["pipe"]
    add_sender(conn, port, name="pipe", from_address="robot@mailroom.test")
    message_id = _enqueue(conn, "pipe", ["alice@example.com", "bob@example.com"])
    result = cli("send", "--until-idle", "--concurrency", "1", "--event-loop", loop, *SEND_FLAGS, timeout=60)
    assert result.returncode == 0, result.stderr
    assert f"event loop {loop}" in result.stderr
    assert _outcome(conn, message_id)["status"] == "sent"
    assert len(handler.pipelined_reads()) == (1 if fastpaths.enabled() else 0), (aiosmtplib.__version__, handler.chunks)


def test_no_pipelining_flag_keeps_the_command_by_command_exchange(conn, cli, relays):
    handlers, outcomes, _ = run_both(conn, cli, relays, {}, ["alice@example.com"], extra=("--no-pipelining",))
    assert outcomes[0]["status"] == "sent"
    assert handlers["pipe"].pipelined_reads() == []
    assert all(c.count(b"\r\n") == 1 for c in handlers["pipe"].envelope_reads())


def test_some_recipients_refused(conn, cli, relays):
    script = {"refuse_with": {"pipe-bad@example.com": "550 5.1.1 no such user",
                              "plain-bad@example.com": "550 5.1.1 no such user",
                              "pipe-full@example.com": "452 4.2.2 mailbox full",
                              "plain-full@example.com": "452 4.2.2 mailbox full"}}
    handlers, outcomes, got = run_both(conn, cli, relays, script,
                                       ["good@example.com", "bad@example.com", "full@example.com", "also@example.com"])
    (o,) = outcomes
    assert o["status"] == "sent" and o["last_smtp_code"] == 250
    assert "2 of 4 recipients refused" in o["error_log"]
    assert [b[:5] for b in o["bounces"]] == [("hard_bounce", "to[2]", "refused", "5.1.1", 550),
                                             ("soft_bounce", "to[3]", "refused", "4.2.2", 452)]
    assert got[0][1] == [b"X-good@example.com", b"X-also@example.com"]  # the message went to the accepted ones
    assert len(handlers["pipe"].pipelined_reads()) == 1


@pytest.mark.parametrize("replies", [("550 5.1.1 no such user",), ("450 4.2.1 try later", "550 5.7.1 denied")])
def test_every_recipient_refused_sends_no_content(conn, cli, relays, replies):
    to = [f"r{i}@example.com" for i in range(len(replies))]
    script = {"refuse_with": {f"{v}-{a}": reply for v in VARIANTS for a, reply in zip(to, replies, strict=True)}}
    handlers, outcomes, got = run_both(conn, cli, relays, script, to, messages=2)
    assert got == [] and handlers["pipe"].in_data == 0 and handlers["plain"].in_data == 0
    for o in outcomes:  # finalize_messages picks the governing refusal: a 4xx among them retries
        assert o["status"] == ("failed" if len(replies) == 1 else "queued")
        assert o["last_smtp_code"] == int(replies[0][:3])
        assert [b[4] for b in o["bounces"]] == [int(r[:3]) for r in replies]
    pipe = handlers["pipe"]
    assert len(pipe.pipelined_reads()) == 2  # DATA was pipelined, answered 503, and nothing followed it
    assert not any(b"Subject:" in c or c.startswith(b".") for c in pipe.chunks)
    assert sum(c.count(b"RSET\r\n") for c in pipe.chunks) == 2 and pipe.sessions == 1  # reset and reused


@pytest.mark.parametrize("reply", ["554 5.5.1 no valid recipients today", "451 4.3.0 try DATA later"])
def test_data_command_refused(conn, cli, relays, reply):
    handlers, outcomes, got = run_both(conn, cli, relays, {"data_command_reply": reply}, ["alice@example.com"],
                                       messages=2)
    assert got == []
    for o in outcomes:
        assert o["last_outcome"] == "reply" and o["last_smtp_code"] == int(reply[:3])
        assert o["status"] == ("failed" if reply[0] == "5" else "queued")
    assert not any(b"Subject:" in c for c in handlers["pipe"].chunks)
    assert handlers["pipe"].sessions == 1


@pytest.mark.parametrize("reply", ["550 5.7.1 content rejected", "452 4.3.1 insufficient storage"])
def test_end_of_data_refused(conn, cli, relays, reply):
    handlers, outcomes, got = run_both(conn, cli, relays, {"mode": "reply_data", "reply": reply},
                                       ["alice@example.com"], messages=2)
    for o in outcomes:
        assert o["last_outcome"] == "reply" and o["last_smtp_code"] == int(reply[:3])
        assert o["last_enhanced_code"] == reply.split()[1]
        assert o["status"] == ("failed" if reply[0] == "5" else "queued")
    assert len(handlers["pipe"].pipelined_reads()) == 2 and handlers["pipe"].in_data == 2


@pytest.mark.parametrize("reply", ["550 5.7.1 sender denied", "451 4.7.1 greylisted"])
def test_mail_from_refused(conn, cli, relays, reply):
    handlers, outcomes, got = run_both(conn, cli, relays, {"mail_reply": reply}, ["a@example.com", "b@example.com"],
                                       messages=2)
    assert got == [] and handlers["pipe"].in_data == 0
    for o in outcomes:
        assert o["last_outcome"] == "reply" and o["last_smtp_code"] == int(reply[:3])
    pipe = handlers["pipe"]
    assert len(pipe.pipelined_reads()) == 2 and not any(b"Subject:" in c for c in pipe.chunks)
    assert pipe.sessions == 1  # the replies to the RCPTs and DATA were read, RSET, reused


def test_connection_closed_at_rcpt(conn, cli, relays):
    """The relay closes the connection at RCPT: dropped (retried, not possibly sent) the same way
    with or without pipelining."""
    handlers, outcomes, got = run_both(conn, cli, relays, {"mode": "drop_rcpt"}, ["a@example.com"])
    (o,) = outcomes
    assert got == [] and o["status"] == "queued" and o["possibly_sent"] is False
    assert o["last_outcome"] == "dropped" and "connection lost during envelope" in o["error_log"]
    assert handlers["pipe"].pipelined_reads()


def test_content_is_never_sent_when_data_is_invited_after_every_rcpt_failed(conn, cli, relays):
    """A relay answering 354 to a pipelined DATA although it refused every RCPT: the sender closes
    the connection instead of sending anything (nothing can be delivered), and reports the refusal
    as the plain exchange does (which never sends DATA then)."""
    script = {"broken_data": True, "refuse": ("pipe-a@example.com", "plain-a@example.com"), "reply": "550 5.1.1 no"}
    handlers, outcomes, got = run_both(conn, cli, relays, script, ["a@example.com"], messages=2)
    assert got == [] and [o["status"] for o in outcomes] == ["failed", "failed"]
    pipe = handlers["pipe"]
    assert len(pipe.pipelined_reads()) == 2
    assert not any(b"Subject:" in c or b"RSET" in c for c in pipe.chunks)
    assert pipe.sessions == 2 and handlers["plain"].sessions == 1  # closed, not reset and reused
