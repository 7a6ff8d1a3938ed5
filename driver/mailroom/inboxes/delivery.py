"""Delivery for inbound SMTP: recipients, sizes, messages and bounces through the SQL API.

The protocol layer (mailroom.inboxes.smtp) asks this module and sends the reply it answers:
- a recipient: `mailroom.check_bounce_recipient` (the mailbox's check_recipient verdict, or 'bounce'
  for a valid VERP return path), with the SMTP reply of a refusing verdict;
- while DATA grows: `mailroom.check_message_size`, whether any accepted recipient's plan still takes
  the size so far (else its reply);
- a message: parsed (mailroom.inboxes.mime; over 16 KiB in the server's parsing processes,
  mailroom.inboxes.parsing, so a parse never holds up another session), then
  `mailroom.deliver_messages` with its receipt key (`p_receipt`): ONE autocommit statement, one round
  trip, the receipt recorded in its transaction), grouped with other sessions' messages when deliveries
  overlap (_GroupCommit: one COMMIT for the group). SQL stores each message for all its recipients
  or for none and answers its verdict and SMTP reply (4xx when a retry can succeed, 5xx otherwise);
  the reply is sent only after the statement returned (committed), so a 250 is never lost and a
  refused message never half kept. When the answer is lost (the connection ends after the statement
  was sent), `mailroom.settle_delivery(key)` on another connection tells what was decided and makes
  it final, and that is answered: a message stored is not offered again by a client told 451
  (issue 34); 451 only when nothing was stored, or when the database cannot be asked within the
  timeout (then a retry may duplicate it: the one case left, logged).
  A group whose statement fails for any reason but a lost connection is delivered message by
  message: one message never fails another (a deadlock between two groups, SQLSTATE class 40, is an
  answer that nothing was kept, not a lost connection); a message the database cannot store for its content
  (SQLSTATE class 22) gets 554 5.6.0.
- a bounce (docs/bounces.md): mailroom.inboxes.bounce reads the report (its first MiB, in the
  parsing processes when large) and `mailroom.record_bounce`
  decides, in ONE autocommit statement; 250 follows it. A bounce nothing could be read from is
  still 250 (SQL notes it as unparsed), so a relay does not retry it for days. It is not stored.
  A refusal answers the SMTP reply mailroom.error_codes gives its SQLSTATE.
- an injected fault (docs/inboxes.md, "Fault injection") is decided in those same calls; a DATA-stage
  fault SQL did not apply because a recipient belongs to another owner comes back as the row's
  faults_skipped, counted here (the summary line, mailroom_inbound_faults_skipped_total).
Python writes only the replies SQL gives, and its own 451 when the database cannot be asked.
Logs carry counts, sizes and ids, never addresses or subjects.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from mailroom.core.errors import UpgradeBackoff, describe_db_error, smtp_reply_of
from mailroom.core.log import get_logger
from mailroom.core.outage import Outage
from mailroom.db.connect import StaleConnection, ensure_alive
from mailroom.db.contract import SqlFunction
from mailroom.db.pool import within
from mailroom.inboxes import sqlapi
from mailroom.inboxes.metrics import InboundMetrics, InboundTally
from mailroom.inboxes.mime import ParsedMessage
from mailroom.inboxes.parsing import ParsePool

log = get_logger("inbox")

# The reply when the database could not be asked (the verdicts and their replies come from SQL).
REPLY_TEMPFAIL = "451 4.3.0 Temporary failure, please try again later"
REPLY_UNSTORABLE = "554 5.6.0 Message refused: it cannot be stored as sent"

# SQLSTATE class of a message the database refuses for its content (22P05, 22021, ...): permanent
_DATA_EXCEPTION = "22"

# How long an SMTP command waits out a schema change (db migrate) before answering 451.
_UPGRADE_WAIT = 20.0


@dataclass
class DeliveryParams:
    raw: bytes
    parsed: ParsedMessage
    mail_from: str
    recipients: list[str]
    trace: dict[str, Any] | None = None  # the SMTP session's facts: SQL writes Received: from them


def document(p: DeliveryParams) -> dict[str, Any]:
    """The message's JSON document for deliver_messages: the parsed fields, and the session's trace."""
    doc = p.parsed.document()
    if p.trace is not None:
        doc["trace"] = p.trace
    return doc


class DatabaseTimeout(psycopg.OperationalError):
    """A call of the SMTP path got no answer within --db-timeout (the database is unreachable or stuck)."""


class Delivery:
    """What the SMTP layer asks the database, on a pool of autocommit connections; see the module docstring.

    Every call is bounded by `timeout` seconds (--db-timeout): a recipient check or size probe as a
    whole, a delivery while it waits for a connection (a statement already sent is waited for: its
    outcome decides the reply). Past it, DatabaseTimeout: the SMTP layer answers 451."""

    def __init__(self, pool: AsyncConnectionPool, parser: ParsePool, *, group_size: int = 32, timeout: float = 5.0,
                 outage: Outage | None = None, metrics: InboundMetrics | None = None, sink: bool = False) -> None:
        self.pool = pool
        self.sink = sink  # inbox serve --sink: every recipient gets an inbox at RCPT (decided in SQL)
        self.parser = parser
        self.timeout = timeout
        self._group = _GroupCommit(self, group_size)
        self.outage = outage or Outage(log)  # the database unreachable: logged once, and once recovered
        self.upgrade = UpgradeBackoff(log)  # calls that meet a schema change wait and retry (docs/upgrading.md)
        self.tally = InboundTally()  # the periodic summary line (inbox serve --log-every): no line per message
        self.metrics = metrics  # the server's (faults skipped); None: not counted there

    def unreachable(self, what: str, exc: BaseException) -> None:
        """A call failed on the connection (lost, none within the timeout): the outage's one line,
        not one line per SMTP command."""
        self.outage.delay(f"{what}: {describe_db_error(exc).removeprefix('database unreachable: ')}")

    def reached(self) -> None:
        self.outage.resumed()

    async def recipient(self, address: str, size: int | None) -> tuple[str, str, str | None]:
        """check_bounce_recipient's verdict, normalized address and refusal reply (psycopg errors raise)."""
        row = await self._read(sqlapi.check_bounce_recipient, address=address, size=size, sink=self.sink)
        return row.verdict, row.address, row.reply

    async def login(self, username: str, digest: bytes) -> Any:
        """smtp_login's row (credential_id, capture_address, expires_at) for an SMTP AUTH; a refused
        login (its SMTP reply in mailroom.error_codes) and the other psycopg errors raise."""
        return await self._read(sqlapi.smtp_login, username=username, digest=digest)

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
        """The first row of a read-only call; a schema change (db migrate) is waited out first."""
        return await self.upgrade.call(lambda: self._read_once(fn, **kwargs), within=_UPGRADE_WAIT)

    async def _read_once(self, fn: SqlFunction, **kwargs: Any) -> Any:
        """The first row of a read-only call, within `timeout` seconds in all. A pooled connection the
        server ended while idle (found before anything is sent) is replaced by the next one; a
        statement the server cancelled or terminated, or a connection lost under it, is not re-run:
        the SMTP layer answers 451 and the client retries."""
        async def attempts() -> Any:
            for _attempt in range(self.pool.max_size + 1):
                try:
                    async with self.pool.connection(timeout=self.timeout) as conn:
                        await ensure_alive(conn)
                        return await fn.arow(conn, **kwargs)
                except StaleConnection:
                    continue
            raise psycopg.OperationalError("every pooled connection was found ended by the server")

        try:
            return await within(self.timeout, attempts())
        except TimeoutError:
            raise DatabaseTimeout(f"no answer within {self.timeout:g}s") from None

    async def settle(self, key: uuid.UUID, count: int, exc: BaseException) -> list[str]:
        """The replies of `count` messages whose delivering statement (receipt `key`) lost its answer:
        what it decided (mailroom.settle_delivery, on another connection, within the timeout), so
        a message stored is answered as stored and never offered again; 451 for each when nothing
        was stored (and now cannot be) or when the database cannot be asked."""
        try:
            row = await self._read(sqlapi.settle_delivery, key=key)
        except psycopg.Error as again:
            self.unreachable("settling a lost delivery answer", again)
            log.warning("a delivery's answer was lost (%s) and could not be settled: answered 451 for %d message(s)",
                        type(exc).__name__, count)
            return [REPLY_TEMPFAIL] * count
        self.reached()
        replies = row[0] if row is not None else None
        if replies is None or len(replies) != count:
            log.warning("a delivery's answer was lost (%s); settled: nothing stored, answered 451 for %d message(s)",
                        type(exc).__name__, count)
            return [REPLY_TEMPFAIL] * count
        log.warning("a delivery's answer was lost (%s); settled: %d message(s) answered as decided",
                    type(exc).__name__, count)
        return list(replies)

    async def message(self, raw: bytes, mail_from: str, recipients: list[str],
                      trace: dict[str, Any] | None = None) -> str:
        """Store a message for its accepted recipients (all or none): the reply. `trace`: the SMTP
        session's facts (client, helo, by, esmtp, tls, auth, smtputf8), from which SQL writes the
        stored copy's Received: header (sql/21_delivery.sql, _received_header)."""
        parsed = await self.parser.message(raw)  # inline when small, else in a parsing process
        return await self._group.submit(DeliveryParams(raw, parsed, mail_from, recipients, trace))

    async def _deliver_alone(self, params: DeliveryParams) -> str:
        """One message in its own statement (and commit): its reply."""
        # one receipt key for every attempt: were an attempt thought unsent committed after all,
        # the next one could not commit under the same key (unique), so never a second copy
        key = receipt_key()
        # Every pooled connection may be stale after a server restart: try up to pool size + 1.
        for attempt in range(1, self.pool.max_size + 2):
            try:
                return await self.upgrade.call(lambda: self._deliver_once(params, key), within=_UPGRADE_WAIT)
            except StaleConnection as exc:
                # The pooled connection was dead before anything was sent (server restart,
                # pg_terminate_backend): nothing was stored, one retry on a fresh one is safe.
                log.warning("delivery attempt %d: stale database connection: %s", attempt, exc)
            except psycopg.OperationalError as exc:
                if _rolled_back(exc):
                    # deadlock or serialization failure (class 40): the server's answer that it
                    # rolled back, nothing stored; the next attempt keeps the receipt key
                    log.warning("delivery attempt %d rolled back (%s): trying again", attempt, exc.sqlstate)
                    continue
                # Lost during the delivering statement (or none within the timeout): its receipt
                # tells what was decided (a 451 only when nothing was stored, or no one can tell).
                self.unreachable("delivering", exc)
                (reply,) = await self.settle(key, 1, exc)
                return reply
            except psycopg.Error as exc:
                if (exc.sqlstate or "").startswith(_DATA_EXCEPTION):
                    # the message's own content (a field the database cannot hold): a retry
                    # cannot succeed, and no other message is involved
                    log.warning("refused a message at DATA: the database cannot store it (%s)", exc.sqlstate)
                    return REPLY_UNSTORABLE
                log.error("delivery failed: %s", describe_db_error(exc))
                return REPLY_TEMPFAIL
        return REPLY_TEMPFAIL

    async def bounce(self, raw: bytes, return_paths: list[str]) -> str:
        """Hand the parsed report to SQL in one statement; 250 only after it committed."""
        reports = await self.parser.bounce(raw)  # its first MiB; inline when small, else in a process
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
                refusal = smtp_reply_of(exc)  # e.g. a return path no longer valid (its message purged)
                if refusal is not None:
                    log.info("refused a bounce at DATA: %s", exc.sqlstate)
                    return refusal
                log.error("recording a bounce failed: %s", describe_db_error(exc))
                return REPLY_TEMPFAIL
            self.reached()
            for message_id, outcome, count, suppressed in rows:
                log.info("bounce for outbound message %d: %s (%d report(s), %d suppressed)",
                         message_id, outcome, count, suppressed)
            return f"250 2.0.0 OK: bounce recorded for {len(rows)} message(s)"
        return REPLY_TEMPFAIL

    async def _deliver_once(self, p: DeliveryParams, key: uuid.UUID) -> str:
        async with self.pool.connection(timeout=self.timeout) as conn:
            await ensure_alive(conn)
            # ONE transaction: stored for every recipient or for none, with its receipt, and the
            # reply SQL gives is sent only after it committed.
            (row,) = await _deliver(conn, [p], key)
        self.reached()
        self.tally.statements += 1
        _log_delivery(p, row)
        self._count_skipped(row)
        return row.reply

    async def _deliver_group(self, group: list[DeliveryParams], key: uuid.UUID) -> list[str] | None:
        """Several sessions' messages in ONE autocommit statement (one commit, one WAL flush, one
        turn of each inbox's row lock): their replies, each message stored for all its recipients
        or none; None when the statement failed with nothing kept (a message the database cannot
        store, a schema change, a stale connection): then each goes alone, so one message never
        fails another."""
        async with self.pool.connection(timeout=self.timeout) as conn:
            try:
                await ensure_alive(conn)
            except StaleConnection as exc:
                log.warning("group delivery: stale database connection: %s", exc)
                return None  # nothing was sent
            try:
                rows = await _deliver(conn, group, key)
            except psycopg.OperationalError as exc:
                if not _rolled_back(exc):
                    raise  # the answer is lost: the caller settles it by the receipt
                # a deadlock (two groups taking the same inboxes' row locks in other orders) or a
                # serialization failure: an answer, not a lost one; the statement rolled back and
                # nothing was kept, so each goes alone (one inbox row at a time: no circle)
                log.info("group commit of %d messages rolled back (%s): delivering them one by one",
                         len(group), exc.sqlstate)
                return None
            except psycopg.Error as exc:
                # one of them cannot be stored, or it met a schema change (db migrate), and nothing
                # was kept: each goes alone (and waits out the schema change)
                log.info("group commit of %d messages failed (%s): delivering them one by one",
                         len(group), exc.sqlstate)
                return None
        self.reached()
        self.tally.statements += 1
        if log.isEnabledFor(logging.DEBUG):  # inbox serve --log-messages; else the summary line counts it
            log.debug("group commit: %d messages in one statement", len(group))
        for p, row in zip(group, rows, strict=True):
            _log_delivery(p, row)
            self._count_skipped(row)
        return [row.reply for row in rows]

    def _count_skipped(self, row: Any) -> None:
        """The DATA-stage faults SQL left unapplied to a message because a recipient of it belongs to
        another owner (a fault harms only its owner): counted, and said at info (the tester who set
        one looks for why it did not answer); no address."""
        skipped = row.faults_skipped or 0
        if not skipped:
            return
        self.tally.faults_skipped += skipped
        if self.metrics is not None:
            self.metrics.faults_skipped.inc(skipped)
        log.info("skipped %d injected fault(s): the message has a recipient of another owner", skipped)


