"""The sender survives a full PostgreSQL stop/start mid-flow: nothing lost, duplicates only flagged."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time

import psycopg
from outbound_support import SEND_FLAGS, add_sender, counts, enqueue_many, wait_for

from mailroom import testing
from mailroom.db import cluster as embedded
from mailroom.db.migrate import migrate


def current_counts(url: str) -> dict[str, int]:
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            return counts(conn)
    except psycopg.OperationalError:
        return {}


def test_sender_survives_server_restart(private_cluster, smtp_server):
    url = private_cluster.url()
    migrate(url)
    server = smtp_server(delay=0.005)
    with psycopg.connect(url, autocommit=True) as conn:
        add_sender(conn, server.port)
        enqueue_many(conn, 300)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env.update(MAILROOM_DATABASE_URL=url, PYTHONUNBUFFERED="1")
    testing.ensure_test_logins(url)
    env = testing.driver_env(env, ["send"])  # as mr_sender
    # short lease and reaper, so a batch whose finalize died with the server comes back quickly
    proc = subprocess.Popen(
        [sys.executable, "-m", "mailroom", "send", *SEND_FLAGS, "--concurrency", "2", "--batch-size", "20",
         "--lease", "2s", "--reap-after", "3s"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: len(server.handler.received) >= 60, timeout=30, what="first deliveries")
        bindir, run_as = embedded.find_bindir(), embedded.RunAs.detect()
        private_cluster.stop(bindir, run_as)  # fast shutdown: every backend is terminated mid-flow
        time.sleep(1.0)
        assert proc.poll() is None, "the sender must keep running while the database is down"
        private_cluster.start(bindir, run_as, fast=True)
        with psycopg.connect(url, autocommit=True) as conn:
            enqueue_many(conn, 100)  # work that arrives after the restart
        wait_for(lambda: current_counts(url) == {"sent": 400}, timeout=60, what="all 400 sent")
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        stderr = proc.stderr.read().decode(errors="replace")
        print(stderr)

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT message_id, possibly_sent FROM mailroom.outbound_messages").fetchall()
    delivered = collections.Counter(server.handler.message_ids())
    assert all(delivered[mid] >= 1 for mid, _ in rows), "every message reached the relay"
    duplicates = {mid for mid, n in delivered.items() if n > 1}
    flagged = {mid for mid, flag in rows if flag}
    assert duplicates <= flagged, "duplicates only among rows flagged possibly_sent"
    assert "@" not in stderr, "no address in the sender's log"
