"""SMTP to the relays: a slot's reused connections (one per relay) and one transaction on them.

`deliver()` never decides what a failure means: it reports the raw outcome (kind, reply code,
enhanced status code, reply text) and mailroom.finalize_messages classifies it in SQL. The message
itself is built by mailroom.outbound.message.

When the relay's EHLO offers PIPELINING (RFC 2920), MAIL FROM, every RCPT TO and DATA leave in one
write and their replies are read in order (`SMTP`, a small extension of aiosmtplib's client), then the
content and its end; the replies go through the same checks, one by one, as aiosmtplib's mail(),
rcpt() and data(), so every outcome is the one the command-by-command exchange would report.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import re
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

import aiosmtplib
from aiosmtplib.email import quote_address
from aiosmtplib.protocol import PERIOD_REGEX, SMTPProtocol, normalize_message_line_endings
from aiosmtplib.response import SMTPResponse

from mailroom.core import fastpaths
from mailroom.outbound.dkim import Signer
from mailroom.outbound.message import envelope_recipients, message_bytes
from mailroom.outbound.metrics import SenderMetrics

# Pipelining builds on aiosmtplib's internals (the protocol's reply buffer and parser, the client's
# _create_connection), as of these releases (pyproject.toml allows no other major); with another one, or
# MAILROOM_FAST_PATHS=off, every transaction is sent command by command (tests/outbound/test_pipelining.py
# fails when the pipelining relay sees no pipelined read with the switch on).
AIOSMTPLIB_TESTED = ("5.",)
try:
    from aiosmtplib.protocol import COMMAND_INJECTION_REGEX, MAX_RESPONSE_LENGTH
except ImportError:  # pragma: no cover - an untested aiosmtplib
    COMMAND_INJECTION_REGEX, MAX_RESPONSE_LENGTH = re.compile(rb"[\x00-\x1f\x7f]"), 8192 * 4
    AIOSMTPLIB_TESTED = ()
_PIPELINING_SUPPORTED = aiosmtplib.__version__.startswith(AIOSMTPLIB_TESTED) and fastpaths.enabled()


_ENHANCED = re.compile(r"^\s*([245]\.\d{1,3}\.\d{1,3})\b")


@dataclass(frozen=True)
class Relay:
    host: str
    port: int
    security: str
    username: str | None
    password: str | None = field(repr=False)
    # the operator's opt-in to log in without TLS (a loopback relay only: upsert_sender checks it)
    allow_cleartext: bool = False

    @property
    def cleartext_login(self) -> bool:
        """Credentials would cross plain TCP: refused unless opted in (issue 21, item 8)."""
        return bool(self.username) and self.security == "none" and not self.allow_cleartext


@dataclass
class Outcome:
    id: int
    claim_token: int
    outcome: str  # sent | reply | refused (every recipient, at RCPT) | dropped | timeout | connect | uncertain | local
    code: int | None = None
    enhanced: str | None = None
    error: str | None = None  # raw reply text: scrubbed by the database before it is stored
    seconds: float | None = None
    # recipients the relay refused at RCPT (address, reply code, enhanced code): reported to
    # mailroom.record_refused_recipients, which decides what each means, before finalize
    refused: list[tuple[str, int, str | None]] = field(default_factory=list)


def _enhanced(message: str | None) -> str | None:
    match = _ENHANCED.match(message or "")
    return match.group(1) if match else None


def _reply(exc: aiosmtplib.SMTPResponseException) -> tuple[int, str | None, str]:
    text = (exc.message or "").strip()
    return exc.code, _enhanced(text), f"{exc.code} {text}".strip()


# ---------------------------------------------------------------------------------------------
# SMTP command pipelining (RFC 2920) on top of aiosmtplib 5 (which has no API for it)


class _PipeliningProtocol(SMTPProtocol):
    """aiosmtplib's protocol, able to hold several replies in flight.

    Outside a pipelined exchange it is SMTPProtocol unchanged. Inside one (begin_pipeline ..
    end_pipeline) every complete reply that arrives is queued in order (SMTPProtocol keeps one
    reply and drops data that comes while it is waiting to be picked up), a lost connection is
    queued after the replies that came before it, and read_pipelined() takes them one by one."""

    _replies: collections.deque[SMTPResponse | BaseException] | None = None
    _arrived: asyncio.Future[None] | None = None

    def begin_pipeline(self) -> None:
        self._replies = collections.deque()

    def end_pipeline(self) -> bool:
        """Back to one reply per command; whether nothing is left unread (else the connection is unusable)."""
        clean = not self._replies and not self._buffer
        self._replies = self._arrived = None
        return clean

    def data_received(self, data: bytes) -> None:
        replies = self._replies
        if replies is None:
            super().data_received(data)
            return
        self._buffer.extend(data)
        try:
            while (response := self._read_response_from_buffer()) is not None:
                replies.append(response)
            if len(self._buffer) > MAX_RESPONSE_LENGTH:
                raise aiosmtplib.SMTPResponseException(aiosmtplib.SMTPStatus.invalid_response, "Response too long")
        except Exception as exc:  # noqa: BLE001 - a malformed reply: raised to the reader in its turn
            del self._buffer[:]
            replies.append(exc)
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._replies is not None:
            lost = aiosmtplib.SMTPServerDisconnected("Connection lost")
            lost.__cause__ = exc
            self._replies.append(lost)
            self._wake()
        super().connection_lost(exc)

    def _wake(self) -> None:
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)

    async def read_pipelined(self, timeout: float | None) -> SMTPResponse:
        """The next reply of the pipelined exchange (a lost connection or malformed reply raises, and keeps raising)."""
        assert self._replies is not None
        while not self._replies:
            self._arrived = self._loop.create_future()
            try:
                await asyncio.wait_for(self._arrived, timeout)
            except TimeoutError as exc:
                raise aiosmtplib.SMTPReadTimeoutError("Timed out waiting for server response") from exc
        item = self._replies[0]
        if isinstance(item, BaseException):
            raise item
        self._replies.popleft()
        return item


# a dot-atom local part @ a domain of letters, digits, hyphens and dots: what quote_address gives
# back as it is, in angle brackets (tests/outbound/test_pipelining.py compares the two)
_PLAIN_ADDRESS = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
                            r"@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*")


def _quoted(address: str) -> bytes:
    """The address as mail() and rcpt() put it on the command line: a plain address as it is, any
    other through aiosmtplib's quote_address (parseaddr, ~30 us; a ValueError it raises is not
    cached)."""
    if _PLAIN_ADDRESS.fullmatch(address):
        return b"<" + address.encode("ascii") + b">"
    return _quoted_parsed(address)


@functools.lru_cache(maxsize=4096)
def _quoted_parsed(address: str) -> bytes:
    return quote_address(address).encode("ascii")


def _content(payload: bytes) -> bytes:
    """The DATA content as aiosmtplib's data() sends it (line ends made CRLF, the message ending in
    one, a leading period doubled, the final '.'), its regular expressions skipped when a scan of
    the bytes shows they would change nothing (a rendered message: CRLF throughout)."""
    crlf = payload.count(b"\r\n")
    if crlf != payload.count(b"\n") or crlf != payload.count(b"\r") or not payload.endswith(b"\r\n"):
        payload = normalize_message_line_endings(payload)
    if payload.startswith(b".") or b"\n." in payload:
        payload = PERIOD_REGEX.sub(b"..", payload)
    return payload + b".\r\n"


class SMTP(aiosmtplib.SMTP):
    """aiosmtplib's client whose connections can pipeline a transaction (`transaction()`)."""

    async def _create_connection(self, timeout: float | None) -> SMTPResponse:
        response = await super()._create_connection(timeout)
        if _PIPELINING_SUPPORTED and type(self.protocol) is SMTPProtocol:
            # the same object, able to hold several replies (no state of its own until a pipeline begins);
            # given to its transport again (asyncio's public set_protocol), since a transport may have
            # bound the protocol's methods when it was made (uvloop's does: the replies of a pipeline
            # would go on to SMTPProtocol.data_received, and its reader would wait for nothing)
            self.protocol.__class__ = _PipeliningProtocol
            if self.transport is not None:
                self.transport.set_protocol(self.protocol)
        return response

    async def transaction(self, mail_from: str, rcpts: list[str], pipelining: bool) -> _Sequential | _Pipeline:
        """One mail transaction: pipelined (RFC 2920) when allowed and the relay's EHLO offers it,
        else command by command. Either way the caller runs mail(), rcpt() for each recipient in
        order, then data() (or abandon() when it stops before)."""
        await self._ehlo_or_helo_if_needed()  # what mail() does first (its failures are mail()'s)
        protocol = self.protocol
        if not (pipelining and self.supports_extension("pipelining") and isinstance(protocol, _PipeliningProtocol)):
            return _Sequential(self, mail_from)
        try:
            # the command lines mail() and rcpt() would write, checked the way execute_command checks them
            lines = [b"MAIL FROM:" + _quoted(mail_from)] + [b"RCPT TO:" + _quoted(rcpt) for rcpt in rcpts]
            if any(COMMAND_INJECTION_REGEX.search(line) for line in lines):
                raise ValueError("Command arg contains a prohibited control character")
        except ValueError:
            return _Sequential(self, mail_from)  # mail() or rcpt() raises it at its own step, as ever
        protocol.begin_pipeline()
        pipeline = _Pipeline(self, protocol, mail_from, len(lines) + 1)
        try:
            protocol.write(b"\r\n".join(lines) + b"\r\nDATA\r\n")
        except BaseException:
            pipeline.close()
            raise
        return pipeline


