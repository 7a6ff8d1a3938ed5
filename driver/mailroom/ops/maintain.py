"""Partition maintenance (issue 14): mailroom.maintain_partitions(), once or as a worker.

The SQL function decides everything (which partitions to create ahead, which to drop, which rows
to delete in batches) and runs one caller at a time: a concurrent caller gets one row 'skipped'.
`mailroom maintain` runs it once and prints the report; `mailroom maintain --every 10m` is the
worker that runs it at its start and then every period (`mailroom run` starts one); pg_cron can
run it too (docs/retention.md).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Optional

import psycopg

from mailroom.core.errors import UserError, describe_db_error
from mailroom.core.log import get_logger
from mailroom.db.reconnect import LazyConnection
from mailroom.ops import sqlapi

Row = tuple[str, Optional[str], Optional[str], int]

log = get_logger("maintain")


def maintain(conn: psycopg.Connection) -> list[Row]:
    """Run maintain_partitions on an autocommit `conn` (its own transaction); its report rows."""
    return sqlapi.maintain_partitions.rows(conn)


def summary(rows: list[Row]) -> str:
    """'created 3, dropped 1 (120 rows)': the report in one line for a log (names no partition)."""
    if not rows:
        return "nothing to do"
    counts = Counter(r[0] for r in rows)
    dropped = sum(r[3] for r in rows if r[0] == "dropped")
    parts = [f"{action} {n}" + (f" ({dropped} rows)" if action == "dropped" else "") for action, n in counts.items()]
    return ", ".join(parts)


class MaintenanceWorker:
    """Runs maintain_partitions now and then every `every` seconds until stop(); a failed run is
    logged and the next one runs (safe with many workers: the others are told 'skipped')."""

    def __init__(self, url: str, every: float) -> None:
        self.every = every
        self.stop_event = threading.Event()
        self._db = LazyConnection(url, "mailroom-maintain")
        self.runs = 0
        self.failed_runs = 0

    def stop(self) -> None:
        self.stop_event.set()

    def run(self) -> None:
        log.info("started (every %gs)", self.every)
        try:
            while not self.stop_event.is_set():
                try:
                    rows = maintain(self._db.get())
                    self.runs += 1
                    if rows:
                        log.info("partitions: %s", summary(rows))
                except (psycopg.Error, UserError) as exc:
                    self.failed_runs += 1
                    log.error("maintenance failed: %s",
                              describe_db_error(exc) if isinstance(exc, psycopg.Error) else exc)
                    self._db.close()
                self.stop_event.wait(self.every)
        finally:
            self._db.close()
            log.info("stopped")
