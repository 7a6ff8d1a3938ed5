"""Waiting out an outage: one log line when a worker starts waiting, reminders at most every few
minutes, one line when it recovers; the delay before each retry.

Every worker that meets a condition it cannot fix but that will pass (the database unreachable:
stopped, restarting, a network cut; the schema changing under it: `db migrate`) waits and retries
with one Outage per condition, shared by its tasks and threads:

    outage = Outage(log, "database unreachable")
    while True:
        try:
            rows = claim()
        except psycopg.OperationalError as exc:
            time.sleep(outage.delay(exc))   # logs once, then a reminder every REMIND seconds
            continue
        outage.resumed()                    # logs "… recovered after 12 retries in 8.1s" once
        break

`delay` doubles from FIRST up to CAP seconds; `resumed` resets. A worker started while the
database is down does the same: it says so once, waits, and carries on when it can connect.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from mailroom.core.errors import describe_db_error

T = TypeVar("T")


BACKOFF_FIRST = 0.1
# At most this long between two attempts, however long the outage: a server that comes back is
# found within it (issue 34: every worker and server serves again within seconds). An attempt
# against a server that is down is one refused connection: cheap at this rate.
BACKOFF_CAP = 2.0


class Backoff:
    """Delays between attempts: `first`, doubled after each, at most `cap`; reset() after a success."""

    def __init__(self, first: float = BACKOFF_FIRST, cap: float = BACKOFF_CAP) -> None:
        self.first = first
        self.cap = cap
        self._delay = first

    def next(self) -> float:
        """The delay before the next attempt (and the one after it doubles)."""
        delay = self._delay
        self._delay = min(self._delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self._delay = self.first


class Outage:
    """The waiting of one worker for one condition; see the module docstring."""

    FIRST = 0.2
    CAP = BACKOFF_CAP
    REMIND = 300.0

    def __init__(self, log: logging.Logger, what: str = "database unreachable",
                 on_change: Callable[[bool], None] | None = None) -> None:
        self.log = log
        self.what = what
        self.on_change = on_change  # called with True when the wait starts, False when it ends (metrics)
        self.retries = 0
        self.since = 0.0
        self.reminded = 0.0
        self._backoff = Backoff(self.FIRST, self.CAP)
        self._lock = threading.Lock()

    @property
    def waiting(self) -> bool:
        return self.retries > 0

    def delay(self, exc: BaseException | str) -> float:
        """Note a failed attempt (logs when the wait starts and then every REMIND seconds); the wait before the next."""
        reason = exc if isinstance(exc, str) else describe_db_error(exc)
        reason = reason.removeprefix(f"{self.what}: ")
        with self._lock:
            now = time.monotonic()
            if not self.retries:
                self.since = self.reminded = now
                self.log.warning("WARN: %s (%s): waiting and retrying", self.what, reason)
                if self.on_change is not None:
                    self.on_change(True)
            elif now - self.reminded >= self.REMIND:
                self.reminded = now
                self.log.warning("WARN: %s for %.0fs now (%s): still retrying", self.what, now - self.since, reason)
            self.retries += 1
            return self._backoff.next()

    def resumed(self) -> None:
        """A call succeeded: logs the recovery once after a wait, and resets."""
        with self._lock:
            if self.retries:
                self.log.info("recovered: %s no more, after %d retr%s in %.1fs", self.what, self.retries,
                              "y" if self.retries == 1 else "ies", time.monotonic() - self.since)
                if self.on_change is not None:
                    self.on_change(False)
            self.retries = 0
            self._backoff.reset()

    async def call(self, fn: Callable[[], Awaitable[T]], retry_on: Callable[[BaseException], bool], *,
                   stopping: Callable[[], bool] | None = None,
                   sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
                   describe: Callable[[BaseException], BaseException | str] = lambda exc: exc) -> T | None:
        """`await fn()` until it does not fail with an error `retry_on` accepts; None once `stopping()`
        (checked after each wait; `sleep` may return early when the worker stops). `describe` gives
        what the outage line says of an error (the error itself by default)."""
        while True:
            try:
                result = await fn()
            except Exception as exc:
                if not retry_on(exc):
                    raise
                await sleep(self.delay(describe(exc)))
                if stopping is not None and stopping():
                    return None
                continue
            self.resumed()
            return result


class RateLimited:
    """A warning said at most once every `every` seconds, with how many times it happened meanwhile."""

    def __init__(self, log: logging.Logger, every: float = 60.0) -> None:
        self.log = log
        self.every = every
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}

    def warning(self, key: str, message: str, *args: object) -> None:
        now = time.monotonic()
        self._count[key] = self._count.get(key, 0) + 1
        last = self._last.get(key)
        if last is not None and now - last < self.every:
            return
        count = self._count.pop(key)
        self._last[key] = now
        suffix = f" ({count} times in {self.every:.0f}s)" if last is not None and count > 1 else ""
        self.log.warning("WARN: " + message + suffix, *args)
