"""Partition maintenance (issue 14): mailroom.maintain_partitions(), once or as a worker.

The SQL function decides everything (which partitions to create ahead, which to drop, which rows
to delete in batches) and runs one caller at a time: a concurrent caller gets one row 'skipped'.
`mailroom maintain` runs it once and prints the report; `mailroom maintain --every 10m` is the
worker that runs it at its start and then every period (`mailroom run` starts one); pg_cron can
run it too (docs/retention.md).
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from typing import Optional

import psycopg

from mailroom.core.errors import Kind, UserError, describe_db_error, kind_of
from mailroom.core.log import get_logger
from mailroom.core.metrics import NullMetrics, WorkerMetrics
from mailroom.core.outage import Outage
from mailroom.core.ready import notify_ready
from mailroom.db import heartbeat
from mailroom.db.connect import ConnectFailed
from mailroom.db.reconnect import LazyConnection
from mailroom.ops import sqlapi

Row = tuple[str, Optional[str], Optional[str], int]

log = get_logger("maintain")


def maintain(conn: psycopg.Connection) -> list[Row]:
    """Run maintain_partitions on an autocommit `conn` (its own transaction); its report rows. Then
    rebuild search vectors of an older definition (issue 35), batch by batch, for at most 10 s."""
    rows = sqlapi.maintain_partitions.rows(conn)
    rebuilt, until = 0, time.monotonic() + 10
    while time.monotonic() < until:  # each batch its own transaction; walked 0: the walk is at the end
        walked, done = sqlapi.reindex_messages.row(conn, batch=1000)
        rebuilt += done
        if not walked:
            break
    if rebuilt:
        log.info("search vectors rebuilt: %d", rebuilt)
    return rows


def summary(rows: list[Row]) -> str:
    """'created 3, dropped 1 (120 rows)': the report in one line for a log (names no partition)."""
    if not rows:
        return "nothing to do"
    counts = Tally(r[0] for r in rows)
    dropped = sum(r[3] for r in rows if r[0] == "dropped")
    parts = [f"{action} {n}" + (f" ({dropped} rows)" if action == "dropped" else "") for action, n in counts.items()]
    return ", ".join(parts)


class MaintenanceWorker:
    """Runs maintain_partitions now and then every `every` seconds until stop(); a failed run is
    logged and the next one runs (safe with many workers: the others are told 'skipped'). It reports
    in as a worker (kind maintenance), waits out an unreachable database (one line, and one when it
    is back) and reports itself stopped on a clean exit."""

    def __init__(self, url: str, every: float, *, metrics_port: int | None = None,
                 metrics_host: str = "127.0.0.1") -> None:
        self.url = url
        self.every = every
        self.stop_event = threading.Event()
        self._db = LazyConnection(url, "mailroom-maintain")
        self.runs = 0
        self.failed_runs = 0
        self.metrics = _maintenance_metrics() if metrics_port is not None else NullMetrics()
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.heartbeat = heartbeat.Heartbeat(heartbeat.worker_name(), "maintenance", log, metrics=self.metrics)
        self.outage = Outage(log, on_change=self.metrics.waiting)

    def stop(self) -> None:
        self.stop_event.set()

    def _beat(self) -> None:
        if not self.heartbeat.due(False):
            return
        try:
            self.heartbeat.beat(self._db.get(), False)
        except (psycopg.Error, UserError):
            self.heartbeat.skip(False)
            self._db.close()

    def run(self) -> None:
        log.info("started (every %gs)", self.every)
        self.heartbeat.metrics_address = self.metrics.start(self.metrics_port, self.metrics_host, log)
        try:
            while not self.stop_event.is_set():
                next_run = time.monotonic() + self.every
                try:
                    rows = maintain(self._db.get())
                    self.runs += 1
                    self.metrics.runs.inc()
                    self.metrics.last_run.set_to_current_time()
                    self.outage.resumed()
                    notify_ready()
                    if rows:
                        log.info("partitions: %s", summary(rows))
                except (psycopg.Error, UserError) as exc:
                    self._db.close()
                    if _unreachable(exc):
                        next_run = time.monotonic() + self.outage.delay(
                            str(exc).removeprefix("cannot connect to the database: ") if isinstance(exc, UserError)
                            else exc)
                    else:
                        self.failed_runs += 1
                        self.metrics.failed_runs.inc()
                        log.error("maintenance failed: %s",
                                  describe_db_error(exc) if isinstance(exc, psycopg.Error) else exc)
                while not self.stop_event.is_set() and (left := next_run - time.monotonic()) > 0:
                    self._beat()
                    self.stop_event.wait(min(left, max(0.2, self.heartbeat.seconds_left())))
        finally:
            self._db.close()
            if not self.outage.waiting:
                self.heartbeat.stop(self.url)
            self.metrics.shutdown()
            log.info("stopped")


def _unreachable(exc: BaseException) -> bool:
    """The database out of reach (wait for it), not a failure of maintenance."""
    if isinstance(exc, ConnectFailed):
        return exc.kind is Kind.UNAVAILABLE
    return isinstance(exc, psycopg.Error) and kind_of(exc) is Kind.UNAVAILABLE


def _maintenance_metrics() -> WorkerMetrics:
    """The maintenance worker's metrics, with the standard gauges of every worker (prometheus_client is
    loaded only by a worker that serves metrics)."""
    from prometheus_client import Counter, Gauge

    metrics = WorkerMetrics("maintenance")
    r = metrics.registry
    metrics.runs = Counter("mailroom_maintenance_runs", "maintain_partitions runs completed.", registry=r)  # type: ignore[attr-defined]
    metrics.failed_runs = Counter("mailroom_maintenance_failed_runs",  # type: ignore[attr-defined]
                                  "maintain_partitions runs that failed.", registry=r)
    metrics.last_run = Gauge("mailroom_maintenance_last_run_timestamp_seconds",  # type: ignore[attr-defined]
                             "Unix time of the last completed run.", registry=r)
    return metrics
