"""Reconnecting: the one backoff between connection attempts, and the one lazily opened connection.

`Backoff` is how long a worker waits before its next attempt to reach the database (the
listener's LISTEN connection, the collector's work connection): 0.1 s, doubled after each failure
up to 5 s, back to 0.1 s once connected. `LazyConnection` is a worker's autocommit connection,
opened on first use and again after it was closed on a failure (the expiry worker, `inbox watch`).
"""

from __future__ import annotations

import psycopg

from mailroom.db.connect import connect

BACKOFF_FIRST = 0.1
BACKOFF_CAP = 5.0


class Backoff:
    """Delays between reconnect attempts: `first`, doubled after each, at most `cap`; reset() when connected."""

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
