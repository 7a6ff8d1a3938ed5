"""Reconnecting: the one backoff between connection attempts, and the one lazily opened connection.

`Backoff` (mailroom.core.outage, which also logs a wait once) is how long a worker waits before its
next attempt to reach the database (the listener's LISTEN connection, a worker's connection): 0.1 s,
doubled after each failure up to 5 s, back to 0.1 s once connected. `LazyConnection` is a worker's autocommit connection,
opened on first use and again after it was closed on a failure (the expiry worker, `inbox watch`).
"""

from __future__ import annotations

import psycopg

from mailroom.db.connect import connect


class LazyConnection:
    """One autocommit connection, opened by get() when there is none (or it was closed).

    get() raises UserError when the database cannot be reached; close() after a failed call, so the
    next get() reconnects."""

    def __init__(self, url: str, application_name: str) -> None:
        self.url = url
        self.application_name = application_name
        self._conn: psycopg.Connection | None = None

    def get(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.url, application_name=self.application_name)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
