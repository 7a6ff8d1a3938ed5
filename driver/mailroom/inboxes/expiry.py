"""The expiry worker behind `mailroom expire`.

Every --interval it calls mailroom.expire_mailboxes() batch after batch (each batch its own short
transaction) until nothing is due, then mailroom.purge_mailboxes(--purge-after) the same way
(partition maintenance is another worker's: `mailroom maintain --every`). With
--wake-on-due (default) it also wakes when the next inbox is due, like a delay queue:
mailroom.seconds_until_next_expiry() reads the partial index of active inboxes, and the listener
(mailroom.db.listen) re-reads it when NOTIFY mailroom_expiry_schedule says a sooner inbox was
created; without one (a transaction pooler) the --interval sweep still finds every due inbox.

All rules (what is due, retention, locking) live in SQL; rows are claimed with FOR UPDATE SKIP
LOCKED, so any number of workers can run at once without doing the same work twice or waiting on
each other. Between cycles it waits on an Event, so SIGTERM/SIGINT stop it within a second; a
failed cycle is logged and the next one runs; while the database is unreachable it says so once
(and once when it is back) and retries sooner than --interval. About every 10 s (and after each
cycle when one is due) it sends a heartbeat on its connection (mailroom.db.heartbeat: alive,
listening, inboxes expired and purged, its metrics) and reports itself stopped on a clean exit;
`--once` sends none.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg

from mailroom.core.errors import Kind, UserError, describe_db_error
from mailroom.core.log import get_logger
from mailroom.core.metrics import NullMetrics
from mailroom.core.ready import notify_ready
from mailroom.db.contract import SqlFunction
from mailroom.db.worker import Worker
from mailroom.inboxes import sqlapi

log = get_logger("expire")

MIN_WAIT = 0.2


def _expiry_metrics() -> NullMetrics:
    """The expiry worker's metrics (prometheus_client is loaded only by a worker that serves metrics)."""
    from mailroom.inboxes.metrics import ExpiryMetrics

    return ExpiryMetrics()  # type: ignore[return-value]


class ExpiryWorker(Worker):
    """One worker (mailroom.db.worker): cycles of expire-then-purge until stop() is called."""

    def __init__(
        self,
        url: str,
        *,
        interval: float = 60.0,
        purge_after: timedelta | None = timedelta(days=7),
        batch: int | None = None,
        purge_batch: int | None = None,
        wake_on_due: bool = True,
        listen_url: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
    ) -> None:
        metrics = _expiry_metrics() if metrics_port is not None else NullMetrics()
        super().__init__("expiry", log, url=url, metrics=metrics)
        self.listen_url = listen_url
        self.wake_on_due = wake_on_due
        self.interval = interval
        self.purge_after = purge_after
        self.batch = batch
        self.purge_batch = purge_batch
        self.wake = threading.Event()  # set by stop() and by the schedule listener
        self._db = self.lazy("mailroom-expire")
        self.total_expired = 0
        self.total_purged = 0
        self.failed_cycles = 0
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host

    def stop(self) -> None:
        super().stop()
        self.wake.set()

    def _drain(self, fn: SqlFunction, **kwargs: object) -> int:
        """Call a one-batch function until it reports nothing left (each call commits)."""
        conn = self._db.get()
        total = 0
        while True:
            count = fn.value(conn, **kwargs)
            total += count
            if count == 0 or self.stop_event.is_set():
                return total

    def cycle(self) -> tuple[int, int]:
        """One expire + purge pass; returns (expired, purged)."""
        expired = self._drain(sqlapi.expire_mailboxes, batch=self.batch)
        purged = 0
        if self.purge_after is not None and not self.stop_event.is_set():
            purged = self._drain(sqlapi.purge_mailboxes, older_than=self.purge_after, batch=self.purge_batch)
        self.total_expired += expired
        self.total_purged += purged
        self.heartbeat.claimed += expired + purged
        self.metrics.expired.inc(expired)
        self.metrics.purged.inc(purged)
        self.metrics.cycles.inc()
        if expired or purged:
            log.info("expired %d mailbox(es), purged %d", expired, purged)
        return expired, purged

    def run(self, once: bool = False) -> None:
        """Cycle until stopped; an error in one cycle is logged and the next cycle runs."""
        log.info(
            "started (interval %gs%s, purge after %s)",
            self.interval, ", sooner when an inbox is due" if self.wake_on_due else "",
            self.purge_after if self.purge_after is not None else "never",
        )
        if once:
            self.heartbeat.enabled = False  # a one-shot run is no worker to watch
        else:
            self.start_metrics(self.metrics_port, self.metrics_host)
        if self.wake_on_due and not once:
            # notifications may have been missed while it was away: re-read the schedule then
            self.listen(
                self.listen_url, ["mailroom_expiry_schedule"], name="mailroom-expire-listen",
                on_notify=lambda _c, _p: self.wake.set(), on_connect=self.wake.set,
                poll_hint=f"sweeping every {self.interval:g}s",
            ).start()
        try:
            while not self.stop_event.is_set():
                started = time.monotonic()
                retry_at = None
                try:
                    self.cycle()
                    self.resumed()
                    notify_ready()
                except (psycopg.Error, UserError) as exc:
                    kind = self.classify(exc)
                    if not once and kind is Kind.UPGRADING:
                        self.stop_event.wait(self.backoff(exc))  # the cycle rolled back: again soon
                        continue
                    self.failed_cycles += 1
                    self.metrics.failed_cycles.inc()
                    text = describe_db_error(exc) if isinstance(exc, psycopg.Error) else str(exc)
                    self._db.close()
                    if once:
                        raise UserError(f"expiry failed: {text}") from None
                    if kind is Kind.UNAVAILABLE:  # wait for the database, one line (and one when it is back)
                        retry_at = time.monotonic() + self.backoff(exc)
                    else:
                        log.error("cycle failed: %s", text)
                if once:
                    break
                self._sleep(min(started + self.interval, retry_at) if retry_at is not None else started + self.interval)
        finally:
            self.stop_event.set()
            self._db.close()
            self.finish(report=not once)
            log.info("stopped (expired %d, purged %d)", self.total_expired, self.total_purged)

    def _sleep(self, cycle_deadline: float) -> None:
        """Wait on the wake event until the next inbox is due or --interval is up, whichever is first.

        A notification that a sooner inbox was created (or stop()) sets the event: the wait is
        recomputed (or the loop ends). Clearing before reading the schedule loses no wake-up.
        """
        while not self.stop_event.is_set():
            self.wake.clear()
            self.beat_if_due(self._db)
            wait = cycle_deadline - time.monotonic()
            if self.wake_on_due:
                due = self._seconds_until_due()
                if due is not None:
                    wait = min(wait, due)
            beat_in = self.heartbeat.seconds_left()
            if wait <= 0:
                return
            if not self.wake.wait(min(wait, beat_in)) and wait <= beat_in:
                return  # the cycle (or the next inbox) is due; else it was the heartbeat's turn

    def _seconds_until_due(self) -> float | None:
        """Seconds until the next inbox is due (a delay queue over the partial index), floored."""
        try:
            seconds = sqlapi.seconds_until_next_expiry.value(self._db.get())
        except (psycopg.Error, UserError):
            self._db.close()
            return None
        if seconds is None:
            return None
        # The floor keeps a due-but-locked inbox (skipped by SKIP LOCKED) from turning this into a busy loop.
        return max(MIN_WAIT, seconds + 0.001)
