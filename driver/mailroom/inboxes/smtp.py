"""The SMTP protocol layer of `mailroom inbox serve`: aiosmtpd, its limits and its replies.

It asks mailroom.inboxes.delivery everything that needs the database and sends the reply:
- MAIL FROM / RCPT TO: the path is read in time linear in its length (mailroom.inboxes.addresses).
- RCPT TO: the recipient's verdict (`mailroom.check_bounce_recipient`: the mailbox's
  check_recipient verdict, or 'bounce' for a valid VERP return path). Unknown, deleted, expired →
  550 5.1.1; over the plan's size for a declared SIZE → 552 5.3.4; full → 552 5.2.2; more than
  --max-recipients → 452 4.5.3. A forged or unknown return path is 'unknown' (550 5.1.1, counted
  like any unknown recipient). A transaction is either for return paths or for mailboxes (the
  other kind gets 452 4.5.3: send it in another one).
- DATA is read by InboundSMTP.smtp_DATA. Every _SIZE_PROBE_BYTES past what is known to fit, it asks
  whether any accepted recipient's plan still takes the running size; when none does, the buffer
  is dropped, the rest is read and thrown away and the reply is 552 5.3.4 (the connection stays
  usable). So a message is never held past the largest limit of its recipients by more than one
  probe step; deliver_message still checks the exact size. Then the message (or the bounce) is
  delivered and its reply sent: 250 only after COMMIT.
- Abuse limits: --max-bad-recipients refused recipients per session, then 421 and hang up;
  --max-sessions connections at once, more get 421 before any database work; --idle-timeout.
- STARTTLS (RFC 3207) when the server has a certificate (--tls-cert/--tls-key), advertised in EHLO;
  with --require-tls every command but EHLO, NOOP, STARTTLS and QUIT gets 530 5.7.0 before it.
- Logs carry counts, sizes and ids, never addresses or subjects.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AnyStr

import psycopg
from aiosmtpd.smtp import SMTP, Envelope, Session

from mailroom.core.errors import describe_db_error
from mailroom.core.log import get_logger
from mailroom.inboxes.addresses import parse_path
from mailroom.inboxes.delivery import REPLY_TEMPFAIL, Delivery
from mailroom.inboxes.metrics import RCPT_VERDICTS, InboundMetrics
from mailroom.inboxes.mime import clean_text

log = get_logger("inbox")

# InboundSMTP builds on aiosmtpd's internals: smtp_DATA is aiosmtpd 1.4.6's DATA handler with a reader
# bounded by the transaction's recipients (aiosmtpd's public hooks only see a message once it is all
# in memory), and it uses the members below. These are the versions it is tested with; pyproject.toml
# allows no newer minor release, tests/inboxes/test_aiosmtpd_pin.py fails on any version not listed
# here, and `inbox serve` warns at start on one.
AIOSMTPD_TESTED = ("1.4.6",)
AIOSMTPD_INTERNALS = ("_tls_protocol", "_reader", "_set_post_data_state", "_call_handler_hook", "_reset_timeout",
                      "_handler_coroutine", "_getaddr", "_create_session", "_create_envelope")

# Replies of the protocol layer (a recipient's or a message's verdict comes with its reply from SQL).
# Addresses are never echoed back or logged.
REPLY_TOO_MANY = "452 4.5.3 Too many recipients"
REPLY_OVER_SIZE = "552 5.3.4 Message too big for this mailbox"  # over the server's SIZE (--max-message-size)
REPLY_TOO_MANY_BAD = "421 4.7.0 Too many invalid recipients, closing connection"
REPLY_BUSY = "421 4.3.2 Too many connections, try again later"
REPLY_LINE_TOO_LONG = "500 Line too long (see RFC5321 4.5.3.1.6)"
REPLY_SEPARATE = "452 4.5.3 Bounces and mail for inboxes go in separate transactions"
REPLY_STARTTLS_FIRST = "530 5.7.0 Must issue a STARTTLS command first"
# aiosmtpd's own reply when require_starttls refuses a command (RFC 3207's text, without the enhanced
# status code mailroom's other replies carry): InboundSMTP.push answers REPLY_STARTTLS_FIRST instead
AIOSMTPD_STARTTLS_FIRST = "530 Must issue a STARTTLS command first"


def _declared_size(mail_options: list[str]) -> int | None:
    for option in mail_options:
        key, _, value = option.partition("=")
        if key.upper() == "SIZE" and value.isdigit():
            return int(value)
    return None


# DATA asks whether the message still fits each time it grows this much past the largest size known
# to fit: a message never costs a query below it (or below a SIZE= every recipient accepted at RCPT), and
# is never held past its recipients' largest limit by more than this (plus the line being read).
_SIZE_PROBE_BYTES = 256 * 1024


class _Envelope(Envelope):
    """One transaction (a new one per MAIL, after DATA and at RSET)."""

    def __init__(self) -> None:
        super().__init__()
        self.accepted: list[str] = []  # SQL's normalized form of the accepted recipients, each once
        self.accepted_count = 0  # RCPTs answered 250 (a repeated address counts again)
        self.bounces: list[str] = []  # accepted VERP return paths (normalized), each once


class _Session(Session):
    """One connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        # unknown recipients in this session, whatever the transaction (a directory-harvest defence;
        # expired and deleted inboxes are the normal life of this service and do not count)
        self.refused_recipients = 0


