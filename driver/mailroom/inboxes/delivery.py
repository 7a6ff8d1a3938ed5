"""Delivery for inbound SMTP: recipients, sizes, messages and bounces through the SQL API.

The protocol layer (mailroom.inboxes.smtp) asks this module and sends the reply it answers:
- a recipient: `mailroom.check_bounce_recipient` (the mailbox's check_recipient verdict, or 'bounce'
  for a valid VERP return path);
- while DATA grows: whether any accepted recipient's plan still takes the size so far;
- a message: parsed (mailroom.inboxes.mime), then `mailroom.deliver_message` for every accepted
  recipient in ONE autocommit statement (one row each), grouped with other sessions' messages when
  deliveries overlap (_GroupCommit: one COMMIT for the group). The reply is 250 only after that
  statement returned (committed), so an accepted message is never lost; if any recipient fails,
  nothing is kept and the reply says why (4xx when a retry can succeed, 5xx otherwise), so nothing
  is doubled.
- a bounce (docs/bounces.md): mailroom.inboxes.bounce reads the report and `mailroom.record_bounce`
  decides, in ONE autocommit statement; 250 follows it. A bounce nothing could be read from is
  still 250 (SQL notes it as unparsed), so a relay does not retry it for days. It is not stored.
Logs carry counts, sizes and ids, never addresses or subjects.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from mailroom.core.errors import describe_db_error
from mailroom.core.log import get_logger
from mailroom.core.outage import Outage
from mailroom.db.connect import StaleConnection, ensure_alive
from mailroom.db.contract import SqlFunction
from mailroom.inboxes import sqlapi
from mailroom.inboxes.bounce import parse_bounce
from mailroom.inboxes.mime import ParsedMessage, parse_message

log = get_logger("inbox")

# Replies of a delivery. Addresses are never echoed back or logged.
REPLY_UNAVAILABLE = "550 5.1.1 Mailbox unavailable (unknown, deleted or expired)"
REPLY_TOO_BIG = "552 5.3.4 Message too big for this mailbox"
REPLY_FULL = "552 5.2.2 Mailbox full"
REPLY_TEMPFAIL = "451 4.3.0 Temporary failure, please try again later"
REPLY_RETRY_RCPT = "451 4.2.0 A recipient became unavailable; please try again"
REPLY_EMPTY = "554 5.6.0 Message is empty"

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

# record_bounce's error for a return path that is no longer valid (its message was purged meanwhile)
_BOUNCE_GONE = "MR360"

_INLINE_PARSE_BYTES = 64 * 1024


@dataclass
class _Failure:
    reply: str
    retry_fixes: bool  # a retry of the whole transaction would weed this recipient out at RCPT


@dataclass
class DeliveryParams:
    raw: bytes
    parsed: ParsedMessage
    mail_from: str
    recipients: list[str]


class DatabaseTimeout(psycopg.OperationalError):
    """A call of the SMTP path got no answer within --db-timeout (the database is unreachable or stuck)."""


class Delivery:
    """What the SMTP layer asks the database, on a pool of autocommit connections; see the module docstring.

    Every call is bounded by `timeout` seconds (--db-timeout): a recipient check or size probe as a
    whole, a delivery while it waits for a connection (a statement already sent is waited for: its
    outcome decides the reply). Past it, DatabaseTimeout: the SMTP layer answers 451."""

    def __init__(self, pool: AsyncConnectionPool, *, group_size: int = 32, timeout: float = 5.0,
                 outage: Outage | None = None) -> None:
        self.pool = pool
        self.timeout = timeout
        self._group = _GroupCommit(self, group_size)
        self.outage = outage or Outage(log)  # the database unreachable: logged once, and once recovered

    def unreachable(self, what: str, exc: BaseException) -> None:
        """A call failed on the connection (lost, none within the timeout): the outage's one line,
        not one line per SMTP command."""
        self.outage.delay(f"{what}: {describe_db_error(exc).removeprefix('database unreachable: ')}")

    def reached(self) -> None:
        self.outage.resumed()

    async def recipient(self, address: str, size: int | None) -> tuple[str, str]:
        """check_bounce_recipient's verdict and normalized address (psycopg errors raise)."""
        row = await self._read(sqlapi.check_bounce_recipient, address=address, size=size)
        return row.verdict, row.address

    async def size_refusal(self, accepted: list[str], size: int) -> str | None:
        """None when some accepted recipient's plan takes a message of `size` octets (that one is
        moved to the front of `accepted`, to be asked first next time), else the refusal reply
        (mailroom.check_message_size; psycopg errors raise)."""
        row = await self._read(sqlapi.check_message_size, addresses=accepted, size=size)
        if row.reply is not None:
            return row.reply
        if row.address in accepted:  # ask the one that fits first next time
            accepted.remove(row.address)
            accepted.insert(0, row.address)
        return None

    async def _read(self, fn: SqlFunction, **kwargs: Any) -> Any:
        """The first row of a read-only call (retrying on a broken connection is always safe), within
        `timeout` seconds in all."""
        try:
            async with asyncio.timeout(self.timeout):
                attempts = self.pool.max_size + 1
                for attempt in range(1, attempts + 1):
                    try:
                        async with self.pool.connection(timeout=self.timeout) as conn:
                            return await fn.arow(conn, **kwargs)
                    except psycopg.OperationalError:
                        if attempt == attempts:
                            raise
        except TimeoutError:
            raise DatabaseTimeout(f"no answer within {self.timeout:g}s") from None
        return None  # pragma: no cover

    async def message(self, raw: bytes, mail_from: str, recipients: list[str]) -> str:
        """Store a message for its accepted recipients (all or none): the reply."""
        if not raw.strip():  # no header, no body: nothing to store
            return REPLY_EMPTY
        if len(raw) <= _INLINE_PARSE_BYTES:
            parsed = parse_message(raw)
        else:  # keep the event loop responsive while a big message is parsed
            parsed = await asyncio.to_thread(parse_message, raw)
        return await self._group.submit(DeliveryParams(raw, parsed, mail_from, recipients))

    async def _deliver_alone(self, params: DeliveryParams) -> str:
        """One message in its own statement (and commit): its reply."""
        # Every pooled connection may be stale after a server restart: try up to pool size + 1.
        for attempt in range(1, self.pool.max_size + 2):
            try:
                return await self._deliver_once(params)
            except StaleConnection as exc:
                # The pooled connection was dead before anything was sent (server restart,
                # pg_terminate_backend): nothing was stored, one retry on a fresh one is safe.
                log.warning("delivery attempt %d: stale database connection: %s", attempt, exc)
            except psycopg.OperationalError as exc:
                # Lost during the delivering statement (or none within the timeout): the outcome is
                # unknown. 4xx makes the client retry (a possible duplicate beats a lost message).
                self.unreachable("delivering", exc)
                return REPLY_TEMPFAIL
            except psycopg.Error as exc:
                log.error("delivery failed: %s", describe_db_error(exc))
                return REPLY_TEMPFAIL
        return REPLY_TEMPFAIL

    async def bounce(self, raw: bytes, return_paths: list[str]) -> str:
        """Hand the parsed report to SQL in one statement; 250 only after it committed."""
        if len(raw) <= _INLINE_PARSE_BYTES:
            reports = parse_bounce(raw)
        else:
            reports = await asyncio.to_thread(parse_bounce, raw)
        for attempt in range(1, self.pool.max_size + 2):
            try:
                async with self.pool.connection(timeout=self.timeout) as conn:
                    await ensure_alive(conn)
                    # one statement for every return path of the transaction (normally one)
                    rows = await sqlapi.record_bounce.aeach(
                        conn, [{"return_path": a} for a in return_paths], reports=Jsonb(reports)
                    )
            except StaleConnection as exc:
                log.warning("bounce attempt %d: stale database connection: %s", attempt, exc)
                continue
            except psycopg.OperationalError as exc:
                self.unreachable("recording a bounce", exc)
                return REPLY_TEMPFAIL
            except psycopg.Error as exc:
                if exc.sqlstate == _BOUNCE_GONE:
                    log.info("refused a bounce at DATA: its return path is no longer valid")
                    return REPLY_UNAVAILABLE
                log.error("recording a bounce failed: %s", describe_db_error(exc))
                return REPLY_TEMPFAIL
            self.reached()
            for message_id, outcome, count, suppressed in rows:
                log.info("bounce for outbound message %d: %s (%d report(s), %d suppressed)",
                         message_id, outcome, count, suppressed)
            return f"250 2.0.0 OK: bounce recorded for {len(rows)} message(s)"
        return REPLY_TEMPFAIL

    async def _deliver_once(self, p: DeliveryParams) -> str:
        async with self.pool.connection(timeout=self.timeout) as conn:
            await ensure_alive(conn)
            # Fast path: every recipient in ONE autocommit statement, so it either commits for all
            # of them or for none, in one round trip. 250 is sent only after it returned.
            try:
                ids = await sqlapi.deliver_message.aeach(
                    conn, [{"address": a} for a in p.recipients], raw=p.raw, envelope_from=p.mail_from,
                    subject=p.parsed.subject, from_header=p.parsed.from_header, text_body=p.parsed.text_body,
                    html_body=p.parsed.html_body, attachments=Jsonb(p.parsed.attachments),
                )
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                if (exc.sqlstate or "") not in _SQLSTATE_REPLY:
                    raise
                if len(p.recipients) == 1:
                    log.info("refused a message at DATA: %s", exc.sqlstate)
                    return _SQLSTATE_REPLY[exc.sqlstate][0]
                return await self._diagnose(conn, p)
        self.reached()
        log.info(
            "stored %d message(s) of %d bytes, %d attachment(s), ids %s",
            len(ids), len(p.raw), len(p.parsed.attachments), ",".join(map(str, ids)),
        )
        return f"250 2.0.0 OK: stored for {len(ids)} recipient(s)"

    async def _deliver_group(self, group: list[DeliveryParams]) -> list[str] | None:
        """Several sessions' messages in ONE autocommit statement (one commit, one WAL flush, one
        turn of each inbox's row lock): their replies, or None when the statement failed with
        nothing kept (a refused recipient, a stale connection): then each goes alone."""
        flat = [(i, rcpt) for i, p in enumerate(group, start=1) for rcpt in p.recipients]
        async with self.pool.connection(timeout=self.timeout) as conn:
            try:
                await ensure_alive(conn)
            except StaleConnection as exc:
                log.warning("group delivery: stale database connection: %s", exc)
                return None  # nothing was sent
            try:
                rows = await sqlapi.deliver_messages.arows(
                    conn, message=[i for i, _ in flat], address=[rcpt for _, rcpt in flat],
                    raw=[p.raw for p in group], envelope_from=[p.mail_from for p in group],
                    subject=[p.parsed.subject for p in group], from_header=[p.parsed.from_header for p in group],
                    text_body=[p.parsed.text_body for p in group], html_body=[p.parsed.html_body for p in group],
                    attachments=[Jsonb(p.parsed.attachments) for p in group],
                )
            except psycopg.OperationalError:
                raise  # the outcome is unknown: the caller answers 4xx for every one of them
            except psycopg.Error as exc:
                if (exc.sqlstate or "") not in _SQLSTATE_REPLY:
                    raise
                log.info("group commit of %d messages refused (%s): delivering them one by one",
                         len(group), exc.sqlstate)
                return None  # one of them is refused and nothing was kept: each goes alone
        self.reached()
        log.info("group commit: %d messages in one statement", len(group))
        ids: list[list[int]] = [[] for _ in group]
        for i, message_id in rows:
            ids[i - 1].append(message_id)
        replies = []
        for p, stored in zip(group, ids, strict=True):
            log.info(
                "stored %d message(s) of %d bytes, %d attachment(s), ids %s",
                len(stored), len(p.raw), len(p.parsed.attachments), ",".join(map(str, stored)),
            )
            replies.append(f"250 2.0.0 OK: stored for {len(stored)} recipient(s)")
        return replies

    async def _diagnose(self, conn: psycopg.AsyncConnection, p: DeliveryParams) -> str:
        """Several recipients and the fast path failed (nothing kept): find out who, keep nothing."""
        failures: list[_Failure] = []
        ok = 0
        async with conn.transaction():
            for rcpt in p.recipients:
                try:
                    async with conn.transaction():  # a savepoint per recipient
                        await sqlapi.deliver_message.acall(conn, address=rcpt, raw=p.raw, envelope_from=p.mail_from)
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

    def __init__(self, delivery: Delivery, size: int) -> None:
        self.delivery = delivery
        self.size = max(1, size)
        self.pending: list[tuple[DeliveryParams, asyncio.Future[str]]] = []
        self.flushers = 0

    async def submit(self, params: DeliveryParams) -> str:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.pending.append((params, future))
        if self.flushers < self.delivery.pool.max_size:
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

    async def _run(self, batch: list[tuple[DeliveryParams, asyncio.Future[str]]]) -> None:
        replies: list[str] | None = None
        try:
            if len(batch) > 1:
                try:
                    replies = await self.delivery._deliver_group([p for p, _ in batch])
                except psycopg.OperationalError as exc:
                    self.delivery.unreachable(f"delivering {len(batch)} messages", exc)
                    replies = [REPLY_TEMPFAIL] * len(batch)
            if replies is None:
                replies = [await self.delivery._deliver_alone(p) for p, _ in batch]
        except Exception as exc:  # noqa: BLE001 - never a 250 without a stored row
            log.error("delivery failed unexpectedly: %s", type(exc).__name__)
            replies = [REPLY_TEMPFAIL] * len(batch)
        for (_, future), reply in zip(batch, replies, strict=True):
            if not future.done():
                future.set_result(reply)