class _Sequential:
    """A transaction command by command: aiosmtplib's own mail(), rcpt() and data()."""

    def __init__(self, smtp: aiosmtplib.SMTP, mail_from: str):
        self.smtp, self.mail_from = smtp, mail_from

    async def mail(self) -> None:
        await self.smtp.mail(self.mail_from)

    async def rcpt(self, rcpt: str) -> None:
        await self.smtp.rcpt(rcpt)

    async def data(self, payload: bytes) -> SMTPResponse:
        return await self.smtp.data(payload)

    async def abandon(self) -> None:
        """Nothing is in flight."""


class _Pipeline:
    """A pipelined transaction: MAIL, RCPTs and DATA are on the wire; each reply is read in turn
    and checked as aiosmtplib's SMTP.execute_command, mail(), rcpt() and data() check it (a 421
    closes the client, a lost connection or a timeout closes it and raises), so the caller meets
    the same exceptions at the same steps as command by command. The content is sent only after a
    354 to DATA, and only by data()."""

    def __init__(self, smtp: SMTP, protocol: _PipeliningProtocol, mail_from: str, expected: int):
        self.smtp, self.protocol, self.mail_from = smtp, protocol, mail_from
        self.unread = expected  # replies due: MAIL, each RCPT, DATA
        self.open = True

    def close(self) -> None:
        """End the exchange; a reply left unread makes the connection unusable, so it is closed."""
        if self.open:
            self.open = False
            if not self.protocol.end_pipeline():
                self.smtp.close()

    async def _reply(self, closes_on_421: bool = True) -> SMTPResponse:
        if self.smtp.protocol is None:
            raise aiosmtplib.SMTPServerDisconnected("Server not connected")
        self.unread -= 1
        try:
            response = await self.protocol.read_pipelined(self.smtp.timeout)
        except (aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPTimeoutError):
            self.smtp.close()
            raise
        if closes_on_421 and response.code == aiosmtplib.SMTPStatus.domain_unavailable:
            self.smtp.close()
        return response

    async def mail(self) -> None:
        response = await self._reply()
        if response.code != aiosmtplib.SMTPStatus.completed:
            raise aiosmtplib.SMTPSenderRefused(response.code, response.message, self.mail_from)

    async def rcpt(self, rcpt: str) -> None:
        response = await self._reply()
        if response.code not in (aiosmtplib.SMTPStatus.completed, aiosmtplib.SMTPStatus.will_forward):
            raise aiosmtplib.SMTPRecipientRefused(response.code, response.message, rcpt)

    async def data(self, payload: bytes) -> SMTPResponse:
        """The reply to DATA, then (after a 354) the content as execute_data_command sends it and its reply."""
        try:
            if self.smtp.protocol is None:
                raise aiosmtplib.SMTPServerDisconnected("Connection lost")
            start = await self._reply(closes_on_421=False)  # data() leaves a 421 to DATA to the caller
            if start.code != aiosmtplib.SMTPStatus.start_input:
                raise aiosmtplib.SMTPDataError(start.code, start.message)
            content = _content(payload)
            self.protocol.write(content)
            self.unread += 1
            response = await self._reply(closes_on_421=False)
            if response.code != aiosmtplib.SMTPStatus.completed:
                raise aiosmtplib.SMTPDataError(response.code, response.message)
            return response
        except (aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPTimeoutError):
            self.smtp.close()
            raise
        finally:
            self.close()

    async def abandon(self) -> None:
        """The transaction stops before its content (MAIL or every RCPT refused): the replies still
        due are read, so the connection can be RSET and reused. A DATA the server accepted anyway
        (RFC 2920 says it answers 503 or 554 when no RCPT succeeded) closes the connection: no
        content is ever sent for a refused transaction."""
        try:
            while self.open and self.unread and self.smtp.protocol is not None:
                last = self.unread == 1
                response = await self._reply(closes_on_421=not last)
                if last and response.code == aiosmtplib.SMTPStatus.start_input:
                    self.smtp.close()
        except (aiosmtplib.SMTPException, OSError):
            self.smtp.close()
        finally:
            self.close()


