"""Inbound SMTP for expiring inboxes: the aiosmtpd server behind `mailroom inbox serve`.

The server is a thin aiosmtpd front over the SQL API:
- RCPT TO asks `mailroom.check_recipient` (unknown, deleted, expired → 550 5.1.1; over the plan's
  size for a declared SIZE → 552 5.3.4; full → 552 5.2.2; more than --max-recipients → 452 4.5.3).
- DATA is read by InboundSMTP.smtp_DATA. Every _SIZE_PROBE_BYTES past what is known to fit, it asks
  check_recipient with the running size whether any accepted recipient's plan still takes it; when
  none does, the buffer is dropped, the rest is read and thrown away and the reply is 552 5.3.4
  (the connection stays usable). So a message is never held past the largest limit of its
  recipients by more than one probe step; deliver_message still checks the exact size.
- DATA then parses the message (mailroom.mime) and calls `mailroom.deliver_message` for every
  accepted recipient in ONE autocommit statement (one row each). 250 is answered only after it
  returned (committed), so an accepted message is never lost; if any recipient fails, nothing is
  kept and the reply says why (4xx when a retry can succeed, 5xx otherwise), so nothing is doubled.
- Bounces (docs/bounces.md): RCPT asks `mailroom.check_bounce_recipient`, which answers
  check_recipient's verdict for a mailbox and 'bounce' for a valid VERP return path (a forged or
  unknown one is 'unknown': 550 5.1.1, counted like any unknown recipient). A transaction is either
  for return paths or for mailboxes (the other kind gets 452 4.5.3: send it in another one). At
  DATA, mailroom.inboxes.bounce reads the report and `mailroom.record_bounce` decides, in ONE
  autocommit statement; 250 follows it. A bounce nothing could be read from is still 250 (SQL
  notes it as unparsed), so a relay does not retry it for days. The bounce mail is not stored.
- Abuse limits: --max-bad-recipients refused recipients per session, then 421 and hang up;
  --max-sessions connections at once, more get 421 before any database work; --idle-timeout.
- Logs carry counts, sizes and ids, never addresses or subjects.
"""

from __future__ import annotations

import asyncio
import re
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from aiosmtpd.smtp import SMTP, Envelope, Session
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from mailroom.core.errors import UserError, describe_db_error
from mailroom.core.log import get_logger
from mailroom.db.connect import connect_async, connection_kwargs
from mailroom.inboxes.bounce import parse_bounce
from mailroom.inboxes.mime import ParsedMessage, clean_text, parse_message

log = get_logger("inbox")

# Replies. Addresses are never echoed back or logged.
REPLY_UNAVAILABLE = "550 5.1.1 Mailbox unavailable (unknown, deleted or expired)"
REPLY_TOO_BIG = "552 5.3.4 Message too big for this mailbox"
REPLY_FULL = "552 5.2.2 Mailbox full"
REPLY_TOO_MANY = "452 4.5.3 Too many recipients"
REPLY_TEMPFAIL = "451 4.3.0 Temporary failure, please try again later"
REPLY_RETRY_RCPT = "451 4.2.0 A recipient became unavailable; please try again"
REPLY_EMPTY = "554 5.6.0 Message is empty"
REPLY_TOO_MANY_BAD = "421 4.7.0 Too many invalid recipients, closing connection"
REPLY_BUSY = "421 4.3.2 Too many connections, try again later"
REPLY_LINE_TOO_LONG = "500 Line too long (see RFC5321 4.5.3.1.6)"
REPLY_SEPARATE = "452 4.5.3 Bounces and mail for inboxes go in separate transactions"

_VERDICT_REPLY = {
    "unknown": REPLY_UNAVAILABLE,
    "deleted": REPLY_UNAVAILABLE,
    "expired": REPLY_UNAVAILABLE,
    "too_large": REPLY_TOO_BIG,
    "full": REPLY_FULL,
}

# The error deliver_message raises for each check_recipient verdict (sql/21_delivery.sql).
_SQLSTATE_VERDICT = {"MR203": "unknown", "MR205": "expired", "MR206": "deleted", "MR207": "too_large", "MR208": "full"}

# SQLSTATE raised by deliver_message → (reply, detectable again at RCPT on a retry): the reply
# of its verdict; every verdict but too_large (the size is only known after DATA) shows at RCPT.
_SQLSTATE_REPLY = {
    **{code: (_VERDICT_REPLY[verdict], verdict != "too_large") for code, verdict in _SQLSTATE_VERDICT.items()},
    "MR211": (REPLY_EMPTY, False),
}


