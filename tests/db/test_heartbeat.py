"""A worker's heartbeat and its stop (mailroom.db.heartbeat): what worker_health lists after a stop."""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg

from mailroom import testing
from mailroom.db.heartbeat import Heartbeat


def _waiting_for_lock(conn: psycopg.Connection, application_name: str) -> bool:
    return bool(conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
        (application_name,),
    ).fetchone()[0])


def test_a_first_heartbeat_cut_off_in_flight_is_still_followed_by_the_stop(db_url):
    """A worker stopped while its first heartbeat was on its way (the inbound server cancelled its beat
    task at SIGTERM) never saw that heartbeat commit. It may have: the stop must still be said, or
    worker_health lists a stopped worker as running until it is presumed lost (the state
    test_run_with_a_url_per_worker found in CI)."""
    url = testing.as_login(db_url, "mr_inbound")
    worker = f"hb-test-{time.monotonic_ns()}"

    async def scenario(admin: psycopg.Connection) -> None:
        heartbeat = Heartbeat(worker, "inbound", logging.getLogger("test"))
        conn = await psycopg.AsyncConnection.connect(url, autocommit=True, application_name="hb-in-flight")
        try:
            beat = asyncio.ensure_future(heartbeat.abeat(conn, False))
            deadline = time.monotonic() + 10
            while not _waiting_for_lock(admin, "hb-in-flight") and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert _waiting_for_lock(admin, "hb-in-flight"), "the heartbeat never reached the lock"
            # the heartbeat commits, but the worker stops (its beat task cancelled) before it reads the
            # answer: the event loop is held while the lock is released and the heartbeat commits
            admin.rollback()
            time.sleep(0.5)
            beat.cancel()
            await asyncio.gather(beat, return_exceptions=True)
            assert heartbeat.sent_count == 0  # it never saw its heartbeat commit
            await asyncio.wait_for(heartbeat.astop(url), 20)
        finally:
            await conn.close()

    with psycopg.connect(db_url) as admin:
        admin.execute("LOCK TABLE mailroom.workers IN SHARE ROW EXCLUSIVE MODE")
        asyncio.run(scenario(admin))
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute("SELECT state FROM mailroom.worker_health() WHERE worker = %s", (worker,)).fetchall()
    assert rows == [("stopped",)], rows
