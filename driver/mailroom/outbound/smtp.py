"""SMTP to the relays: a slot's reused connections (one per relay) and one transaction on them.

`deliver()` never decides what a failure means: it reports the raw outcome (kind, reply code,
enhanced status code, reply text) and mailroom.finalize_messages classifies it in SQL. The message
itself is built by mailroom.outbound.message.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
from dataclasses import dataclass, field
from typing import Any

import aiosmtplib

from mailroom.outbound.dkim import Signer
from mailroom.outbound.message import build_message, envelope_recipients
from mailroom.outbound.metrics import SenderMetrics

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


class RelayConnections:
    """One slot's SMTP connections, one per relay, reused across messages."""

    def __init__(self, timeout: float, tls_context: ssl.SSLContext | None, metrics: SenderMetrics | None):
        self.timeout = timeout
        self.tls_context = tls_context
        self.metrics = metrics
        self.conns: dict[Relay, aiosmtplib.SMTP] = {}
        # EHLO name: the host name, without a (possibly slow) DNS lookup for the FQDN
        self.local_hostname = socket.gethostname() or "localhost"

    async def open(self, relay: Relay) -> aiosmtplib.SMTP:
        kwargs: dict[str, Any] = {}
        if self.tls_context is not None:
            kwargs["tls_context"] = self.tls_context
        smtp = aiosmtplib.SMTP(
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

    async def get(self, relay: Relay) -> tuple[aiosmtplib.SMTP, bool]:
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
        data = build_message(row, list_unsubscribe).as_bytes()
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
        try:
            # the VERP return path claim_messages computed (sql/36_outbound_bounces.sql), else the From address
            await smtp.mail(mail_from)
            refused: list[aiosmtplib.SMTPRecipientRefused] = []
            for rcpt in rcpts:
                try:
                    await smtp.rcpt(rcpt)
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
                await conns.reset(relay)
                return out
            attempt.stage = "data"
            response = await smtp.data(payload)
            out.code, out.enhanced = response.code, _enhanced(response.message)
            if refused:
                out.error = f"{len(refused)} of {len(rcpts)} recipients refused: " + "; ".join(
                    f"{e.code} {e.message}" for e in refused
                )
            return out
        except aiosmtplib.SMTPResponseException as exc:
            out.outcome = "reply"
            out.code, out.enhanced, out.error = _reply(exc)
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