def _declared_size(mail_options: list[str]) -> int | None:
    for option in mail_options:
        key, _, value = option.partition("=")
        if key.upper() == "SIZE" and value.isdigit():
            return int(value)
    return None


# Whether any of the accepted recipients (their normalized addresses) takes a message of this size:
# check_recipient answers 'too_large' exactly when a size is over the mailbox's plan. Another verdict
# (a mailbox that expired meanwhile) is left to deliver_message. The first one that fits is returned,
# so the caller asks it first next time.
_RCPT_QUERY = "SELECT verdict, address FROM mailroom.check_bounce_recipient(%s, %s)"

# One statement for every return path of the transaction (normally one); 250 follows its commit.
_BOUNCE_QUERY = (
    "SELECT b.message_id, b.outcome, b.reports, b.suppressed FROM unnest(%s::text[]) WITH ORDINALITY AS r (address, n)"
    " CROSS JOIN LATERAL mailroom.record_bounce(r.address, %s) AS b ORDER BY r.n"
)

# record_bounce's error for a return path that is no longer valid (its message was purged meanwhile)
_BOUNCE_GONE = "MR360"

_FITS_QUERY = (
    "SELECT c.address FROM unnest(%s::text[]) AS a (address)"
    " CROSS JOIN LATERAL mailroom.check_recipient(a.address, %s) AS c"
    " WHERE c.verdict <> 'too_large' LIMIT 1"
)

# DATA asks _FITS_QUERY each time the message grows this much past the largest size known to fit:
# a message never costs a query below it (or below a SIZE= every recipient accepted at RCPT), and
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


@dataclass
class _Failure:
    reply: str
    retry_fixes: bool  # a retry of the whole transaction would weed this recipient out at RCPT


class _StaleConnection(Exception):
    """The pooled connection failed its liveness check: nothing was sent, a retry is safe."""


@dataclass
class _DeliveryParams:
    raw: bytes
    parsed: ParsedMessage
    mail_from: str
    recipients: list[str]


_INLINE_PARSE_BYTES = 64 * 1024

# `<local@domain>` with a dot-atom local part and a plain domain (InboundSMTP._getaddr's fast path).
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_PLAIN_ANGLE_ADDR = re.compile(rf"<({_ATOM}(?:\.{_ATOM})*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)>")


def _has_pending_input(conn: psycopg.AsyncConnection) -> bool:
    """Whether an idle pooled connection's socket is readable (or unusable): the sign that the server
    sent it something, i.e. ended it (pg_terminate_backend, shutdown, crash). No round trip."""
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


async def _ensure_alive(conn: psycopg.AsyncConnection) -> None:
    """Before anything is sent on a pooled connection: raise _StaleConnection if the server ended
    it. An idle connection has nothing to read unless the server ended it (a FATAL message, then
    EOF): only then pay a round trip to find out."""
    if _has_pending_input(conn):
        try:
            await conn.execute("")  # liveness check: fails only before anything is sent
        except psycopg.OperationalError as exc:
            raise _StaleConnection(describe_db_error(exc)) from None


