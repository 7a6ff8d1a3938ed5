"""Worker heartbeats: every ~10 s a worker calls mailroom.worker_heartbeat on its work connection.

It reports that it is alive, whether its Listener hears NOTIFY, and how many rows (tokens,
messages, inboxes) it claimed since the last one; `mailroom.worker_health()` and
`mailroom outbound status` show the result. A change of the listener's state is reported at
once (a worker that went deaf shows up without waiting for the interval). A heartbeat is never
on the path of a row: the worker asks `due()` between batches and calls
`mailroom.db.sqlapi.worker_heartbeat` with `params()` itself, on its own connection and transaction.
A schema without the function (before migration 0070) or a role without the grant turns
heartbeats off with one warning; the worker carries on.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import psycopg

from mailroom.core.errors import Kind, describe_db_error, kind_of

INTERVAL = 10.0
MAX_CLAIMED = 2**31 - 1  # p_claimed is an integer


def worker_name() -> str:
    """host:pid, the default name of a worker (the host part is what worker_health groups by)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Heartbeat:
    """When the next heartbeat is due and what it reports; see the module docstring."""

    def __init__(self, worker: str, kind: str, log: logging.Logger, interval: float = INTERVAL) -> None:
        self.worker = worker
        self.kind = kind
        self.log = log
        self.interval = interval
        self.next_at = 0.0  # the first one as soon as the worker looks
        self.claimed = 0
        self.enabled = True
        self.sent_count = 0
        self.reported_listening: bool | None = None

    def due(self, listening: bool) -> bool:
        """Time for one: the interval is over, or the listener's state changed since the last one."""
        if not self.enabled:
            return False
        return time.monotonic() >= self.next_at or bool(listening) != self.reported_listening

    def seconds_left(self) -> float:
        """Seconds until the next periodic one (inf when heartbeats are off)."""
        return max(0.0, self.next_at - time.monotonic()) if self.enabled else float("inf")

    def params(self, listening: bool) -> dict[str, object]:
        """The keyword arguments of mailroom.db.sqlapi.worker_heartbeat."""
        return {"worker": self.worker, "kind": self.kind, "listening": bool(listening),
                "claimed": min(self.claimed, MAX_CLAIMED)}

    def sent(self, params: dict[str, object]) -> None:
        """The heartbeat with these params committed."""
        self.reported_listening = bool(params["listening"])
        self.claimed = max(0, self.claimed - int(params["claimed"]))
        self.sent_count += 1
        self.next_at = time.monotonic() + self.interval

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
