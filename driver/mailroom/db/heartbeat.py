"""Worker heartbeats: every ~10 s a worker calls mailroom.worker_heartbeat on its work connection.

Every long-running command reports in (collector, sender, inbound SMTP server, expiry, maintenance,
the HTTP face: mailroom.worker_kinds). A heartbeat says the worker is alive, whether its Listener hears NOTIFY, how
many rows (tokens, messages, inboxes) it claimed since the last one, where its Prometheus metrics
are and what it serves; `mailroom status` and `mailroom.worker_health()` show the result. A change of
the listener's state is reported at once (a worker that went deaf shows up without waiting for the
interval), and so are rows claimed, within a second (the counts are current when shown). On a clean
exit the worker calls mailroom.worker_stopped (`stop`/`astop`): it is then listed as stopped, not as
a worker that went silent (lost). A heartbeat is never on the path of a row: the worker asks `due()`
between batches and beats on its own connection and transaction. A schema without the function or a
role without the grant turns heartbeats off with one warning; the worker carries on.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import psycopg

from mailroom.core.errors import Kind, describe_db_error, kind_of
from mailroom.db import sqlapi
from mailroom.db.connect import connection_kwargs

INTERVAL = 10.0
CLAIMED_WITHIN = 1.0  # rows claimed are reported within this many seconds
MAX_CLAIMED = 2**31 - 1  # p_claimed is an integer
SERVES_ENV = "MAILROOM_SERVES"  # what a server process serves (`http serve` sets it for its worker processes)


def worker_name() -> str:
    """host:pid, the default name of a worker (the host part is what worker_health groups by)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat:
    """When the next heartbeat is due and what it reports; see the module docstring."""

    def __init__(self, worker: str, kind: str, log: logging.Logger, interval: float = INTERVAL, *,
                 metrics: object | None = None) -> None:
        self.worker = worker
        self.kind = kind
        self.log = log
        self.interval = interval
        self.next_at = 0.0  # the first one as soon as the worker looks
        self.sent_at = 0.0
        self.claimed = 0
        self.enabled = True
        self.sent_count = 0
        # a heartbeat whose outcome was never seen (cancelled in flight, its connection lost): it may
        # have committed, so the stop must still be said
        self.uncertain = False
        self.reported_listening: bool | None = None
        self.metrics_address: str | None = None  # host:port of its /metrics
        self.serves: str | None = None  # e.g. "smtp 127.0.0.1:2525"
        self.metrics = metrics  # mailroom.core.metrics.WorkerMetrics: heartbeats counted

    def due(self, listening: bool) -> bool:
        """Time for one: the interval is over, the listener's state changed since the last one, or rows
        were claimed more than CLAIMED_WITHIN seconds after the last one."""
        if not self.enabled:
            return False
        now = time.monotonic()
        return (now >= self.next_at or bool(listening) != self.reported_listening
                or (self.claimed > 0 and now - self.sent_at >= CLAIMED_WITHIN))

    def seconds_left(self) -> float:
        """Seconds until the next one is due (inf when heartbeats are off)."""
        if not self.enabled:
            return float("inf")
        now = time.monotonic()
        left = self.next_at - now
        if self.claimed > 0:
            left = min(left, self.sent_at + CLAIMED_WITHIN - now)
        return max(0.0, left)

    def params(self, listening: bool) -> dict[str, object]:
        """The keyword arguments of mailroom.db.sqlapi.worker_heartbeat."""
        return {"worker": self.worker, "kind": self.kind, "listening": bool(listening),
                "claimed": min(self.claimed, MAX_CLAIMED), "metrics_address": self.metrics_address,
                "serves": self.serves}

    def sent(self, params: dict[str, object]) -> None:
        """The heartbeat with these params committed."""
        self.reported_listening = bool(params["listening"])
        self.claimed = max(0, self.claimed - int(params["claimed"]))
        self.sent_count += 1
        self.uncertain = False
        self.sent_at = time.monotonic()
        self.next_at = self.sent_at + self.interval
        if self.metrics is not None:
            self.metrics.heartbeats.inc()  # type: ignore[attr-defined]

    def skip(self, listening: bool) -> None:
        """No heartbeat this time (the connection is down): the next one in `interval`."""
        self.reported_listening = bool(listening)
        self.next_at = time.monotonic() + self.interval

    def failed(self, exc: psycopg.Error, listening: bool) -> None:
        """A heartbeat failed for another reason than the connection: off, or try again later."""
        self.skip(listening)
        if kind_of(exc) in (Kind.USAGE, Kind.CONFIG, Kind.DENIED):  # not installed, no grant: no retry helps
            self.enabled = False
            self.log.warning("WARN: heartbeats off (%s): mailroom.worker_health() will not list this worker",
                             describe_db_error(exc))
        else:
            self.log.info("heartbeat failed: %s", describe_db_error(exc))

    # -- calls ---------------------------------------------------------------------------------
    # beat(): an autocommit connection, or a transaction of its own the caller commits. A lost
    # connection raises (the caller reconnects); anything else turns heartbeats off or is retried later.

    def beat(self, conn: psycopg.Connection, listening: bool) -> None:
        """One heartbeat on `conn` (sync)."""
        params = self.params(listening)
        self.uncertain = True
        try:
            sqlapi.worker_heartbeat.call(conn, **params)
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            if conn.closed or conn.broken:
                raise
            self.uncertain = False
            if not conn.autocommit:
                conn.rollback()
            self.failed(exc, listening)
            return
        if not conn.autocommit:
            conn.commit()
        self.sent(params)

    async def abeat(self, conn: psycopg.AsyncConnection, listening: bool) -> None:
        """One heartbeat on an autocommit `conn` (async)."""
        params = self.params(listening)
        self.uncertain = True
        try:
            await sqlapi.worker_heartbeat.acall(conn, **params)
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            if conn.closed or conn.broken:
                raise
            self.uncertain = False
            self.failed(exc, listening)
            return
        self.sent(params)

    def said_anything(self) -> bool:
        """A heartbeat committed, or may have (cancelled or cut off before its answer came)."""
        return self.enabled and (self.sent_count > 0 or self.uncertain)

    def stop(self, url: str) -> None:
        """On a clean exit: mailroom.worker_stopped on a short connection of its own (a worker whose
        own connection is gone still says so); failures are logged, never raised. A worker that never
        reported in has nothing to say; one whose first heartbeat was in flight may have."""
        if not self.said_anything():
            return
        try:
            with psycopg.connect(url, **connection_kwargs(application_name="mailroom-stopping", connect_timeout=5)) as conn:
                sqlapi.worker_stopped.call(conn, worker=self.worker, claimed=min(self.claimed, MAX_CLAIMED))
        except psycopg.Error as exc:
            self.log.info("could not report the stop: %s", describe_db_error(exc))

    async def astop(self, url: str) -> None:
        """stop() for async workers."""
        if not self.said_anything():
            return
        try:
            async with await psycopg.AsyncConnection.connect(
                url, **connection_kwargs(application_name="mailroom-stopping", connect_timeout=5)
            ) as conn:
                await sqlapi.worker_stopped.acall(conn, worker=self.worker, claimed=min(self.claimed, MAX_CLAIMED))
        except psycopg.Error as exc:
            self.log.info("could not report the stop: %s", describe_db_error(exc))