class InboxHandler:
    """aiosmtpd handler: RCPT checks and DATA delivery through the SQL API."""

    def __init__(self, pool: AsyncConnectionPool, *, max_recipients: int = 100, group_size: int = 32) -> None:
        self.pool = pool
        self.max_recipients = max_recipients
        self._group = _GroupCommit(self, group_size)
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()

    async def handle_RCPT(  # noqa: N802 - aiosmtpd hook name
        self, server: SMTP, session: _Session, envelope: _Envelope, address: str, rcpt_options: list[str]
    ) -> str:
        if envelope.accepted_count >= self.max_recipients:
            return REPLY_TOO_MANY
        address = clean_text(address) or ""
        try:
            verdict, normalized = await self._fetch_one(
                _RCPT_QUERY, (address, _declared_size(envelope.mail_options))
            )
        except psycopg.Error as exc:
            log.error("recipient check failed: %s", describe_db_error(exc))
            return REPLY_TEMPFAIL
        except Exception as exc:  # noqa: BLE001 - a 4xx, never a traceback to the client
            log.error("recipient check failed unexpectedly: %s", type(exc).__name__)
            return REPLY_TEMPFAIL
        if verdict not in ("ok", "bounce"):
            if verdict == "unknown":
                session.refused_recipients += 1
            log.info("refused a recipient at RCPT: %s", verdict)
            return _VERDICT_REPLY.get(verdict, REPLY_UNAVAILABLE)
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
        self.in_flight += 1
        self.idle.clear()
        try:
            return await self._deliver(envelope)
        except Exception as exc:  # noqa: BLE001 - never a 250 without a stored row, never a traceback
            log.error("delivery failed unexpectedly: %s", type(exc).__name__)
            return REPLY_TEMPFAIL
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.idle.set()

    async def size_fits(self, envelope: _Envelope, size: int) -> bool:
        """Whether some accepted recipient's plan takes a message of `size` octets (psycopg errors raise)."""
        row = await self._fetch_one(_FITS_QUERY, (envelope.accepted, size))
        if row is None:
            return False
        if row[0] in envelope.accepted:  # ask the one that fits first next time
            envelope.accepted.remove(row[0])
            envelope.accepted.insert(0, row[0])
        return True

    async def _fetch_one(self, query: str, params: tuple) -> Any:
        attempts = self.pool.max_size + 1  # a read: retrying on a broken connection is always safe
        for attempt in range(1, attempts + 1):
            try:
                async with self.pool.connection() as conn:
                    cur = await conn.execute(query, params)
                    return await cur.fetchone()
            except psycopg.OperationalError:
                if attempt == attempts:
                    raise
        return None  # pragma: no cover

    async def _deliver(self, envelope: Envelope) -> str:
        raw = envelope.original_content
        if raw is None:
            raw = envelope.content if isinstance(envelope.content, bytes) else b""
        raw = bytes(raw)
        if isinstance(envelope, _Envelope) and envelope.bounces:
            return await self._record_bounce(raw, list(envelope.bounces))
        if not raw.strip():  # no header, no body: nothing to store
            return REPLY_EMPTY
        if len(raw) <= _INLINE_PARSE_BYTES:
            parsed = parse_message(raw)
        else:  # keep the event loop responsive while a big message is parsed
            parsed = await asyncio.to_thread(parse_message, raw)
        mail_from = envelope.mail_from or ""
        if mail_from == "<>":
            mail_from = ""
        params = _DeliveryParams(raw, parsed, clean_text(mail_from) or "", list(envelope.rcpt_tos))
        return await self._group.submit(params)

    async def _deliver_alone(self, params: _DeliveryParams) -> str:
        """One message in its own statement (and commit): its reply."""
        # Every pooled connection may be stale after a server restart: try up to pool size + 1.
        for attempt in range(1, self.pool.max_size + 2):
            try:
                return await self._deliver_once(params)
            except _StaleConnection as exc:
                # The pooled connection was dead before anything was sent (server restart,
                # pg_terminate_backend): nothing was stored, one retry on a fresh one is safe.
                log.warning("delivery attempt %d: stale database connection: %s", attempt, exc)
            except psycopg.OperationalError as exc:
                # Lost during the delivering statement: the outcome is unknown. 4xx makes the
                # client retry (a possible duplicate beats a lost message).
                log.error("connection lost while delivering: %s", describe_db_error(exc))
                return REPLY_TEMPFAIL
            except psycopg.Error as exc:
                log.error("delivery failed: %s", describe_db_error(exc))
                return REPLY_TEMPFAIL
        return REPLY_TEMPFAIL

    async def _record_bounce(self, raw: bytes, return_paths: list[str]) -> str:
        """Hand the parsed report to SQL in one statement; 250 only after it committed."""
        if len(raw) <= _INLINE_PARSE_BYTES:
            reports = parse_bounce(raw)
        else:
            reports = await asyncio.to_thread(parse_bounce, raw)
        for attempt in range(1, self.pool.max_size + 2):
            try:
                async with self.pool.connection() as conn:
                    await _ensure_alive(conn)
                    cur = await conn.execute(_BOUNCE_QUERY, (return_paths, Jsonb(reports)))
                    rows = await cur.fetchall()
            except _StaleConnection as exc:
                log.warning("bounce attempt %d: stale database connection: %s", attempt, exc)
                continue
            except psycopg.OperationalError as exc:
                log.error("connection lost while recording a bounce: %s", describe_db_error(exc))
                return REPLY_TEMPFAIL
            except psycopg.Error as exc:
                if exc.sqlstate == _BOUNCE_GONE:
                    log.info("refused a bounce at DATA: its return path is no longer valid")
                    return REPLY_UNAVAILABLE
                log.error("recording a bounce failed: %s", describe_db_error(exc))
                return REPLY_TEMPFAIL
            for message_id, outcome, count, suppressed in rows:
                log.info("bounce for outbound message %d: %s (%d report(s), %d suppressed)",
                         message_id, outcome, count, suppressed)
            return f"250 2.0.0 OK: bounce recorded for {len(rows)} message(s)"
        return REPLY_TEMPFAIL

    async def _deliver_once(self, p: _DeliveryParams) -> str:
        async with self.pool.connection() as conn:
            await _ensure_alive(conn)
            # Fast path: every recipient in ONE autocommit statement, so it either commits for all
            # of them or for none, in one round trip. 250 is sent only after it returned.
            try:
                cur = await conn.execute(
                    "SELECT mailroom.deliver_message(r.address, %s, %s, %s, %s, %s, %s, %s)"
                    " FROM unnest(%s::text[]) WITH ORDINALITY AS r (address, n) ORDER BY r.n",
                    (p.raw, p.mail_from, p.parsed.subject, p.parsed.from_header, p.parsed.text_body,
                     p.parsed.html_body, Jsonb(p.parsed.attachments), p.recipients),
                )
                ids = [row[0] for row in await cur.fetchall()]
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                if (exc.sqlstate or "") not in _SQLSTATE_REPLY:
                    raise
                if len(p.recipients) == 1:
                    log.info("refused a message at DATA: %s", exc.sqlstate)
                    return _SQLSTATE_REPLY[exc.sqlstate][0]
                return await self._diagnose(conn, p)
        log.info(
            "stored %d message(s) of %d bytes, %d attachment(s), ids %s",
            len(ids), len(p.raw), len(p.parsed.attachments), ",".join(map(str, ids)),
        )
        return f"250 2.0.0 OK: stored for {len(ids)} recipient(s)"

    async def _deliver_group(self, group: list[_DeliveryParams]) -> list[str] | None:
        """Several sessions' messages in ONE autocommit statement (one commit, one WAL flush, one
        turn of each inbox's row lock): their replies, or None when the statement failed with
        nothing kept (a refused recipient, a stale connection): then each goes alone."""
        flat = [(i, rcpt) for i, p in enumerate(group) for rcpt in p.recipients]
        async with self.pool.connection() as conn:
            try:
                await _ensure_alive(conn)
            except _StaleConnection as exc:
                log.warning("group delivery: stale database connection: %s", exc)
                return None  # nothing was sent
            try:
                cur = await conn.execute(
                    "SELECT r.i, mailroom.deliver_message(r.address, m.raw, m.mail_from, m.subject, m.from_header,"
                    " m.text_body, m.html_body, m.attachments)"
                    " FROM unnest(%s::int[], %s::text[]) WITH ORDINALITY AS r (i, address, n)"
                    " JOIN unnest(%s::bytea[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::jsonb[])"
                    " WITH ORDINALITY AS m (raw, mail_from, subject, from_header, text_body, html_body, attachments, i)"
                    " ON m.i = r.i + 1 ORDER BY r.n",
                    (
                        [i for i, _ in flat], [rcpt for _, rcpt in flat],
                        [p.raw for p in group], [p.mail_from for p in group], [p.parsed.subject for p in group],
                        [p.parsed.from_header for p in group], [p.parsed.text_body for p in group],
                        [p.parsed.html_body for p in group], [Jsonb(p.parsed.attachments) for p in group],
                    ),
                )
                rows = await cur.fetchall()
            except psycopg.OperationalError:
                raise  # the outcome is unknown: the caller answers 4xx for every one of them
            except psycopg.Error as exc:
                if (exc.sqlstate or "") not in _SQLSTATE_REPLY:
                    raise
                log.info("group commit of %d messages refused (%s): delivering them one by one",
                         len(group), exc.sqlstate)
                return None  # one of them is refused and nothing was kept: each goes alone
        log.info("group commit: %d messages in one statement", len(group))
        ids: list[list[int]] = [[] for _ in group]
        for i, message_id in rows:
            ids[i].append(message_id)
        replies = []
        for p, stored in zip(group, ids, strict=True):
            log.info(
                "stored %d message(s) of %d bytes, %d attachment(s), ids %s",
                len(stored), len(p.raw), len(p.parsed.attachments), ",".join(map(str, stored)),
            )
            replies.append(f"250 2.0.0 OK: stored for {len(stored)} recipient(s)")
        return replies

    async def _diagnose(self, conn: psycopg.AsyncConnection, p: _DeliveryParams) -> str:
        """Several recipients and the fast path failed (nothing kept): find out who, keep nothing."""
        failures: list[_Failure] = []
        ok = 0
        async with conn.transaction():
            for rcpt in p.recipients:
                try:
                    async with conn.transaction():  # a savepoint per recipient
                        await conn.execute(
                            "SELECT mailroom.deliver_message(%s, %s, %s)", (rcpt, p.raw, p.mail_from)
                        )
                        ok += 1
                except psycopg.OperationalError:
                    raise
                except psycopg.Error as exc:
                    reply, retry_fixes = _SQLSTATE_REPLY.get(exc.sqlstate or "", (None, False))
                    if reply is None:
                        raise
                    failures.append(_Failure(reply, retry_fixes))
            raise psycopg.Rollback  # all or nothing: keep no recipient's copy
        log.info("refused a message at DATA for %d of %d recipient(s)", len(failures), len(p.recipients))
        if not failures:
            return REPLY_RETRY_RCPT  # a concurrent change made them all deliverable: retry
        if ok and all(f.retry_fixes for f in failures):
            # Others would have succeeded: ask for a retry; RCPT will refuse the bad ones then.
            return REPLY_RETRY_RCPT
        return failures[0].reply


