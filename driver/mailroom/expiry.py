"""`mailroom expire`: the expiry worker.

Every --interval it calls mailroom.expire_mailboxes() batch after batch (each batch its own short
transaction) until nothing is due, then mailroom.purge_mailboxes(--purge-after) the same way. With
--wake-on-due (default) it also wakes when the next inbox is due, like a delay queue:
mailroom.seconds_until_next_expiry() reads the partial index of active inboxes, and a listener
thread re-reads it when NOTIFY mailroom_expiry_schedule says a sooner inbox was created.

All rules (what is due, retention, locking) live in SQL; rows are claimed with FOR UPDATE SKIP
LOCKED, so any number of workers can run at once without doing the same work twice or waiting on
each other. Between cycles it waits on an Event, so SIGTERM/SIGINT stop it within a second; a
failed cycle is logged and the next one runs.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from datetime import timedelta
from typing import Annotated, Optional

import psycopg
import typer

from mailroom.config import DatabaseUrlOption, resolve_database_url
from mailroom.db import connect
from mailroom.errors import ConfigError, UserError, describe_db_error
from mailroom.log import get_logger

log = get_logger("expire")

MIN_WAIT = 0.2
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration(flag: str, text: str) -> timedelta:
    """'60s', '5m', '7d', '1.5h', '90' (seconds) → timedelta; ConfigError (exit 2) when bad."""
    match = _DURATION.match(text or "")
    if not match:
        raise ConfigError(f"{flag} must be a duration like 60s, 5m, 2h or 7d, got {text!r}")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])


class ExpiryWorker:
    """One worker: cycles of expire-then-purge until stop() is called."""

    def __init__(
        self,
        url: str,
        *,
        interval: float = 60.0,
        purge_after: timedelta | None = timedelta(days=7),
        batch: int | None = None,
        purge_batch: int | None = None,
        wake_on_due: bool = True,
    ) -> None:
        self.url = url
        self.wake_on_due = wake_on_due
        self.interval = interval
        self.purge_after = purge_after
        self.batch = batch
        self.purge_batch = purge_batch
        self.stop_event = threading.Event()
        self.wake = threading.Event()  # set by stop() and by the schedule listener
        self._conn: psycopg.Connection | None = None
        self.total_expired = 0
        self.total_purged = 0
        self.failed_cycles = 0

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()

    def _connection(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.url, application_name="mailroom-expire")
        return self._conn

    def _drain(self, query: str, params: tuple) -> int:
        """Call a one-batch function until it reports nothing left (each call commits)."""
        conn = self._connection()
        total = 0
        while True:
            count = conn.execute(query, params).fetchone()[0]
            total += count
            if count == 0 or self.stop_event.is_set():
                return total

    def cycle(self) -> tuple[int, int]:
        """One expire + purge pass; returns (expired, purged)."""
        expired = self._drain("SELECT mailroom.expire_mailboxes(%s)", (self.batch,))
        purged = 0
        if self.purge_after is not None and not self.stop_event.is_set():
            purged = self._drain("SELECT mailroom.purge_mailboxes(%s, %s)", (self.purge_after, self.purge_batch))
        self.total_expired += expired
        self.total_purged += purged
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
        listener = None
        if self.wake_on_due and not once:
            listener = threading.Thread(target=self._listen, name="expiry-schedule", daemon=True)
            listener.start()
        try:
            while not self.stop_event.is_set():
                started = time.monotonic()
                try:
                    self.cycle()
                except (psycopg.Error, UserError) as exc:
                    self.failed_cycles += 1
                    text = describe_db_error(exc) if isinstance(exc, psycopg.Error) else str(exc)
                    log.error("cycle failed: %s", text)
                    self._close()
                    if once:
                        raise UserError(f"expiry failed: {text}") from None
                if once:
                    break
                self._sleep(started + self.interval)
        finally:
            self.stop_event.set()
            self._close()
            if listener is not None:
                listener.join(timeout=2)
            log.info("stopped (expired %d, purged %d)", self.total_expired, self.total_purged)

    def _sleep(self, cycle_deadline: float) -> None:
        """Wait on the wake event until the next inbox is due or --interval is up, whichever is first.

        A notification that a sooner inbox was created (or stop()) sets the event: the wait is
        recomputed (or the loop ends). Clearing before reading the schedule loses no wake-up.
        """
        while not self.stop_event.is_set():
            self.wake.clear()
            wait = cycle_deadline - time.monotonic()
            if self.wake_on_due:
                due = self._seconds_until_due()
                if due is not None:
                    wait = min(wait, due)
            if wait <= 0 or not self.wake.wait(wait):
                return

    def _seconds_until_due(self) -> float | None:
        """Seconds until the next inbox is due (a delay queue over the partial index), floored."""
        try:
            seconds = self._connection().execute("SELECT mailroom.seconds_until_next_expiry()").fetchone()[0]
        except (psycopg.Error, UserError):
            self._close()
            return None
        if seconds is None:
            return None
        # The floor keeps a due-but-locked inbox (skipped by SKIP LOCKED) from turning this into a busy loop.
        return max(MIN_WAIT, seconds + 0.001)

    def _listen(self) -> None:
        """Thread: LISTEN mailroom_expiry_schedule and set the wake event on each notification."""
        failing = False
        while not self.stop_event.is_set():
            try:
                with connect(self.url, application_name="mailroom-expire-listen") as conn:
                    conn.execute("LISTEN mailroom_expiry_schedule")
                    if failing:
                        log.info("schedule listener reconnected")
                        failing = False
                    self.wake.set()  # notifications may have been missed meanwhile: re-read the schedule
                    while not self.stop_event.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self.wake.set()
            except (psycopg.Error, UserError) as exc:
                if not failing:
                    text = describe_db_error(exc) if isinstance(exc, psycopg.Error) else str(exc)
                    log.warning("schedule listener: %s (falling back to --interval)", text)
                    failing = True
                self.stop_event.wait(min(self.interval, 5.0))

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


def register(app: typer.Typer) -> None:
    """Add `mailroom expire` to the root CLI."""

    @app.command("expire")
    def expire_cmd(
        database_url: DatabaseUrlOption = None,
        interval: Annotated[str, typer.Option(help="Time between cycles (60s, 5m, ...).")] = "60s",
        purge_after: Annotated[
            str, typer.Option(help="Hard-delete inboxes inactive for longer than this (7d; 'never' to keep).")
        ] = "7d",
        batch: Annotated[
            Optional[int], typer.Option(help="Mailboxes expired per transaction (default: setting inbox.expire_batch).")
        ] = None,
        purge_batch: Annotated[
            Optional[int], typer.Option(help="Mailboxes purged per transaction (default: setting inbox.purge_batch).")
        ] = None,
        once: Annotated[bool, typer.Option("--once", help="Run one cycle, print counts, exit.")] = False,
        wake_on_due: Annotated[
            bool, typer.Option("--wake-on-due/--no-wake-on-due",
                               help="Wake when the next inbox is due if that is sooner than --interval.")
        ] = True,
    ) -> None:
        """Expire due inboxes and purge old inactive ones, every --interval (safe with many workers)."""
        every = parse_duration("--interval", interval).total_seconds()
        if every <= 0:
            raise ConfigError("--interval must be positive")
        retention = None if purge_after.strip().lower() in ("never", "off", "none") else parse_duration(
            "--purge-after", purge_after
        )
        for name, value in (("--batch", batch), ("--purge-batch", purge_batch)):
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}")
        url = resolve_database_url(database_url)
        worker = ExpiryWorker(url, interval=every, purge_after=retention, batch=batch, purge_batch=purge_batch,
                              wake_on_due=wake_on_due)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.stop())
        worker.run(once=once)
        if once:
            print(f"expired={worker.total_expired} purged={worker.total_purged}")
