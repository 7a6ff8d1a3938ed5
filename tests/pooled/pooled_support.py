"""Helpers of the pooled tests: which URL each driver gets, and PgBouncer facts.

Every driver in tests/pooled gets its URLs from `worker_urls`: the database URL through the
pooler and, for LISTEN, the direct URL. Switching the drivers to least-privilege login roles is
a change of `as_login` only.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from mailroom.testing import PgBouncer

POOLER_SELFTEST_WARNING = "the self-test NOTIFY did not come back (a transaction pooler cannot carry LISTEN"


@dataclass(frozen=True)
class WorkerUrls:
    database: str  # through PgBouncer (transaction mode)
    listen: str  # direct to PostgreSQL


def as_login(url: str, role: str) -> str:
    """The URL a driver of `role` (collector, sender, inbound, app, monitor, admin) connects with."""
    return url


def worker_urls(pooler: PgBouncer, db_url: str, role: str) -> WorkerUrls:
    direct = as_login(db_url, role)
    pooler.fill(direct)  # every server connection open: the driver's transactions rotate over them
    return WorkerUrls(database=pooler.pooled_url(direct), listen=direct)


def server_backends(conn: psycopg.Connection, application_name: str) -> int:
    """Server connections of the test database whose application_name starts with the given one."""
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE %s",
        (application_name + "%",),
    ).fetchone()[0]