class _GroupCommit:
    """Group commit across sessions: messages whose DATA ended while other deliveries were running
    are stored together in one statement (one COMMIT), at most `size` at a time, with as many
    statements in flight as the pool has connections. Each message's reply is sent only after the
    statement that stored it returned: a 250 still means committed. A lone message takes the
    single-message path; a group that fails with nothing kept is retried message by message."""

    def __init__(self, handler: InboxHandler, size: int) -> None:
        self.handler = handler
        self.size = max(1, size)
        self.pending: list[tuple[_DeliveryParams, asyncio.Future[str]]] = []
        self.flushers = 0

    async def submit(self, params: _DeliveryParams) -> str:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.pending.append((params, future))
        if self.flushers < self.handler.pool.max_size:
            self.flushers += 1
            asyncio.ensure_future(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self.pending:
                batch, self.pending = self.pending[: self.size], self.pending[self.size:]
                await self._run(batch)
        finally:
            self.flushers -= 1

    async def _run(self, batch: list[tuple[_DeliveryParams, asyncio.Future[str]]]) -> None:
        replies: list[str] | None = None
        try:
            if len(batch) > 1:
                try:
                    replies = await self.handler._deliver_group([p for p, _ in batch])
                except psycopg.OperationalError as exc:
                    log.error("connection lost while delivering %d messages: %s", len(batch), describe_db_error(exc))
                    replies = [REPLY_TEMPFAIL] * len(batch)
            if replies is None:
                replies = [await self.handler._deliver_alone(p) for p, _ in batch]
        except Exception as exc:  # noqa: BLE001 - never a 250 without a stored row
            log.error("delivery failed unexpectedly: %s", type(exc).__name__)
            replies = [REPLY_TEMPFAIL] * len(batch)
        for (_, future), reply in zip(batch, replies, strict=True):
            if not future.done():
                future.set_result(reply)


class _SessionGate:
    """Counts open SMTP sessions for --max-sessions (one event loop: no lock needed)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self._refused = 0
        self._logged_at = float("-inf")

    def enter(self) -> bool:
        if self.open < self.limit:
            self.open += 1
            return True
        self._refused += 1
        now = time.monotonic()
        if now - self._logged_at >= 10:  # a flood of connections is one line per 10 s, not one each
            log.warning("refused %d connection(s): %d sessions open (--max-sessions)", self._refused, self.open)
            self._refused = 0
            self._logged_at = now
        return False

    def leave(self) -> None:
        self.open -= 1


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
        """aiosmtpd's address parsing (email's header parser, ~40 us a call, twice a message) with a
        fast path for the common `<dot-atom@domain>`: the same result, checked against it in the tests."""
        match = _PLAIN_ANGLE_ADDR.match(arg)
        if match is not None:
            rest = arg[match.end():].lstrip(" \t")
            local = match.group(1).rpartition("@")[0]
            if not rest.startswith("(") and not (self.local_part_limit and len(local) > self.local_part_limit):
                return match.group(1), rest
        return super()._getaddr(arg)

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
                refusal, too_big_for = REPLY_TOO_BIG, "the server's SIZE"
            elif refusal is None and not envelope.bounces and received > fits + _SIZE_PROBE_BYTES:
                try:
                    if await handler.size_fits(envelope, received):
                        fits = received
                    else:
                        refusal, too_big_for = REPLY_TOO_BIG, "its recipients' size limit"
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
            if refusal == REPLY_TOO_BIG:
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


class InboundServer:
    """The listening server and its connection pool; run() until stop() (or SIGTERM in the CLI)."""

    def __init__(
        self,
        url: str,
        *,
        host: str = "127.0.0.1",
        port: int = 2525,
        max_recipients: int = 100,
        max_bad_recipients: int = 10,
        max_sessions: int = 100,
        idle_timeout: float = 300.0,
        max_line_length: int = 1000,
        pool_size: int = 4,
        data_size_limit: int | None = None,
        hostname: str | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.url = url
        self.reuse_port = reuse_port  # several worker processes listen on one port (--workers)
        self.host = host
        self.port = port
        self.max_recipients = max_recipients
        self.max_bad_recipients = max_bad_recipients
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.max_line_length = max_line_length
        self.pool_size = pool_size
        self.data_size_limit = data_size_limit
        self.hostname = hostname
        self.bound_port: int | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def stop(self) -> None:
        """Thread-safe: ask run() to finish."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def run(self, ready: Callable[[int], None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        # One direct connection first: fails fast with the real reason (the pool would only time out).
        conn = await connect_async(self.url, application_name="mailroom-inbox")
        try:
            cur = await conn.execute("SELECT mailroom.max_inbound_message_bytes(), mailroom.setting('inbox.domain')")
            max_bytes, domain = await cur.fetchone()
        except psycopg.Error as exc:
            raise UserError(f"cannot read inbox settings (is the database migrated?): {describe_db_error(exc)}") from None
        finally:
            await conn.close()
        pool = AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=self.pool_size,
            kwargs=connection_kwargs(application_name="mailroom-inbox"),
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=10)
        except Exception as exc:  # noqa: BLE001 - PoolTimeout hides the cause
            await pool.close()
            raise UserError(f"cannot connect to the database: {describe_db_error(exc)}") from None
        size_limit = self.data_size_limit if self.data_size_limit is not None else int(max_bytes)
        handler = InboxHandler(pool, max_recipients=self.max_recipients)
        smtp_class = _smtp_class(self.max_line_length)
        hostname = self.hostname or domain
        gate = _SessionGate(self.max_sessions)

        def factory() -> asyncio.Protocol:
            if not gate.enter():
                return _Busy()
            try:
                return smtp_class(
                    handler,
                    gate=gate,
                    max_bad_recipients=self.max_bad_recipients,
                    data_size_limit=size_limit or None,
                    enable_SMTPUTF8=True,
                    decode_data=False,
                    hostname=hostname,
                    ident="mailroom inbound",
                    timeout=self.idle_timeout,
                    loop=self._loop,
                )
            except BaseException:
                gate.leave()
                raise

        try:
            server = await self._loop.create_server(
                factory, host=self.host, port=self.port, reuse_port=self.reuse_port or None
            )
        except OSError as exc:
            await pool.close()
            raise UserError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        self.bound_port = server.sockets[0].getsockname()[1]
        log.info(
            "listening on %s:%d (SIZE %d, max %d recipients, %d refused recipients a session, %d sessions,"
            " idle timeout %gs)",
            self.host, self.bound_port, size_limit, self.max_recipients, self.max_bad_recipients,
            self.max_sessions, self.idle_timeout,
        )
        if ready is not None:
            ready(self.bound_port)
        try:
            await self._stop.wait()
        finally:
            server.close()
            # Let messages in DATA finish (their 250 follows COMMIT), then close the pool.
            try:
                await asyncio.wait_for(handler.idle.wait(), timeout=10)
            except TimeoutError:
                log.warning("stopping with %d delivery(ies) still running", handler.in_flight)
            await pool.close()
            log.info("stopped")
