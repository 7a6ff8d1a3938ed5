"""The outbound sender: claim -> SMTP -> finalize, the loop behind `mailroom send`.

Every rule lives in SQL (sql/33_outbound_claim.sql, sql/34_outbound_finalize.sql): what is due,
what a reply means, when to retry. This module only claims a batch, talks SMTP with aiosmtplib
and reports raw outcomes (kind, reply code, enhanced code, reply text) in one finalize call.

- `--concurrency` slots; each slot owns one database connection and `--connections` SMTP
  connections per relay (a batch is dealt over them and sent in parallel), reused across messages
  and batches. No transaction is open during SMTP (autocommit:
  claim and finalize are single statements).
- A slot that keeps going reports a fully attempted batch and claims the next in one call and one
  commit (finalize_and_claim, issue 37); with refused recipients to record, a part unsent, or when
  stopping, it reports with the separate calls. A batch claimed that way when a stop comes is
  released untouched.
- Wakes on NOTIFY mailroom_outbound (mailroom.db.listen on the listen URL), polls every
  `--poll-interval` as a fallback (retries that become due are found by the poll; behind a
  transaction pooler without a listen URL the poll is the only wake-up).
- SIGTERM/SIGINT: stop claiming, finish the message on the wire, release the rest of the batch,
  finalize, exit; after `--shutdown-grace` seconds an unfinished SMTP exchange is abandoned (a
  DATA phase cut short is reported 'uncertain': retried and flagged possibly_sent).
- A built-in reaper (`--reap-after`) returns rows of dead workers to the queue.
- Slot 0 sends the heartbeat (mailroom.db.heartbeat: alive, listening, messages claimed, its
  metrics address) on its connection about every 10 s and within a second of a claim, between
  batches; on a clean exit the sender reports itself stopped.
- Its log (docs/operations.md): one line per deferral and per failure (message id, relay, the
  reply's code and enhanced status, never its text, which quotes addresses; the attempt and the next
  try), at most OUTCOME_LINES a OUTCOME_WINDOW (then one "... and K more" line); successes are counted
  in a summary line every --summary-every (and at exit), never a line each (OutcomeLog).
- The database unreachable (not started yet, restarting, cut off): the sender waits and retries,
  one log line when the wait starts and one when it recovers (mailroom.core.outage), whichever of
  its tasks met it; a claim never fails more loudly than that.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.types.composite import CompositeInfo

from mailroom.core import eventloop
from mailroom.core.errors import ConfigError, Kind, UserError, describe_db_error, kind_of
from mailroom.core.log import get_logger
from mailroom.core.outage import RateLimited
from mailroom.core.ready import notify_ready
from mailroom.db import keyring
from mailroom.db import sqlapi as db_sqlapi
from mailroom.db.connect import ConnectFailed
from mailroom.db.worker import Worker, unavailable
from mailroom.outbound import claimrow, sqlapi
from mailroom.outbound.dkim import Signer
from mailroom.outbound.metrics import SenderMetrics
from mailroom.outbound.sealing import KEY_FILE_ENV, Unsealer
from mailroom.outbound.smtp import Attempt, Outcome, Relay, RelayConnections, deliver
from mailroom.outbound.webhooks import WebhookClient, WebhookPolicy, endpoint_label

log = get_logger("send")

CHANNEL = "mailroom_outbound"
OUTCOME_LINES = 10  # deferral and failure lines per OUTCOME_WINDOW at most
OUTCOME_WINDOW = 10.0


class OutcomeLog:
    """The sender's account of what it did: a line per deferral and per failure, rate-limited (at most
    `burst` lines a `window` seconds, then one "... and K more" line when the window turns), and a
    summary of every outcome (sent, deferred, failed) every `every` seconds and at exit, never a line
    per success. A line names the message, its relay, the reply's code and enhanced status (its text
    quotes addresses: it stays in the redacted error_log, `mailroom outbound show ID`), the attempt
    and the next try (SQL's, from finalize_messages)."""

    def __init__(self, logger: Any, burst: int = OUTCOME_LINES, window: float = OUTCOME_WINDOW,
                 every: float = 60.0) -> None:
        self.log = logger
        self.burst = burst
        self.window = window
        self.every = every
        self.counts: Counter[str] = Counter()
        self.window_start = time.monotonic()
        self.summary_start = time.monotonic()
        self.lines = 0
        self.unlogged = 0

    @staticmethod
    def _reply(outcome: Outcome) -> str:
        """What the relay answered, by its codes only (the text quotes addresses)."""
        if outcome.code is not None:
            return " ".join(str(part) for part in ("reply", outcome.code, outcome.enhanced) if part)
        if outcome.refused:  # recipients refused at RCPT: their codes, never their addresses
            codes = dict.fromkeys(" ".join(str(p) for p in (code, enhanced) if p) for _, code, enhanced in outcome.refused)
            return f"{len(outcome.refused)} recipient(s) refused: reply " + ", ".join(list(codes)[:3])
        return f"{outcome.outcome} (no reply)"

    def record(self, outcome: Outcome, result: str, relay: str, attempts: int | None,
               next_retry_at: datetime | None) -> None:
        if result == "sent":
            self.counts["sent"] += 1
            return
        if result not in ("retry", "failed"):
            return  # stale: another worker's outcome now
        kind = "deferred" if result == "retry" else "failed"
        self.counts[kind] += 1
        self._turn()
        if self.lines >= self.burst:
            self.unlogged += 1
            return
        self.lines += 1
        then = ("no more tries" if next_retry_at is None
                else "next try " + next_retry_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ"))
        self.log.info("%s message %d via %s: %s, attempt %s, %s", kind, outcome.id, relay, self._reply(outcome),
                      attempts if attempts is not None else "?", then)

    def _turn(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.window_start < self.window:
            return
        if self.unlogged:
            self.log.info("... and %d more deferral(s) or failure(s) not logged (at most %d lines a %gs)",
                          self.unlogged, self.burst, self.window)
        self.window_start, self.lines, self.unlogged = now, 0, 0

    def tick(self, final: bool = False) -> None:
        """The window's "... and K more" line when it turned, and the summary when due (at exit:
        now, when anything happened since the last)."""
        self._turn(force=final)
        now = time.monotonic()
        if not final and now - self.summary_start < self.every:
            return
        if sum(self.counts.values()):
            self.log.info("summary: sent %d, deferred %d, failed %d in the last %.0fs", self.counts["sent"],
                          self.counts["deferred"], self.counts["failed"], now - self.summary_start)
        self.counts.clear()
        self.summary_start = now


# ---------------------------------------------------------------------------------------------
# The sender process


@dataclass
class SenderOptions:
    url: str
    unsealer: Unsealer | None  # MAILROOM_SENDER_KEY_FILE: opens the relay passwords claim_messages returns sealed
    listen_url: str | None = None  # None: poll only
    concurrency: int = 4
    batch_size: int = 50
    connections: int = 1  # SMTP connections per slot (and relay), used in parallel within a batch
    poll_interval: float = 5.0
    reap_after: float = 300.0
    lease: float | None = None
    smtp_timeout: float = 30.0
    shutdown_grace: float = 5.0
    worker: str = ""
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    tls_ca_file: str | None = None
    until_idle: bool = False
    dkim: Signer | None = None  # MAILROOM_DKIM_KEY_FILE: the DKIM private keys (None: no key, mail leaves unsigned)
    pipelining: bool = True  # pipeline MAIL/RCPT/DATA where the relay's EHLO offers PIPELINING (RFC 2920)
    summary_every: float = 60.0  # seconds between the summary lines of what was sent, deferred, failed
    key_fingerprint: str | None = None  # of MAILROOM_SECRET_KEY: must be the active signing key (db/keyring.py)
    webhooks: WebhookPolicy = field(default_factory=WebhookPolicy)  # --webhook-allow, --webhook-timeout


class Sender(Worker):
    """The sender process, on the worker skeleton (mailroom.db.worker)."""

    def __init__(self, opts: SenderOptions):
        super().__init__("sender", log, url=opts.url, metrics=SenderMetrics(), name=opts.worker or None)
        self.opts = opts
        self.worker = self.heartbeat.worker
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.aborting = asyncio.Event()
        self.tls_context: ssl.SSLContext | None = None
        if opts.tls_ca_file:
            try:
                self.tls_context = ssl.create_default_context(cafile=opts.tls_ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"cannot load --tls-ca-file: {exc.__class__.__name__}") from None
        self.budget = 60.0  # seconds a slot may spend on one claimed batch before releasing the rest
        self.fatal: UserError | None = None
        # (self.outage, from the skeleton: the database unreachable, one wait for all slots and helpers,
        # logged once; self.upgrade: the schema changing under a call, wait and retry)
        self.warnings = RateLimited(log)
        self.dkim = opts.dkim if opts.dkim is not None else Signer({})
        self.outcomes = OutcomeLog(log, every=opts.summary_every)
        # the claim's row type (mailroom.claimed_message), read once: finalize_and_claim returns the next
        # batch's rows in a column of that type, which a connection reads once the type is registered
        self.claim_row: CompositeInfo | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self, *_args: object) -> None:
        super().stop()
        if self.stopping.is_set():
            self.aborting.set()  # second signal: abandon in-flight SMTP now
        self.stopping.set()
        self.wake.set()

    # whether `exc` is the database out of reach (wait and retry), not a fault of ours
    _unavailable = staticmethod(unavailable)

    def _fatal(self, exc: psycopg.Error | ConnectFailed) -> UserError:
        """The error that stops the sender: what no retry fixes (not installed, no grant, a wrong key)."""
        if (getattr(exc, "sqlstate", None) or "") in ("42883", "3F000", "42P01"):
            return ConfigError(f"the outbound queue is not installed (run `mailroom db migrate`): {describe_db_error(exc)}")
        return ConfigError(describe_db_error(exc)) if self.classify(exc) in (Kind.CONFIG, Kind.DENIED, Kind.USAGE) \
            else UserError(describe_db_error(exc))

    async def _read_lease(self) -> float | None:
        """The claim lease (--lease or the setting outbound.lease), waiting for the database if it is down
        (None: stopped meanwhile)."""
        async def read() -> float:
            # the first connection learns what each MR code means (mailroom.error_codes)
            async with await self.aconnect("mailroom-send") as conn:
                # claims mint and sign token links: refuse to start with a MAILROOM_SECRET_KEY that does not sign them
                await keyring.acheck(conn, "send", self.opts.key_fingerprint, log)
                value = await db_sqlapi.interval_setting.avalue(conn, name="outbound.lease")
            return value.total_seconds()

        try:
            lease = await self.await_database(read, stopping=self.stopping.is_set, sleep=self._wait)
        except (psycopg.Error, ConnectFailed) as exc:
            raise self._fatal(exc) from None
        return None if lease is None else self.opts.lease or lease

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.astop_on_signals()
        self.start_metrics(self.opts.metrics_port, self.opts.metrics_host)
        try:
            lease = await self._read_lease()
        except BaseException:
            self.metrics.shutdown()
            raise
        if lease is None or self.stopping.is_set():
            self.metrics.shutdown()
            log.info("sender %s stopped before it started", self.worker)
            return
        limits = [lease] + ([self.opts.reap_after] if self.opts.reap_after > 0 else [])
        self.budget = max(1.0, 0.5 * min(limits))
        self.lease = lease

        log.info(
            "sender %s started: concurrency %d, batch %d, lease %.0fs, reap-after %s, event loop %s",
            self.worker, self.opts.concurrency, self.opts.batch_size, lease,
            f"{self.opts.reap_after:.0f}s" if self.opts.reap_after > 0 else "off", eventloop.name(loop),
        )
        listener = self.listen(
            self.opts.listen_url, [CHANNEL], name="mailroom-send-listen",
            on_notify=lambda _c, _p: loop.call_soon_threadsafe(self.wake.set),
            on_connect=lambda: loop.call_soon_threadsafe(self.wake.set),
            poll_hint=f"polling every {self.opts.poll_interval:g}s",
        ).start()
        helpers = [asyncio.create_task(self.summary_loop())]
        if self.opts.reap_after > 0:
            helpers.append(asyncio.create_task(self.reaper()))
        if self.opts.metrics_port is not None:
            helpers.append(asyncio.create_task(self.stats_loop()))
        slots = [asyncio.create_task(self.slot(i)) for i in range(self.opts.concurrency)]
        slots_done = asyncio.ensure_future(asyncio.gather(*slots, return_exceptions=True))
        stop_wait = asyncio.ensure_future(self.stopping.wait())
        await asyncio.wait({slots_done, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not slots_done.done():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(slots_done), timeout=self.opts.shutdown_grace)
            if not slots_done.done():
                log.info("shutdown grace of %.0fs over: abandoning in-flight SMTP", self.opts.shutdown_grace)
                self.aborting.set()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(slots_done), timeout=5)
        stop_wait.cancel()
        listener.stop()
        for task in helpers:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        for result in slots_done.result() if slots_done.done() else []:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("a sender slot failed: %s", type(result).__name__)
                if self.fatal is None:
                    self.fatal = UserError(f"a sender slot failed unexpectedly ({type(result).__name__})")
        self.outcomes.tick(final=True)
        await self.afinish()
        log.info("sender %s stopped", self.worker)
        if self.fatal is not None:
            raise self.fatal

    async def wait_for_work(self, index: int = 0) -> None:
        timeout = self.opts.poll_interval
        if index == 0:  # slot 0 also wakes for the heartbeat
            timeout = min(timeout, max(0.05, self.heartbeat.seconds_left()))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=timeout)

    # -- helpers -----------------------------------------------------------------------------

    async def summary_loop(self) -> None:
        """The outcome log's "... and K more" lines and summaries while nothing else logs."""
        while True:
            await asyncio.sleep(min(OUTCOME_WINDOW, max(1.0, self.opts.summary_every)))
            self.outcomes.tick()

    async def reaper(self) -> None:
        interval = max(1.0, min(self.opts.reap_after / 2, 30.0))
        while True:
            try:
                async with await self.aconnect("mailroom-send-reaper") as conn:
                    while True:
                        count = await sqlapi.reap_stuck_messages.avalue(
                            conn, older_than=timedelta(seconds=self.opts.reap_after)
                        )
                        if count:
                            self.metrics.reaped.inc(count)
                            log.info("reaped %d stuck message(s) (possibly sent; retried)", count)
                            self.wake.set()
                        await asyncio.sleep(interval)
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, ConnectFailed) as exc:
                if not self._unavailable(exc):
                    self.warnings.warning("reaper", "reaper: %s", describe_db_error(exc))
                await asyncio.sleep(interval)  # (the slots say when the database is out of reach)

    async def stats_loop(self) -> None:
        health = True  # off after one failure that no retry fixes (older schema, no grant)
        while True:
            try:
                async with await self.aconnect("mailroom-send-stats") as conn:
                    while True:
                        self.metrics.update_stats((await sqlapi.outbound_stats.arow(conn))._asdict())
                        if health:
                            try:
                                rows = await db_sqlapi.queue_health.arows(conn)
                                self.metrics.update_health([r._asdict() for r in rows])
                            except psycopg.OperationalError:
                                raise
                            except psycopg.Error as exc:
                                if kind_of(exc) is not Kind.UPGRADING:  # an upgrade passes: next round
                                    health = False
                                    log.warning("WARN: queue health metrics off: %s", describe_db_error(exc))
                        await asyncio.sleep(max(1.0, self.opts.poll_interval))
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, ConnectFailed) as exc:
                if not self._unavailable(exc):
                    self.warnings.warning("stats", "stats: %s", describe_db_error(exc))
                await asyncio.sleep(5)

    # -- a concurrency slot ------------------------------------------------------------------

    async def slot(self, index: int) -> None:
        lanes = [RelayConnections(self.opts.smtp_timeout, self.tls_context, self.metrics, self.opts.pipelining)
                 for _ in range(max(1, self.opts.connections))]
        conn: psycopg.AsyncConnection | None = None
        pending: list[dict[str, Any]] = []  # the next batch, claimed with the last one's outcomes
        hooks: list[WebhookClient] = []  # the slot's HTTP client for webhook rows, made at the first
        try:
            while not self.stopping.is_set():
                if conn is None or conn.closed:
                    try:
                        conn = await self.aconnect(f"mailroom-send-{index}")
                    except ConnectFailed as exc:
                        await self._wait(self.backoff(exc))
                        continue
                    try:
                        await self._register_claim_row(conn)
                    except psycopg.Error as exc:  # lost at once: a new connection, after the outage's wait
                        await conn.close()
                        await self._wait(self.backoff(exc))
                        continue
                self.wake.clear()
                try:
                    if index == 0 and self.heartbeat.due(self.listening()):
                        await self.abeat(conn)
                    if pending:
                        rows, pending = pending, []
                    else:
                        claimed = await sqlapi.claim_messages.arows(
                            conn, limit=self.opts.batch_size, worker=self.worker, lease=timedelta(seconds=self.lease),
                        )
                        rows = [r._asdict() for r in claimed]
                except psycopg.Error as exc:
                    if kind_of(exc) in (Kind.CONFIG, Kind.DENIED):  # wrong key, not installed, no grant: no retry helps
                        self.fatal = self._fatal(exc)
                        self.stop()
                        return
                    if kind_of(exc) is Kind.UPGRADING:
                        await asyncio.sleep(self.upgrade.delay(exc))
                        continue
                    await conn.close()
                    if self._unavailable(exc) or conn.broken:
                        await self._wait(self.outage.delay(exc))
                    else:
                        self.warnings.warning("claim", "claim failed (%s); retrying", describe_db_error(exc))
                        await self._wait(1.0)
                    continue
                self.upgrade.resumed()
                self.outage.resumed()
                notify_ready()  # ready once a slot has claimed: connected, granted, installed
                if not rows:
                    if self.opts.until_idle:
                        return
                    await self.wait_for_work(index)
                    continue
                self.metrics.claimed.inc(len(rows))
                self.heartbeat.claimed += len(rows)
                outcomes, unsent = await self.deliver_kinds(lanes, hooks, rows)
                relays = {r["id"]: endpoint_label(r) if r.get("kind") == "webhook" else f"{r['smtp_host']}:{r['smtp_port']}"
                          for r in rows}
                if self._keeps_going(conn, outcomes, unsent):
                    claimed_next = await self.report_and_claim(conn, outcomes, relays)
                    if claimed_next is not None:
                        pending = claimed_next
                        continue
                await self.report(conn, outcomes, unsent, relays)
        finally:
            if pending and conn is not None:
                # stopped with a batch claimed along with the last outcomes: given back untouched
                with contextlib.suppress(psycopg.Error):
                    await self.report(conn, [], pending)
            for conns in lanes:
                await conns.close_all()
            for client in hooks:
                await client.aclose()
            if conn is not None:
                await conn.close()

    async def _wait(self, seconds: float) -> None:
        """Sleep, but wake at once when stopping."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), timeout=seconds)

    async def deliver_kinds(
        self, lanes: list[RelayConnections], hooks: list[WebhookClient], rows: list[dict[str, Any]]
    ) -> tuple[list[Outcome], list[dict[str, Any]]]:
        """A claimed batch by kind (sql/33): mail over the slot's SMTP connections, webhook rows
        (outbound/webhooks.py) over its HTTP client, both at once."""
        webhook_rows = [r for r in rows if r.get("kind") == "webhook"]
        if not webhook_rows:
            return await self.deliver_lanes(lanes, rows)
        mail_rows = [r for r in rows if r.get("kind") != "webhook"]
        if not hooks:
            hooks.append(WebhookClient(self.opts.webhooks))
        parts = await asyncio.gather(
            self.deliver_lanes(lanes, mail_rows) if mail_rows else asyncio.sleep(0, ([], [])),
            self.deliver_webhooks(hooks[0], webhook_rows),
        )
        return parts[0][0] + parts[1][0], parts[0][1] + parts[1][1]

    def webhook_secret(self, row: dict[str, Any]) -> str | None:
        """The whsec_ secret of a webhook row's endpoint, opened with the sender key (None: no endpoint
        any more, or sealed for another sender key); without a sender key the sender stops, as for a
        relay password."""
        sealed = row.get("webhook_secret_sealed")
        if sealed is None:
            return None
        if self.opts.unsealer is None:
            self.fatal = ConfigError(f"webhook deliveries are queued: set {KEY_FILE_ENV} (the sender key)")
            self.stop()
            return None
        # one sealed for another sender key (an endpoint registered before `sender-key init` made a new
        # one) stops nothing: that endpoint's deliveries are retried ('local', outbound/webhooks.py)
        # until the old key's file is listed in MAILROOM_SENDER_KEY_FILE or the endpoint is registered
        # again; a secret is an API key holder's, which the operator cannot set again as a relay password
        return self.opts.unsealer.open(sealed)

    async def deliver_webhooks(
        self, client: WebhookClient, rows: list[dict[str, Any]]
    ) -> tuple[list[Outcome], list[dict[str, Any]]]:
        """Each webhook row POSTed (at most 8 at once, an endpoint's one at a time); a row not begun when
        stopping goes back unsent, one cut short by an abort is reported uncertain (the receiver may have
        it). Once an endpoint gives no answer (no connection, a timeout, a request cut short), its other
        rows of the batch are not tried: 'connect', retried with the backoff, as the rows of a relay
        that cannot be reached (deliver_lanes), so an endpoint that never answers holds the slot, and
        the mail claimed with it, for one timeout, not one a row."""
        gate = asyncio.Semaphore(8)
        started: set[int] = set()
        endpoints: dict[str, asyncio.Lock] = {}  # one request at a time per endpoint URL
        silent: dict[str, str] = {}  # endpoints that gave no answer in this batch: the outcome they gave

        async def one(row: dict[str, Any]) -> Outcome | None:
            url = row.get("webhook_url") or ""
            async with endpoints.setdefault(url, asyncio.Lock()):
                if url in silent:
                    return Outcome(row["id"], row["claim_token"], "connect",
                                   error=f"not tried: an earlier delivery of this batch to its endpoint got no answer "
                                         f"({silent[url]})")
                async with gate:
                    if self.stopping.is_set():
                        return None
                    secret = self.webhook_secret(row)
                    if self.fatal is not None:
                        return None
                    started.add(row["id"])
                    t0 = time.monotonic()
                    out = await client.deliver(row, secret)
                    out.seconds = time.monotonic() - t0
                    if url and out.outcome in ("connect", "timeout", "uncertain", "dropped"):
                        silent[url] = f"{out.outcome}: {out.error}" if out.error else out.outcome
                    return out

        tasks = [asyncio.ensure_future(one(r)) for r in rows]
        abort = asyncio.ensure_future(self.aborting.wait())
        try:
            done = asyncio.ensure_future(asyncio.gather(*tasks, return_exceptions=True))
            await asyncio.wait({done, abort}, return_when=asyncio.FIRST_COMPLETED)
            if not done.done():
                for task in tasks:
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await done
        finally:
            abort.cancel()
        outcomes: list[Outcome] = []
        unsent: list[dict[str, Any]] = []
        for row, task in zip(rows, tasks, strict=True):
            result = None if task.cancelled() else task.exception() or task.result()
            if isinstance(result, BaseException):
                log.error("webhook delivery %d failed unexpectedly: %s", row["id"], type(result).__name__)
            if isinstance(result, Outcome):
                outcomes.append(result)
            elif row["id"] in started:
                outcomes.append(Outcome(row["id"], row["claim_token"], "uncertain", error="shutdown during the request"))
            else:
                unsent.append(row)
        return outcomes, unsent

    async def deliver_lanes(
        self, lanes: list[RelayConnections], rows: list[dict[str, Any]]
    ) -> tuple[list[Outcome], list[dict[str, Any]]]:
        """--connections: the batch dealt round-robin over the slot's SMTP connections, each lane
        sent in order on its own connection; every row ends in exactly one lane's outcomes or unsent."""
        if len(lanes) == 1 or len(rows) == 1:
            return await self.deliver_batch(lanes[0], rows)
        parts = [rows[i::len(lanes)] for i in range(len(lanes))]
        results = await asyncio.gather(
            *(self.deliver_batch(conns, part) for conns, part in zip(lanes, parts, strict=True) if part)
        )
        outcomes = [o for lane_outcomes, _ in results for o in lane_outcomes]
        unsent = [r for _, lane_unsent in results for r in lane_unsent]
        return outcomes, unsent

    async def deliver_batch(
        self, conns: RelayConnections, rows: list[dict[str, Any]]
    ) -> tuple[list[Outcome], list[dict[str, Any]]]:
        started = time.monotonic()
        outcomes: list[Outcome] = []
        unsent: list[dict[str, Any]] = []
        broken: dict[Relay, Outcome] = {}  # relays that could not be reached in this batch
        abort = asyncio.ensure_future(self.aborting.wait())  # one waiter for the batch, not one a message
        try:
            return await self._deliver_rows(conns, rows, started, outcomes, unsent, broken, abort)
        finally:
            abort.cancel()

    async def _deliver_rows(
        self, conns: RelayConnections, rows: list[dict[str, Any]], started: float, outcomes: list[Outcome],
        unsent: list[dict[str, Any]], broken: dict[Relay, Outcome], abort: asyncio.Future[Any],
    ) -> tuple[list[Outcome], list[dict[str, Any]]]:
        for pos, row in enumerate(rows):
            if self.stopping.is_set() or time.monotonic() - started > self.budget:
                unsent.extend(rows[pos:])
                break
            password, problem = self.relay_password(row)
            if problem is not None:
                self.fatal = ConfigError(problem)
                self.stop()
                unsent.extend(rows[pos:])
                break
            relay = Relay(
                row["smtp_host"], row["smtp_port"], row["smtp_security"], row["smtp_username"], password,
                bool(row["smtp_allow_cleartext"]),
            )
            if relay in broken:
                b = broken[relay]
                outcomes.append(Outcome(row["id"], row["claim_token"], b.outcome, b.code, b.enhanced, b.error))
                continue
            attempt = Attempt()
            t0 = time.monotonic()
            task = asyncio.ensure_future(deliver(conns, relay, row, attempt, self.dkim))
            await asyncio.wait({task, abort}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                conns.discard(relay)
                if attempt.stage == "data":
                    outcomes.append(
                        Outcome(row["id"], row["claim_token"], "uncertain", error="shutdown during DATA")
                    )
                else:
                    unsent.append(row)
                unsent.extend(rows[pos + 1:])
                break
            out = task.result()
            out.seconds = time.monotonic() - t0
            outcomes.append(out)
            if out.outcome in ("connect", "timeout") and attempt.stage == "connect":
                broken[relay] = out
        return outcomes, unsent

    def relay_password(self, row: dict[str, Any]) -> tuple[str | None, str | None]:
        """The relay password of a claimed row, opened with the sender key (once per ciphertext), or
        the configuration problem that keeps this sender from logging in (it then stops)."""
        if not (row["smtp_username"] and row["smtp_password_set"]):
            return None, None
        sealed = row["smtp_password_sealed"]
        if sealed is None:
            return None, (f"the relay password of sender {row['sender_name']} is still in the previous release's form: "
                          "run `mailroom outbound convert-passwords` once (MAILROOM_ENCRYPTION_KEY)")
        if self.opts.unsealer is None:
            return None, f"sender {row['sender_name']} logs in to its relay: set {KEY_FILE_ENV} (the sender key)"
        password = self.opts.unsealer.open(sealed)
        if password is None:
            return None, (f"{KEY_FILE_ENV} cannot open the relay password of sender {row['sender_name']}: "
                          "it was sealed for another sender key")
        return password, None

    async def _register_claim_row(self, conn: psycopg.AsyncConnection) -> None:
        """Make `conn` read mailroom.claimed_message (finalize_and_claim's column message) as a row."""
        if self.claim_row is None:
            self.claim_row = await CompositeInfo.fetch(conn, "mailroom.claimed_message")
        if self.claim_row is not None:  # None: a schema without it (finalize and claim are then two calls)
            claimrow.register(self.claim_row, conn)  # psycopg's row objects, the text split by bytes.find

    def _keeps_going(self, conn: psycopg.AsyncConnection, outcomes: list[Outcome], unsent: list[dict]) -> bool:
        """Whether the outcomes go with the next claim in one call (finalize_and_claim): a batch fully
        attempted, no recipient refused (recorded first, by record_refused_recipients), not stopping."""
        return bool(
            outcomes and not unsent and self.claim_row is not None and not conn.closed
            and not self.stopping.is_set() and self.fatal is None
            and not any(o.refused for o in outcomes)
        )

    async def report_and_claim(self, conn: psycopg.AsyncConnection, outcomes: list[Outcome],
                               relays: dict[int, str]) -> list[dict[str, Any]] | None:
        """The batch's outcomes and the next claim in one round trip and one commit (finalize_and_claim):
        the rows of the next batch, or None when the call failed (the caller then reports the
        outcomes on their own, which the claim-token fence makes safe whether or not it committed)."""
        try:
            answered = await sqlapi.finalize_and_claim.arows(
                conn,
                limit=self.opts.batch_size,
                worker=self.worker,
                ids=[o.id for o in outcomes],
                claim_tokens=[o.claim_token for o in outcomes],
                outcomes=[o.outcome for o in outcomes],
                smtp_codes=[o.code for o in outcomes],
                enhanced_codes=[o.enhanced for o in outcomes],
                errors=[o.error for o in outcomes],
                lease=timedelta(seconds=self.lease),
            )
        except psycopg.Error as exc:
            log.info("finalize and claim failed (%s); reporting on its own", describe_db_error(exc))
            return None
        self._record(outcomes, [r for r in answered if r.message is None], relays)
        return [r.message._asdict() for r in answered if r.message is not None]  # counted as claimed when sent

    def _record(self, outcomes: list[Outcome], finalized: list[Any], relays: dict[int, str]) -> None:
        """SQL decided what each outcome means (result) and its reply class (the metric label)."""
        results = {r.id: r for r in finalized}
        for o in outcomes:
            r = results.get(o.id)
            result, reply_class = (r.result, r.reply_class) if r is not None else ("stale", "other")
            self.metrics.record(result, reply_class, o.seconds)
            self.outcomes.record(o, result, relays.get(o.id, "?"), r.attempts if r is not None else None,
                                 r.next_retry_at if r is not None else None)
        stale = sum(1 for r in results.values() if r.result == "stale")
        if stale:
            log.info("%d outcome(s) ignored: their claim was reaped and taken over", stale)

    async def report(self, conn: psycopg.AsyncConnection, outcomes: list[Outcome], unsent: list[dict],
                     relays: dict[int, str] | None = None) -> None:
        """Finalize the batch in one call and release what was not attempted (retried on a new
        connection if the slot's connection broke; both calls are idempotent thanks to fencing)."""
        for try_number in range(3):
            target = conn
            try:
                if try_number:
                    await asyncio.sleep(0.5 * try_number)
                    target = await self.aconnect("mailroom-send")
                try:
                    # the outcomes wait out a schema change (while the claim's lease lasts)
                    await self.upgrade.call(lambda t=target: self._report_on(t, outcomes, unsent, relays or {}),
                                            within=max(5.0, self.lease / 2))
                finally:
                    if target is not conn:
                        await target.close()
                return
            except (psycopg.OperationalError, ConnectFailed) as exc:
                log.info("finalize failed (%s); retrying on a new connection", describe_db_error(exc))
        log.error("could not record %d outcome(s); the reaper will return them to the queue", len(outcomes))

    async def _report_on(self, conn: psycopg.AsyncConnection, outcomes: list[Outcome], unsent: list[dict],
                         relays: dict[int, str]) -> None:
        refused = [(o.id, o.claim_token, *r) for o in outcomes for r in o.refused]
        if refused:
            # before finalize, which reads them for a message refused for every recipient: the call is
            # fenced on the claim tokens it still holds (one statement a batch, and only for a batch
            # in which a relay refused recipients)
            try:
                ids, tokens, recipients, codes, enhanced = (list(column) for column in zip(*refused, strict=True))
                await sqlapi.record_refused_recipients.acall(
                    conn, ids=ids, claim_tokens=tokens, recipients=recipients, smtp_codes=codes, enhanced_codes=enhanced
                )
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                log.warning("could not record %d refused recipient(s): %s", len(refused), describe_db_error(exc))
        if outcomes:
            finalized = await sqlapi.finalize_messages.arows(
                conn,
                ids=[o.id for o in outcomes],
                claim_tokens=[o.claim_token for o in outcomes],
                outcomes=[o.outcome for o in outcomes],
                smtp_codes=[o.code for o in outcomes],
                enhanced_codes=[o.enhanced for o in outcomes],
                errors=[o.error for o in outcomes],
            )
            self._record(outcomes, finalized, relays)
        if unsent:
            await sqlapi.release_messages.acall(
                conn, ids=[r["id"] for r in unsent], claim_tokens=[r["claim_token"] for r in unsent]
            )
            self.metrics.released.inc(len(unsent))