class InboxHandler:
    """aiosmtpd handler: RCPT checks and DATA delivery through the SQL API."""

    def __init__(self, delivery: Delivery, *, max_recipients: int = 100, metrics: InboundMetrics | None = None) -> None:
        self.delivery = delivery
        self.max_recipients = max_recipients
        self.metrics = metrics or InboundMetrics()
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def handle_RCPT(  # noqa: N802 - aiosmtpd hook name
        self, server: SMTP, session: _Session, envelope: _Envelope, address: str, rcpt_options: list[str]
    ) -> str:
        if envelope.accepted_count >= self.max_recipients:
            self.metrics.recipients.labels(verdict="too_many").inc()
            return REPLY_TOO_MANY
        address = clean_text(address) or ""
        try:
            verdict, normalized, refusal = await self.delivery.recipient(address, _declared_size(envelope.mail_options))
        except psycopg.OperationalError as exc:  # lost, or no answer within --db-timeout
            self.delivery.unreachable("recipient check", exc)
            self.metrics.recipients.labels(verdict="tempfail").inc()
            return REPLY_TEMPFAIL
        except psycopg.Error as exc:
            log.error("recipient check failed: %s", describe_db_error(exc))
            self.metrics.recipients.labels(verdict="tempfail").inc()
            return REPLY_TEMPFAIL
        except Exception as exc:  # noqa: BLE001 - a 4xx, never a traceback to the client
            log.error("recipient check failed unexpectedly: %s", type(exc).__name__)
            self.metrics.recipients.labels(verdict="tempfail").inc()
            return REPLY_TEMPFAIL
        self.delivery.reached()
        self.metrics.recipients.labels(verdict=verdict if verdict in RCPT_VERDICTS else "other").inc()
        if refusal is not None:
            if verdict == "unknown":  # the directory-harvest count (see _Session)
                session.refused_recipients += 1
            log.info("refused a recipient at RCPT: %s", verdict)
            return refusal
        if verdict == "bounce":
            if envelope.accepted:
                return REPLY_SEPARATE
            envelope.accepted_count += 1
            if normalized not in envelope.bounces:
                envelope.bounces.append(normalized)
                envelope.rcpt_tos.append(address)
            return "250 2.1.5 OK"
        if envelope.bounces:
            return REPLY_SEPARATE
        envelope.accepted_count += 1
        if normalized not in envelope.accepted:  # one stored copy per mailbox, however the address was written
            envelope.accepted.append(normalized)
            envelope.rcpt_tos.append(address)
            envelope.rcpt_options.extend(rcpt_options)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:  # noqa: N802
        """Deliver the message (or the bounce report) of the transaction: the reply."""
        self.in_flight += 1
        self.idle.clear()
        try:
            reply = await self._deliver(envelope)
        except Exception as exc:  # noqa: BLE001 - never a 250 without a stored row, never a traceback
            log.error("delivery failed unexpectedly: %s", type(exc).__name__)
            reply = REPLY_TEMPFAIL
        try:
            self.metrics.messages.labels(result=_result_of(reply)).inc()
            return reply
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()

    async def size_refusal(self, envelope: _Envelope, size: int) -> str | None:
        """None when some accepted recipient's plan takes a message of `size` octets, else the
        reply that refuses it (psycopg errors raise)."""
        return await self.delivery.size_refusal(envelope.accepted, size)

    async def _deliver(self, envelope: Envelope) -> str:
        raw = envelope.original_content
        if raw is None:
            raw = envelope.content if isinstance(envelope.content, bytes) else b""
        raw = bytes(raw)
        if isinstance(envelope, _Envelope) and envelope.bounces:
            return await self.delivery.bounce(raw, list(envelope.bounces))
        mail_from = envelope.mail_from or ""
        if mail_from == "<>":
            mail_from = ""
        return await self.delivery.message(raw, clean_text(mail_from) or "", list(envelope.rcpt_tos))

