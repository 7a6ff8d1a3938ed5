"""One worker skeleton: the life every long-running mailroom process shares (issue 36, item 5).

River builds each of its maintenance services on one `startstop` base; mailroom's workers (the
collector, the sender, the expiry worker, the inbound SMTP server, the maintenance worker) and the
HTTP face's background task are built on this one. A worker subclasses `Worker` (or, like the HTTP
face, holds one) and keeps only its own loop: what it claims, or what it listens for. The skeleton
gives each step of that life one implementation:

1. **connect and learn the vocabulary**: `connect()` / `aconnect()` (mailroom.db.connect: pooler-safe,
   the first connection of a process reads mailroom.error_codes), `lazy()` for a connection opened
   on first use, `await_database()` to wait while the database cannot be reached at start;
2. **heartbeat**: `heartbeat` (mailroom.db.heartbeat), `beat()` / `abeat()` on the worker's own
   connection between batches, `beat_if_due()` on a lazy connection, `abeat_every()` for a server
   with a pool; the metrics (`start_metrics`) whose address the heartbeat reports;
3. **claim or listen**: the worker's own loop; `listen()` makes its Listener (mailroom.db.listen)
   and `listening()` says whether it hears;
4. **classify errors**: `classify(exc)`: Kind.UPGRADING (the schema changes under the call),
   Kind.UNAVAILABLE (the database out of reach, the connection lost), else the error's kind
   (mailroom.core.errors.kind_of);
5. **back off**: `backoff(exc)`: the wait before the next attempt, from UpgradeBackoff or Outage
   (mailroom.core.outage: one line when the wait starts, one when it ends), `resumed()` after a
   success;
6. **stop cleanly**: `stop_on_signals()` / `astop_on_signals()` (SIGTERM, SIGINT call
   `on_signal`, by default `stop()`), then `finish()` / `afinish()`: the listener stopped, the stop
   reported (`worker_stopped`: listed as stopped, not lost), the metrics server closed.

`inbox watch` is a user's client, not a worker: it stays off the skeleton and out of `status`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import psycopg

from mailroom.core.errors import Kind, UpgradeBackoff, UserError, is_upgrade_condition, kind_of
from mailroom.core.metrics import NullMetrics
from mailroom.core.outage import Outage
from mailroom.db.connect import ConnectFailed, connect, connect_async, with_defaults
from mailroom.db.heartbeat import Heartbeat, worker_name
from mailroom.db.listen import Listener
from mailroom.db.reconnect import LazyConnection

T = TypeVar("T")

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_CONNECT_PREFIX = "cannot connect to the database: "


def unavailable(exc: BaseException) -> bool:
    """The database out of reach (wait for it and retry), not a fault of the call: a connection that
    could not be opened for a reason that passes, or one lost or ended under the call."""
    if isinstance(exc, ConnectFailed):
        return exc.kind is Kind.UNAVAILABLE
    if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return kind_of(exc) in (Kind.UNAVAILABLE, Kind.INTERNAL) or not getattr(exc, "sqlstate", None)
    return isinstance(exc, psycopg.Error) and kind_of(exc) is Kind.UNAVAILABLE


def classify(exc: BaseException) -> Kind:
    """What a worker does about `exc`: UPGRADING (wait with UpgradeBackoff and retry, never exit),
    UNAVAILABLE (wait with Outage and retry), or the error's own kind (the worker decides: CONFIG and
    DENIED end it, since no retry fixes them; the rest fail one attempt)."""
    if is_upgrade_condition(exc):
        return Kind.UPGRADING
    if unavailable(exc):
        return Kind.UNAVAILABLE
    if isinstance(exc, ConnectFailed):
        return exc.kind
    return kind_of(exc)


def reason(exc: BaseException | str) -> BaseException | str:
    """What an outage line says: a failed connection without its "cannot connect" prefix."""
    return str(exc).removeprefix(_CONNECT_PREFIX) if isinstance(exc, UserError) else exc


class Worker:
    """The skeleton of one worker process; see the module docstring."""

    def __init__(self, kind: str, log: logging.Logger, *, url: str, metrics: Any = None,
                 name: str | None = None) -> None:
        self.kind = kind  # its row of mailroom.worker_kinds
        self.log = log
        self.url = with_defaults(url)
        self.metrics = metrics if metrics is not None else NullMetrics()
        self.heartbeat = Heartbeat(name or worker_name(), kind, log, metrics=self.metrics)
        # the database unreachable (at start or later): one line when the wait starts, one when it ends
        self.outage = Outage(log, on_change=self.metrics.waiting)
        # the schema changing under a call (docs/upgrading.md): wait and retry, never exit
        self.upgrade = UpgradeBackoff(log)
        self.listener: Listener | None = None
        self.stop_event = threading.Event()

    # -- 1. connect and learn the vocabulary ------------------------------------------------------

    def connect(self, application_name: str, *, autocommit: bool = True) -> psycopg.Connection:
        """A pooler-safe connection (ConnectFailed when there is none); the process's first reads the
        error vocabulary."""
        return connect(self.url, autocommit=autocommit, application_name=application_name)

    async def aconnect(self, application_name: str, *, autocommit: bool = True) -> psycopg.AsyncConnection:
        """connect() for async workers."""
        return await connect_async(self.url, autocommit=autocommit, application_name=application_name)

    def lazy(self, application_name: str) -> LazyConnection:
        """The worker's autocommit connection, opened on first use and again after close()."""
        return LazyConnection(self.url, application_name)

    async def await_database(self, fn: Callable[[], Awaitable[T]], *, stopping: Callable[[], bool],
                             sleep: Callable[[float], Awaitable[object]]) -> T | None:
        """`await fn()` until the database answers (waiting while it is out of reach: one line, and one
        when it is back); None once `stopping()`. Any other error is raised."""
        return await self.outage.call(fn, unavailable, stopping=stopping, sleep=sleep, describe=reason)

    # -- 2. heartbeat -----------------------------------------------------------------------------

    def start_metrics(self, port: int | None, host: str) -> None:
        """Serve /metrics when a port is given; the heartbeat reports where."""
        self.heartbeat.metrics_address = self.metrics.start(port, host, self.log)

    def beat(self, conn: psycopg.Connection) -> None:
        """One heartbeat on the worker's own connection (sync); a lost connection raises."""
        listening = self.listening()
        self.metrics.listening.set(1 if listening else 0)
        self.heartbeat.beat(conn, listening)

    async def abeat(self, conn: psycopg.AsyncConnection) -> None:
        """One heartbeat on an autocommit connection (async); a lost connection raises."""
        listening = self.listening()
        self.metrics.listening.set(1 if listening else 0)
        await self.heartbeat.abeat(conn, listening)

    def beat_if_due(self, db: LazyConnection) -> None:
        """A heartbeat when one is due, on a lazily opened connection; a database out of reach skips it
        (the next in `interval`) and closes the connection. Never raises."""
        listening = self.listening()
        if not self.heartbeat.due(listening):
            return
        try:
            self.beat(db.get())
        except UserError:
            self.heartbeat.skip(listening)  # cannot connect: the worker's next call says so
        except psycopg.Error:
            self.heartbeat.skip(listening)
            db.close()

    async def abeat_every(self, connection: Callable[[], Any], *, stopping: asyncio.Event | None = None,
                          timeout: float | None = None, listening: Callable[[], bool] | None = None) -> None:
        """The heartbeats of a server with a connection pool: one whenever due, on a pooled connection
        (`connection()`: an async context manager giving an autocommit connection; each beat bounded by
        `timeout`), until `stopping` is set or the task is cancelled. A beat that succeeds ends an outage
        at once (the recovery is said without waiting for a client); one that fails is skipped, and
        while the database is out of reach the next look comes within a second. Never raises."""
        hears = listening or self.listening
        while stopping is None or not stopping.is_set():
            # while the database is out of reach, each look is a beat: its success ends the outage
            if self.heartbeat.enabled and (self.heartbeat.due(hears()) or self.outage.waiting):
                try:
                    async with asyncio.timeout(timeout):
                        async with connection() as conn:
                            self.metrics.listening.set(1 if hears() else 0)
                            await self.heartbeat.abeat(conn, hears())
                    self.outage.resumed()
                except Exception:  # noqa: BLE001 - the pool's timeout, a lost connection: the server goes on
                    self.heartbeat.skip(hears())
            wait = 1.0 if self.outage.waiting else max(0.2, min(self.heartbeat.seconds_left(), self.heartbeat.interval))
            if stopping is None:
                await asyncio.sleep(wait)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), wait)

    # -- 3. listen --------------------------------------------------------------------------------

    def listen(self, url: str | None, channels: Sequence[str], *, name: str, poll_hint: str,
               on_notify: Callable[[str, str], None], on_connect: Callable[[], None],
               check_interval: float = 60.0) -> Listener:
        """The worker's Listener (not started: `.start()` once the worker may hear); `listening()`
        reads it and the heartbeat reports it."""
        self.listener = Listener(with_defaults(url) if url else None, channels, name=name, log=self.log,
                                 on_notify=on_notify, on_connect=on_connect, check_interval=check_interval,
                                 poll_hint=poll_hint)
        return self.listener

    def listening(self) -> bool:
        """Whether the worker's Listener hears NOTIFY now (False without one: it polls)."""
        return self.listener is not None and self.listener.listening

    # -- 4. classify errors, 5. back off ----------------------------------------------------------

    classify = staticmethod(classify)
    unavailable = staticmethod(unavailable)

    def backoff(self, exc: BaseException) -> float:
        """The wait before the next attempt after `exc`, which classify() says is UPGRADING or
        UNAVAILABLE (the first of a wait is logged, once)."""
        if is_upgrade_condition(exc):
            return self.upgrade.delay(exc)
        return self.outage.delay(reason(exc))

    def resumed(self) -> None:
        """A call succeeded: a wait that was going on ends (one line each)."""
        self.upgrade.resumed()
        self.outage.resumed()

    # -- 6. stop cleanly --------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to finish (thread-safe; async workers override it)."""
        self.stop_event.set()

    def on_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT arrived: stop (the collector's second signal gives up its batch)."""
        del signum
        self.stop()

    def stop_on_signals(self) -> None:
        """SIGTERM and SIGINT call on_signal (a sync worker, in the main thread)."""
        for sig in SIGNALS:
            signal.signal(sig, lambda signum, _frame: self.on_signal(signum))

    def astop_on_signals(self) -> None:
        """SIGTERM and SIGINT call on_signal (an async worker, on its running loop)."""
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self.on_signal, sig)

    def finish(self, *, report: bool = True) -> None:
        """The end of run(): the listener stopped, the stop reported (unless `report` is False, or the
        database is out of reach: nothing would hear it), the metrics server closed."""
        if self.listener is not None:
            self.listener.stop()
        if report and not self.outage.waiting:
            self.heartbeat.stop(self.url)  # listed as stopped, not lost
        self.metrics.shutdown()

    async def afinish(self, *, report: bool = True) -> None:
        """finish() for async workers: the stop is reported whatever the outage says (a server's
        requests may have found the database again without a call of the worker's own)."""
        if self.listener is not None:
            self.listener.stop()
        if report:
            await self.heartbeat.astop(self.url)
        self.metrics.shutdown()
