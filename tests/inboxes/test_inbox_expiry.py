"""`mailroom expire`: concurrent workers, pinned clocks, SIGTERM, a failed cycle, purge."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import psycopg
from inbox_support import wait_for_log

PINNED = {"PGOPTIONS": "-c mailroom.clock=2099-01-01T00:00:00Z"}


def add_expired(conn: psycopg.Connection, n: int, *, expires_at: str = "2000-01-01 00:00+00") -> None:
    """Bulk test rows: n anonymous free mailboxes already past their expiry."""
    conn.execute(
        """INSERT INTO mailroom.mailboxes (address, plan, session_token_digest, expires_at, created_at)
           SELECT format('bulk-%%s@mailroom.test', g), 'free', '\\x00', %s, %s
           FROM generate_series(1, %s) AS g""",
        (expires_at, expires_at, n),
    )


def active_count(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT count(*) FROM mailroom.mailboxes WHERE is_active").fetchone()[0]


def test_two_workers_at_once_no_double_work_no_error(cli_popen, conn, tmp_path: Path):
    logs, procs = [], []
    for i in range(2):
        log_path = tmp_path / f"expire-{i}.log"
        with open(log_path, "w") as log_file:
            procs.append(cli_popen("expire", "--interval", "0.05s", "--batch", "10", "--purge-after", "never",
                                   stdout=subprocess.DEVNULL, stderr=log_file))
        logs.append(log_path)
    for log_path, proc in zip(logs, procs, strict=True):
        wait_for_log(log_path, r"started", proc)
    add_expired(conn, 6000)  # both workers are polling: they sweep these at the same time
    deadline = time.monotonic() + 30
    while active_count(conn) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert active_count(conn) == 0
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    counts = []
    for log_path in logs:
        text = log_path.read_text()
        assert "failed" not in text and "Traceback" not in text and "deadlock" not in text
        counts.append(int(re.search(r"stopped \(expired (\d+)", text).group(1)))
    assert sum(counts) == 6000  # each mailbox expired by exactly one worker
    assert all(c > 0 for c in counts), counts  # and both took part


def test_pinned_clock_worker_expires_a_fresh_inbox(cli, conn):
    conn.execute("SELECT * FROM mailroom.create_mailbox(60)")
    conn.execute("SELECT * FROM mailroom.create_mailbox(60)")
    real = cli("expire", "--once", "--purge-after", "never")
    assert real.returncode == 0, real.stderr
    assert real.stdout.strip() == "expired=0 purged=0"
    pinned = cli("expire", "--once", "--purge-after", "never", env=PINNED)
    assert pinned.returncode == 0, pinned.stderr
    assert pinned.stdout.strip() == "expired=2 purged=0"
    assert active_count(conn) == 0


def test_purge_cascades_messages(cli, conn):
    box = conn.execute("SELECT mailbox_id, address FROM mailroom.create_mailbox(5)").fetchone()
    conn.execute("SELECT mailroom.deliver_message(%s, '\\x41'::bytea)", (box[1],))
    keep = conn.execute("SELECT mailbox_id FROM mailroom.create_mailbox(5)").fetchone()[0]
    result = cli("expire", "--once", "--purge-after", "7d", env=PINNED)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "expired=2 purged=2"
    assert conn.execute("SELECT count(*) FROM mailroom.mailboxes WHERE id IN (%s, %s)", (box[0], keep)).fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM mailroom.messages").fetchone()[0] == 0


def test_purge_respects_retention(cli, conn):
    conn.execute("SELECT * FROM mailroom.create_mailbox(5)")
    result = cli("expire", "--once", "--purge-after", "200000d", env=PINNED)
    assert result.stdout.strip() == "expired=1 purged=0"
    assert conn.execute("SELECT count(*) FROM mailroom.mailboxes").fetchone()[0] == 1


def test_sigterm_stops_the_sleeping_worker(cli_popen, tmp_path: Path):
    """SIGTERM wakes the worker out of its sleep: by events, not a clock. Its ready signal
    (MAILROOM_READY_FD, written after the first cycle) says it is asleep on its hour-long interval; then
    the signal, and it must be gone long before any sleep of its own could end: a worker that sleeps
    its interval out (an hour), or looks at its stop event only every 10 s or more, fails."""
    log_path = tmp_path / "expire.log"
    ready_r, ready_w = os.pipe()
    try:
        with open(log_path, "w") as log_file:
            proc = cli_popen("expire", "--interval", "3600s", env={"MAILROOM_READY_FD": str(ready_w)},
                             pass_fds=(ready_w,), stdout=subprocess.DEVNULL, stderr=log_file)
        os.close(ready_w)
        readable, _, _ = select.select([ready_r], [], [], 30)
        assert readable and os.read(ready_r, 1) == b".", log_path.read_text()
    finally:
        os.close(ready_r)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, log_path.read_text()
    text = log_path.read_text()
    assert "started (interval 3600s" in text and "stopped (expired 0, purged 0)" in text, text


def test_worker_wakes_when_the_next_inbox_is_due(cli_popen, conn, tmp_path: Path):
    box_id = conn.execute("SELECT mailbox_id FROM mailroom.create_mailbox(5)").fetchone()[0]
    # Due in 2.5 s (past the worker's start-up): with a 60 s interval only the sleep-until-due wakes
    # it in time. The first cycle finds nothing due and sleeps until expires_at.
    conn.execute("UPDATE mailroom.mailboxes SET expires_at = clock_timestamp() + interval '2.5 seconds' WHERE id = %s",
                 (box_id,))
    log_path = tmp_path / "expire.log"
    with open(log_path, "w") as log_file:
        proc = cli_popen("expire", "--interval", "60s", "--purge-after", "never",
                         stdout=subprocess.DEVNULL, stderr=log_file)
    wait_for_log(log_path, r"expired 1 mailbox", proc, timeout=8)
    assert not conn.execute("SELECT is_active FROM mailroom.mailboxes WHERE id = %s", (box_id,)).fetchone()[0]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0


def test_a_sooner_inbox_created_while_the_worker_sleeps_wakes_it(cli_popen, conn, tmp_path: Path):
    conn.execute("SELECT * FROM mailroom.create_mailbox(60)")
    log_path = tmp_path / "expire.log"
    with open(log_path, "w") as log_file:
        proc = cli_popen("expire", "--interval", "60s", "--purge-after", "never",
                         stdout=subprocess.DEVNULL, stderr=log_file)
    wait_for_log(log_path, r"started", proc)
    time.sleep(1.0)  # the first cycle is done: it now sleeps until the 60-minute inbox or 60 s
    conn.execute(
        """INSERT INTO mailroom.mailboxes (address, plan, session_token_digest, expires_at, created_at)
           VALUES ('soon@mailroom.test', 'free', '\\x00', clock_timestamp() + interval '1 second', clock_timestamp())"""
    )
    wait_for_log(log_path, r"expired 1 mailbox", proc, timeout=6)
    assert conn.execute("SELECT is_active FROM mailroom.mailboxes WHERE address = 'soon@mailroom.test'").fetchone()[0] is False
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0


def test_schedule_notification_only_when_a_new_inbox_is_next_due(db_url, conn):
    conn.execute("SELECT * FROM mailroom.create_mailbox(30)")
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN mailroom_expiry_schedule")
        conn.execute("SELECT * FROM mailroom.create_mailbox(60)")  # expires last: no wake-up needed
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
        conn.execute("SELECT * FROM mailroom.create_mailbox(5)")  # now the next due
        (note,) = list(listener.notifies(timeout=5, stop_after=1))
    assert note.payload == ""


def test_a_failed_cycle_is_logged_and_the_next_one_runs(cli_popen, conn, tmp_path: Path):
    add_expired(conn, 3)
    # set_setting refuses it (MR003): a value planted behind its back makes the cycle fail
    conn.execute("UPDATE mailroom.settings SET value = 'not-a-number' WHERE name = 'inbox.expire_batch'")
    log_path = tmp_path / "expire.log"
    with open(log_path, "w") as log_file:
        proc = cli_popen("expire", "--interval", "0.2s", "--purge-after", "never",
                         stdout=subprocess.DEVNULL, stderr=log_file)
    wait_for_log(log_path, r"cycle failed: .*SQLSTATE 22P02", proc)
    assert active_count(conn) == 3
    conn.execute("SELECT mailroom.set_setting('inbox.expire_batch', '2')")
    wait_for_log(log_path, r"expired 3 mailbox", proc)
    assert proc.poll() is None  # still running
    assert active_count(conn) == 0
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0
    assert "Traceback" not in log_path.read_text()


def test_run_expiry_procedure_commits_per_batch(conn):
    add_expired(conn, 25)
    conn.execute("SET mailroom.clock = '2099-01-01 00:00+00'")
    conn.execute("CALL mailroom.run_expiry(interval '1 day', 10, 10)")
    assert conn.execute("SELECT count(*) FROM mailroom.mailboxes").fetchone()[0] == 0


def test_bad_flags_exit_2(cli):
    for args, message in (
        (("--interval", "soon"), "Invalid value for '--interval' (env var: 'MAILROOM_EXPIRE_INTERVAL'): 'soon' is not "
                                 "a duration like 500ms, 5s, 10m, 2h or 7d"),
        (("--purge-after", "7 days"), "Invalid value for '--purge-after' (env var: 'MAILROOM_EXPIRE_PURGE_AFTER'): "
                                      "'7 days' is not a duration like 500ms, 5s, 10m, 2h or 7d or never"),
        (("--interval", "60"), "'60' is not a duration"),  # a number without a unit is refused
        (("--batch", "0"), "Invalid value for '--batch' (env var: 'MAILROOM_EXPIRE_BATCH'): Input should be greater "
                           "than or equal to 1"),
    ):
        result = cli("expire", "--once", *args)
        assert result.returncode == 2, result
        assert result.stderr.startswith("mailroom: error: mailroom expire: ") and result.stderr.count("\n") == 1
        assert message in result.stderr, result.stderr


def test_database_down_is_one_line_exit_1(cli):
    result = cli("expire", "--once", env={"MAILROOM_DATABASE_URL": "host=127.0.0.1 port=1 dbname=x connect_timeout=2"})
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("mailroom: error: ")
    assert "Traceback" not in result.stderr