def _result_of(reply: str) -> str:
    """The metric label of a DATA reply: stored (2xx), tempfail (4xx) or refused (5xx)."""
    return {"2": "stored", "4": "tempfail"}.get(reply[:1], "refused")


class _SessionGate:
    """Counts open SMTP sessions for --max-sessions (one event loop: no lock needed)."""

    def __init__(self, limit: int, metrics: InboundMetrics | None = None) -> None:
        self.limit = limit
        self.open = 0
        self._refused = 0
        self._logged_at = float("-inf")
        self.metrics = metrics

    def enter(self) -> bool:
        if self.open < self.limit:
            self.open += 1
            if self.metrics is not None:
                self.metrics.sessions.inc()
                self.metrics.sessions_open.set(self.open)
            return True
        if self.metrics is not None:
            self.metrics.sessions_refused.inc()
        self._refused += 1
        now = time.monotonic()
        if now - self._logged_at >= 10:  # a flood of connections is one line per 10 s, not one each
            log.warning("refused %d connection(s): %d sessions open (--max-sessions)", self._refused, self.open)
            self._refused = 0
            self._logged_at = now
        return False

    def leave(self) -> None:
        self.open -= 1
        if self.metrics is not None:
            self.metrics.sessions_open.set(self.open)


class _Busy(asyncio.Protocol):
    """A connection over --max-sessions: 421 and hang up, before any database work."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(REPLY_BUSY.encode() + b"\r\n")  # type: ignore[attr-defined]
        transport.close()  # after the reply is flushed


class InboundSMTP(SMTP):
    """aiosmtpd's SMTP with the server's per-session limits and a DATA reader bounded by the
    transaction's recipients (aiosmtpd's own holds up to the server-wide data_size_limit)."""

    def __init__(self, handler: InboxHandler, *, max_bad_recipients: int = 10, gate: _SessionGate | None = None,
                 **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.max_bad_recipients = max_bad_recipients
        self._gate = gate  # its slot was taken by the factory, given back at connection_lost

    def _create_session(self) -> _Session:
        return _Session(self.loop)

    async def push(self, status: AnyStr) -> None:
        if status == AIOSMTPD_STARTTLS_FIRST:
            status = REPLY_STARTTLS_FIRST  # type: ignore[assignment]
        await super().push(status)

    def _create_envelope(self) -> _Envelope:
        return _Envelope()

    def connection_lost(self, error: Exception | None) -> None:
        if self._gate is not None:
            self._gate.leave()
            self._gate = None
        super().connection_lost(error)

    async def _hang_up(self, reply: str) -> None:
        """421 and close, like QUIT: commands the client pipelined after it are not run."""
        await self.push(reply)
        if self.transport is not None:
            self.transport.close()  # after the reply is flushed
        if self._handler_coroutine is not None:
            self._handler_coroutine.cancel()  # this very task: it ends at the next await
        await asyncio.sleep(0)  # here, before a pipelined command is read

    def _getaddr(self, arg: str) -> tuple[str | None, str | None]:
        """The path of MAIL FROM / RCPT TO read in time linear in its length (mailroom.inboxes.addresses):
        aiosmtpd's own reading (email's header parser) is quadratic on quotes, dots and backslashes
        and costs ~40 us a call on the simplest path; the answers agree (tests/inboxes/test_inbox_fastpaths.py)."""
        return parse_path(arg, self.local_part_limit)

    async def smtp_RCPT(self, arg: str | None) -> None:  # noqa: N802 - aiosmtpd command name
        assert self.session is not None
        if self.session.refused_recipients >= self.max_bad_recipients:  # type: ignore[attr-defined]
            log.warning("closing a session after %d refused recipient(s)",
                        self.session.refused_recipients)  # type: ignore[attr-defined]
            await self._hang_up(REPLY_TOO_MANY_BAD)
            return
        await super().smtp_RCPT(arg)

    async def smtp_DATA(self, arg: str) -> None:  # noqa: N802 - aiosmtpd command name
        """aiosmtpd 1.4.6's DATA (decode_data=False) with the transaction's size limit.

        The message is kept in one buffer, dot-stuffing removed, so its size is the size
        deliver_message checks. Past the server's SIZE, or past what any accepted recipient's plan
        takes (asked every _SIZE_PROBE_BYTES), the buffer is dropped and the rest is read and thrown
        away up to the final dot; then 552 5.3.4, and the session goes on.
        """
        if await self.check_helo_needed():
            return
        if await self.check_auth_needed("DATA"):
            return
        envelope = self.envelope
        assert isinstance(envelope, _Envelope)
        if not envelope.rcpt_tos:
            await self.push("503 Error: need RCPT command")
            return
        if arg:
            await self.push("501 Syntax: DATA")
            return
        handler: InboxHandler = self.event_handler
        cap = self.data_size_limit or None
        fits = _declared_size(envelope.mail_options) or 0  # every recipient took this SIZE= at RCPT
        await self.push("354 End data with <CR><LF>.<CR><LF>")
        body = bytearray()
        received = 0  # octets of the message so far, dot-stuffing removed, CRLFs counted
        held = 0  # the most the buffer ever held
        refusal: str | None = None
        too_big_for = ""  # whose limit a refused message passed, for the log
        line_start = True
        while True:
            try:
                line = await self._reader.readuntil(b"\r\n")
            except asyncio.LimitOverrunError as exc:
                # Longer than the line limit: take the part read so far (never a lone CR of CRLF).
                refusal = refusal or REPLY_LINE_TOO_LONG
                line = await self._reader.read(exc.consumed)
            if line_start and line == b".\r\n":
                break
            if line_start and line.startswith(b"."):
                line = line[1:]
            line_start = line.endswith(b"\r\n")
            received += len(line)
            if refusal is None and cap is not None and received > cap:
                refusal, too_big_for = REPLY_OVER_SIZE, "the server's SIZE"
            elif refusal is None and not envelope.bounces and received > fits + _SIZE_PROBE_BYTES:
                try:
                    too_big = await handler.size_refusal(envelope, received)
                    if too_big is None:
                        fits = received
                    else:
                        refusal, too_big_for = too_big, "its recipients' size limit"
                except psycopg.OperationalError as exc:
                    handler.delivery.unreachable("size check", exc)
                    refusal = REPLY_TEMPFAIL  # delivery could not succeed either: hold nothing more
                except psycopg.Error as exc:
                    log.error("size check failed: %s", describe_db_error(exc))
                    refusal = REPLY_TEMPFAIL  # delivery could not succeed either: hold nothing more
                except Exception as exc:  # noqa: BLE001 - a 4xx after the data, never a 500 in the middle of it
                    log.error("size check failed unexpectedly: %s", type(exc).__name__)
                    refusal = REPLY_TEMPFAIL
            if refusal is None:
                body += line
            elif body:
                held = max(held, len(body))
                body = bytearray()
        held = max(held, len(body))
        if refusal is not None:
            if too_big_for:
                log.info("refused a message at DATA: over %s (read %d bytes, held at most %d)",
                         too_big_for, received, held)
            self._set_post_data_state()
            await self.push(refusal)
            return
        envelope.original_content = bytes(body)
        envelope.content = envelope.original_content
        del body
        # The idle timer runs from the DATA command (it bounds the transfer); delivery gets a full
        # period of its own, so a slow COMMIT is not cut off before its 250.
        self._reset_timeout()
        status = await self._call_handler_hook("DATA")
        self._set_post_data_state()
        await self.push("250 OK" if not isinstance(status, str) else status)


def _smtp_class(max_line_length: int) -> type[InboundSMTP]:
    """InboundSMTP with our line length limit (the StreamReader limit is read from the class)."""
    return type("InboundSMTP", (InboundSMTP,), {"line_length_limit": max_line_length + 1})


