"""The collector survives pg_terminate_backend and a full server stop / start on a cluster of its own."""

from __future__ import annotations

import psycopg
from collector_support import Collector, assert_exactly_once, create_accounts, wait_committed

from mailroom import testing
from mailroom.db import cluster as embedded
from mailroom.db.migrate import migrate


def test_terminate_then_server_restart_zero_lost_zero_duplicates(private_cluster):
    url = private_cluster.url()
    migrate(url)
    testing.ensure_test_logins(url)  # the collector logs in as mr_collector
    bindir, run_as = embedded.find_bindir(), embedded.RunAs.detect()
    c = Collector(url, env={"MAILROOM_BATCH_LIMIT": "4", "MAILROOM_BATCH_TIMEOUT": "100ms"})
    try:
        c.wait_stderr("waiting for notifications")
        logins: list[str] = []
        with psycopg.connect(url, autocommit=True) as conn:
            logins += create_accounts(conn, "a", 6)
            records = c.records(6)
            wait_committed(conn, logins)  # a kill between a write and its COMMIT rewrites the batch
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE application_name = 'mailroom-collect'")
            logins += create_accounts(conn, "b", 5)
            records += c.records(len(logins) - len(records), timeout=15)
            wait_committed(conn, logins)  # the stop below must not fall between a batch's write and its COMMIT
        # back on both connections (a substring seen before the kill would not wait for anything)
        c.wait_stderr("] connected;", count=2)
        c.wait_stderr("listening again")

        private_cluster.stop(bindir, run_as)  # fast shutdown: every backend gets terminated
        # the worker's own outage line, not the LISTEN thread's reason, which may quote the same words
        c.wait_stderr("WARN: database unreachable (", timeout=15)  # it says so once and keeps trying
        private_cluster.start(bindir, run_as, fast=True)
        with psycopg.connect(url, autocommit=True) as conn:
            logins += create_accounts(conn, "c", 9)  # maybe before, maybe after it is back: both must work
        records += c.records(len(logins) - len(records), timeout=30)
        c.assert_quiet(0.5)
        assert_exactly_once(records, logins)
        c.wait_stderr("recovered: database unreachable no more", timeout=15)
        assert c.stderr_text().count("database unreachable (") == 1, c.stderr_text()  # once, not per retry
        assert c.proc.poll() is None
        assert c.stop() == 0
    finally:
        c.kill()
        print(c.stderr_text())  # shown by pytest when the test fails