class RelayConnections:
    """One slot's SMTP connections, one per relay, reused across messages."""

    def __init__(self, timeout: float, tls_context: ssl.SSLContext | None, metrics: SenderMetrics | None,
                 pipelining: bool = True):
        self.timeout = timeout
        self.tls_context = tls_context
        self.metrics = metrics
        self.pipelining = pipelining  # pipeline each transaction where the relay offers it (RFC 2920)
        self.conns: dict[Relay, SMTP] = {}
        # EHLO name: the host name, without a (possibly slow) DNS lookup for the FQDN
        self.local_hostname = socket.gethostname() or "localhost"

    async def open(self, relay: Relay) -> SMTP:
        kwargs: dict[str, Any] = {}
        if self.tls_context is not None:
            kwargs["tls_context"] = self.tls_context
        smtp = SMTP(
            hostname=relay.host,
            port=relay.port,
            use_tls=relay.security == "tls",
            start_tls=relay.security == "starttls",
            timeout=self.timeout,
            local_hostname=self.local_hostname,
            **kwargs,
        )
        await smtp.connect()
        if self.metrics:
            self.metrics.smtp_connections.inc()
        if relay.username:
            await smtp.login(relay.username, relay.password or "")
        self.conns[relay] = smtp
        return smtp

    async def get(self, relay: Relay) -> tuple[SMTP, bool]:
        """A connected SMTP client for the relay and whether it was reused."""
        smtp = self.conns.get(relay)
        if smtp is not None and smtp.is_connected:
            return smtp, True
        self.conns.pop(relay, None)
        return await self.open(relay), False

    def discard(self, relay: Relay) -> None:
        smtp = self.conns.pop(relay, None)
        if smtp is not None:
            with contextlib.suppress(Exception):
                smtp.close()

    async def reset(self, relay: Relay) -> None:
        """After a refused transaction: RSET, or drop the connection if that fails."""
        smtp = self.conns.get(relay)
        if smtp is None:
            return
        try:
            await smtp.rset()
        except Exception:  # noqa: BLE001 - any failure means the connection is not reusable
            self.discard(relay)

    async def close_all(self) -> None:
        for relay, smtp in list(self.conns.items()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(smtp.quit(), timeout=1)
            self.discard(relay)


class Attempt:
    """Where one delivery got to, so an abandoned attempt can be reported correctly."""

    def __init__(self) -> None:
        self.stage = "connect"  # connect -> envelope -> data


def _transactions(row: dict[str, Any], signer: Signer | None) -> list[tuple[str, list[str], bytes]]:
    """The SMTP transactions of a claimed row: (MAIL FROM, RCPT list, message bytes).

    With per-recipient return paths (VERP) or per-recipient List-Unsubscribe (bulk mail), one
    transaction per recipient, as Postfix's VERP does: each recipient gets only its own return path
    and unsubscribe link, so a report can speak only for its own recipient (issue 21, item 2).
    Otherwise one transaction for all. Each message is DKIM-signed when its From domain has a key."""
    rcpts = envelope_recipients(row)
    paths = row.get("return_paths")
    unsubscribe = row.get("list_unsubscribe")

    def payload(list_unsubscribe: str | None) -> bytes:
        data = message_bytes(row, list_unsubscribe)
        return signer.sign(data, row) if signer is not None else data

    if not paths and not unsubscribe:
        return [(row.get("return_path") or row["from_address"], rcpts, payload(None))]
    return [
        (paths[i] if paths else row["from_address"], [rcpt], payload(unsubscribe[i] if unsubscribe else None))
        for i, rcpt in enumerate(rcpts)
    ]


async def deliver(
    conns: RelayConnections, relay: Relay, row: dict[str, Any], attempt: Attempt, signer: Signer | None = None
) -> Outcome:
    """One message: its SMTP transactions (one, or one per recipient with VERP); never raises
    (except cancellation): the outcome says what happened."""
    out = Outcome(row["id"], row["claim_token"], "sent")
    if row["text_body"] is None and row["html_body"] is None:
        # a token email whose token is gone (tokens.retention): nothing to send, ever
        out.outcome, out.error = "local", "no body to send (a token email whose token was purged)"
        return out
    try:
        transactions = _transactions(row, signer)
    except Exception as exc:  # noqa: BLE001 - a message that cannot be built never will be
        out.outcome, out.error = "local", f"cannot build the message: {type(exc).__name__}"
        return out
    if relay.cleartext_login:
        # never send the password where anyone on the path can read it
        out.outcome = "connect"
        out.error = ("refused to log in over cleartext: the relay's security is none "
                     "(use starttls or tls; a relay on this machine may allow it: --allow-cleartext-login)")
        return out
    if len(transactions) == 1:
        mail_from, rcpts, payload = transactions[0]
        return await _deliver_one(conns, relay, out, attempt, mail_from, rcpts, payload)
    return await _deliver_each(conns, relay, out, attempt, transactions)


async def _deliver_each(
    conns: RelayConnections, relay: Relay, out: Outcome, attempt: Attempt,
    transactions: list[tuple[str, list[str], bytes]],
) -> Outcome:
    """One transaction per recipient. A recipient refused at RCPT or after DATA is a refused
    recipient (each transaction has one: its reply speaks for it alone), reported to
    record_refused_recipients; the message is sent when any recipient took it, 'refused' when none
    did. A connection lost after some recipient took it is 'uncertain' (retried, flagged
    possibly_sent: the recipients who had it may get it twice)."""
    delivered = 0
    for mail_from, rcpts, payload in transactions:
        one = Outcome(out.id, out.claim_token, "sent")
        one = await _deliver_one(conns, relay, one, attempt, mail_from, rcpts, payload)
        if one.outcome == "sent":
            delivered += 1
            out.code, out.enhanced = one.code, one.enhanced
            out.refused.extend(one.refused)
            continue
        if one.outcome == "refused":
            out.refused.extend(one.refused)
            continue
        if one.outcome == "reply" and attempt.stage == "data" and one.code is not None:
            # refused after DATA: this transaction's only recipient refused it
            out.refused.append((rcpts[0], one.code, one.enhanced))
            continue
        # the relay, MAIL FROM or the connection failed: the message's outcome, unless some recipient has it
        if delivered:
            out.outcome = "uncertain"
            out.error = f"{one.error} (after {delivered} of {len(transactions)} recipients took it)"
            return out
        one.refused = out.refused + one.refused
        return one
    if not delivered:
        out.outcome = "refused"
        codes = out.refused
        out.error = (f"{codes[0][1]} refused" if len(codes) == 1 else
                     f"{len(codes)} of {len(transactions)} recipients refused: "
                     + "; ".join(str(c[1]) + (f" {c[2]}" if c[2] else "") for c in codes))
    elif out.refused:
        out.error = f"{len(out.refused)} of {len(transactions)} recipients refused: " + "; ".join(
            str(c[1]) + (f" {c[2]}" if c[2] else "") for c in out.refused)
    return out


async def _deliver_one(
    conns: RelayConnections, relay: Relay, out: Outcome, attempt: Attempt, mail_from: str, rcpts: list[str],
    payload: bytes,
) -> Outcome:
    """One SMTP transaction; never raises (except cancellation)."""
    for try_number in (1, 2):
        attempt.stage = "connect"
        try:
            smtp, reused = await conns.get(relay)
        except aiosmtplib.SMTPResponseException as exc:
            # greeting, EHLO, STARTTLS or AUTH refused: the relay's problem, not the message's,
            # so it is reported as a (transient) connection failure, with the reply for operators
            conns.discard(relay)
            out.outcome = "connect"
            out.code, out.enhanced, out.error = _reply(exc)
            return out
        except aiosmtplib.SMTPTimeoutError:
            conns.discard(relay)
            out.outcome, out.error = "timeout", "timed out connecting to the relay"
            return out
        except (OSError, aiosmtplib.SMTPException) as exc:
            conns.discard(relay)
            out.outcome, out.error = "connect", f"cannot connect to the relay: {type(exc).__name__}"
            return out
        attempt.stage = "envelope"
        txn: _Sequential | _Pipeline | None = None
        try:
            # the VERP return path claim_messages computed (sql/36_outbound_bounces.sql), else the From address
            txn = await smtp.transaction(mail_from, rcpts, conns.pipelining)
            await txn.mail()
            refused: list[aiosmtplib.SMTPRecipientRefused] = []
            for rcpt in rcpts:
                try:
                    await txn.rcpt(rcpt)
                except aiosmtplib.SMTPRecipientRefused as exc:
                    refused.append(exc)
            out.refused = [(e.recipient, e.code, _enhanced(e.message)) for e in refused]
            if len(refused) == len(rcpts):
                # every recipient refused: finalize_messages decides which refusal governs (retry or
                # fail) from the refusals the sender records first (mailroom.record_refused_recipients)
                out.outcome = "refused"
                out.error = _reply(refused[0])[2] if len(refused) == 1 else (
                    f"{len(refused)} of {len(rcpts)} recipients refused: "
                    + "; ".join(f"{e.code} {e.message}" for e in refused))
                await txn.abandon()
                await conns.reset(relay)
                return out
            attempt.stage = "data"
            response = await txn.data(payload)
            out.code, out.enhanced = response.code, _enhanced(response.message)
            if refused:
                out.error = f"{len(refused)} of {len(rcpts)} recipients refused: " + "; ".join(
                    f"{e.code} {e.message}" for e in refused
                )
            return out
        except aiosmtplib.SMTPResponseException as exc:
            out.outcome = "reply"
            out.code, out.enhanced, out.error = _reply(exc)
            if txn is not None:
                await txn.abandon()
            await conns.reset(relay)
            return out
        except (aiosmtplib.SMTPTimeoutError, TimeoutError):
            conns.discard(relay)
            out.outcome = "uncertain" if attempt.stage == "data" else "timeout"
            out.error = f"timed out during {attempt.stage}"
            return out
        except (aiosmtplib.SMTPServerDisconnected, OSError) as exc:
            conns.discard(relay)
            if reused and attempt.stage == "envelope" and try_number == 1:
                continue  # an idle reused connection went away before anything was sent
            out.outcome = "uncertain" if attempt.stage == "data" else "dropped"
            out.error = f"connection lost during {attempt.stage}: {type(exc).__name__}"
            return out
        except aiosmtplib.SMTPException as exc:
            conns.discard(relay)
            out.outcome = "uncertain" if attempt.stage == "data" else "dropped"
            out.error = f"SMTP client error during {attempt.stage}: {type(exc).__name__}"
            return out
    raise AssertionError("unreachable")  # pragma: no cover
