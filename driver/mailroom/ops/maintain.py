"""Partition maintenance (issue 14): mailroom.maintain_partitions(), once or as a worker.

The SQL function decides everything (which partitions to create ahead, which to drop, which rows
to delete in batches) and runs one caller at a time: a concurrent caller gets one row 'skipped'.
`mailroom maintain` runs it once and prints the report; `mailroom maintain --every 10m` is the
worker that runs it at its start and then every period (`mailroom run` starts one); pg_cron can
run it too (docs/retention.md).
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from typing import Optional

import psycopg

from mailroom.core.errors import Kind, UserError, describe_db_error
from mailroom.core.log import get_logger
from mailroom.core.metrics import NullMetrics, WorkerMetrics
from mailroom.core.ready import notify_ready
from mailroom.db.worker import Worker
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


class MaintenanceWorker(Worker):
    """Runs maintain_partitions now and then every `every` seconds until stop(); a failed run is
    logged and the next one runs (safe with many workers: the others are told 'skipped'). On the
    worker skeleton (mailroom.db.worker): it reports in as a worker (kind maintenance), waits out an
    unreachable database (one line, and one when it is back) and reports itself stopped on a clean exit."""

    def __init__(self, url: str, every: float, *, metrics_port: int | None = None,
                 metrics_host: str = "127.0.0.1") -> None:
        super().__init__("maintenance", log, url=url,
                         metrics=_maintenance_metrics() if metrics_port is not None else NullMetrics())
        self.every = every
        self._db = self.lazy("mailroom-maintain")
        self.runs = 0
        self.failed_runs = 0
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host

    def run(self) -> None:
        log.info("started (every %gs)", self.every)
        self.start_metrics(self.metrics_port, self.metrics_host)
        try:
            while not self.stop_event.is_set():
                next_run = time.monotonic() + self.every
                try:
                    rows = maintain(self._db.get())
                    self.runs += 1
                    self.metrics.runs.inc()
                    self.metrics.last_run.set_to_current_time()
                    self.resumed()
                    notify_ready()
                    if rows:
                        log.info("partitions: %s", summary(rows))
                except (psycopg.Error, UserError) as exc:
                    self._db.close()
                    kind = self.classify(exc)
                    if kind in (Kind.UNAVAILABLE, Kind.UPGRADING):  # wait for the database or the schema
                        next_run = time.monotonic() + self.backoff(exc)
                    else:
                        self.failed_runs += 1
                        self.metrics.failed_runs.inc()
                        log.error("maintenance failed: %s",
                                  describe_db_error(exc) if isinstance(exc, psycopg.Error) else exc)
                while not self.stop_event.is_set() and (left := next_run - time.monotonic()) > 0:
                    self.beat_if_due(self._db)
                    self.stop_event.wait(min(left, max(0.2, self.heartbeat.seconds_left())))
        finally:
            self._db.close()
            self.finish()
            log.info("stopped")


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