def _rolled_back(exc: psycopg.Error) -> bool:
    """SQLSTATE class 40 (deadlock, serialization failure): the server answered that the transaction
    rolled back, nothing kept. psycopg files 40P01 under OperationalError, beside a lost connection,
    which is no answer at all."""
    return (exc.sqlstate or "").startswith("40")


def receipt_key() -> uuid.UUID:
    """A delivery receipt's key: a UUID version 7 (its first 48 bits the time in ms), so keys of one
    moment sit together in the index."""
    value = (time.time_ns() // 1_000_000) << 80 | secrets.randbits(80)
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return uuid.UUID(int=value)


async def _deliver(conn: psycopg.AsyncConnection, group: list[DeliveryParams], key: uuid.UUID) -> list[Any]:
    """mailroom.deliver_messages for `group` with its receipt key: ONE autocommit statement (its own
    transaction, committed before the answer comes back), one round trip: one row per message (ids,
    verdict, reply), in order, and a receipt of the replies under `key`, in the same transaction."""
    return await sqlapi.deliver_messages.arows(
        conn,
        message=[i for i, p in enumerate(group, start=1) for _ in p.recipients],
        address=[rcpt for p in group for rcpt in p.recipients],
        raw=[p.raw for p in group], envelope_from=[p.mail_from for p in group],
        parsed=[Jsonb(document(p)) for p in group],
        receipt=key,
    )


def _log_delivery(p: DeliveryParams, row: Any) -> None:
    """A message's line: at debug level (inbox serve --log-messages), the periodic summary line counts
    it instead; an injected fault's at info (a tester set it and looks for it)."""
    if row.verdict == "fault" and row.message_ids:  # an injected fault after DATA (sql/24_faults.sql)
        log.info("stored %d message(s), then answered an injected fault", len(row.message_ids))
        return
    if not log.isEnabledFor(logging.DEBUG):
        return
    if row.verdict != "ok":
        log.debug("refused a message at DATA: %s (%d recipient(s))", row.verdict, len(p.recipients))
        return
    log.debug(
        "stored %d message(s) of %d bytes, %d attachment(s), ids %s",
        len(row.message_ids), len(p.raw), len(p.parsed.attachments), ",".join(map(str, row.message_ids)),
    )


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
                key = receipt_key()
                try:
                    replies = await self.delivery._deliver_group([p for p, _ in batch], key)
                except psycopg.OperationalError as exc:
                    self.delivery.unreachable(f"delivering {len(batch)} messages", exc)
                    replies = await self.delivery.settle(key, len(batch), exc)
            if replies is None:
                replies = [await self.delivery._deliver_alone(p) for p, _ in batch]
        except Exception as exc:  # noqa: BLE001 - never a 250 without a stored row
            log.error("delivery failed unexpectedly: %s", type(exc).__name__)
            replies = [REPLY_TEMPFAIL] * len(batch)
        for (_, future), reply in zip(batch, replies, strict=True):
            if not future.done():
                future.set_result(reply)

