"""The lock of `db migrate` (issue 20 item 2, issue 21 item 4): a table lock only mailroom's owner can
take, not an advisory lock; concurrent runs queue; a lock held by a running transaction is waited
for at most --lock-timeout, then the whole run rolls back and tries again."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psycopg
import pytest

from mailroom import testing
from mailroom.core.errors import UserError
from mailroom.db import migrate

OLD_ADVISORY_KEY = 7_305_853_001  # the lock key of mailroom 0.1.0's runner


def ensure_login(pg, name: str) -> None:
    with psycopg.connect(pg.url("postgres"), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
            conn.execute(f'CREATE ROLE "{name}" LOGIN')


def run_migrate(url: str, timeout: float = 60, **kwargs) -> tuple[migrate.MigrateResult | None, float, list[str]]:
    """migrate() in a thread: its result (None if it did not finish within `timeout`), seconds, lines said."""
    said: list[str] = []
    out: dict = {}

    def target() -> None:
        out["result"] = migrate.migrate(url, say=said.append, **kwargs)

    started = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    return out.get("result"), time.monotonic() - started, said


def locks_on(conn: psycopg.Connection, pid: int, relation: str) -> list[str]:
    return [m for (m,) in conn.execute(
        "SELECT mode FROM pg_locks WHERE pid = %s AND relation = %s::regclass AND granted ORDER BY 1", (pid, relation))]


def test_a_login_without_a_mailroom_role_cannot_make_migrate_wait(pg, db_url):
    ensure_login(pg, "mr_stranger")
    stranger = psycopg.connect(testing.as_login(db_url, "mr_stranger"))
    try:
        # what hung 0.1.0's migrate: the runner's advisory lock key, held in an open session
        stranger.execute("SELECT pg_advisory_lock(%s)", (OLD_ADVISORY_KEY,))
        for attempt in ("LOCK TABLE mailroom.migration_lock IN ACCESS SHARE MODE",
                        "SELECT * FROM mailroom.migration_lock",
                        "PREPARE p AS SELECT * FROM mailroom.migration_lock"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                stranger.execute(attempt)
            stranger.rollback()
        stranger.execute("SELECT pg_advisory_lock(%s)", (OLD_ADVISORY_KEY,))
        stranger.execute("SELECT 1")  # and an open transaction
        result, seconds, said = run_migrate(db_url)
        assert result is not None, f"migrate did not finish in 60 s with a stranger connected ({said})"
        assert not said, said  # it did not wait for anyone
    finally:
        stranger.close()


def test_a_runtime_role_cannot_hold_the_migration_lock(pg, db_url):
    """A runtime login may name the table (it uses the schema): parsing a statement takes a weak
    lock before privileges are checked, and PREPARE keeps it to the end of the transaction. Those
    modes do not conflict with migrate's; every mode that does is refused."""
    app = psycopg.connect(testing.as_login(db_url, "mr_app"))
    try:
        app.execute("PREPARE a AS SELECT * FROM mailroom.migration_lock")
        app.execute("PREPARE b AS SELECT * FROM mailroom.migration_lock FOR UPDATE")
        app.execute("PREPARE c AS INSERT INTO mailroom.migration_lock DEFAULT VALUES")
        with psycopg.connect(db_url, autocommit=True) as dba:
            held = locks_on(dba, app.info.backend_pid, "mailroom.migration_lock")
        assert held == ["AccessShareLock", "RowExclusiveLock", "RowShareLock"], held  # the test exercises them
        for mode in ("SHARE UPDATE EXCLUSIVE", "SHARE", "EXCLUSIVE", "ACCESS EXCLUSIVE", "ROW EXCLUSIVE"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege), app.transaction():  # a savepoint
                app.execute(f"LOCK TABLE mailroom.migration_lock IN {mode} MODE")
        # statements that lock SHARE UPDATE EXCLUSIVE before checking ownership let it go when refused
        app.execute("ANALYZE mailroom.migration_lock")  # skipped with a WARNING: not the owner
        with pytest.raises(psycopg.errors.InsufficientPrivilege), app.transaction():
            app.execute("COMMENT ON TABLE mailroom.migration_lock IS 'x'")
        with psycopg.connect(db_url, autocommit=True) as dba:
            assert locks_on(dba, app.info.backend_pid, "mailroom.migration_lock") == held
        result, _seconds, said = run_migrate(db_url)
        assert result is not None and not said, f"migrate waited for the application's transaction: {said}"
    finally:
        app.close()


def test_concurrent_migrates_queue_up(db_url):
    holder = psycopg.connect(db_url)  # the owner, as a running migrate holds it
    try:
        holder.execute(migrate.LOCK)
        proc = subprocess.Popen([sys.executable, "-m", "mailroom", "db", "migrate"],
                                env={"PATH": "/usr/bin:/bin", "MAILROOM_DATABASE_URL": db_url},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # waiting, seen in the catalog (a sleep raced the second process's start on a loaded machine)
        with psycopg.connect(db_url, autocommit=True) as watcher:
            assert _waiting_on_a_lock(watcher, "mailroom migrate"), "the second migrate did not wait"
        assert proc.poll() is None, "the second migrate did not wait"
        holder.commit()
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "another `mailroom db migrate` is running on this database; waiting for it to finish" in err
    finally:
        holder.close()


def test_a_lock_held_by_a_running_transaction_is_waited_for_then_retried(db_url):
    """sql/ replaces triggers on tokens (SHARE ROW EXCLUSIVE): a transaction writing tokens holds it
    off. Migrate waits --lock-timeout, rolls back (releasing what it held), and tries again."""
    writer = psycopg.connect(db_url)
    try:
        writer.execute("LOCK TABLE mailroom.tokens IN ROW EXCLUSIVE MODE")  # as an INSERT holds it
        threading.Timer(2.5, writer.commit).start()
        result, seconds, said = run_migrate(db_url, lock_timeout=0.5)
        assert result is not None
        assert result.lock_retries >= 1, said
        assert any("rolled back, trying again" in line for line in said), said
        assert result.held_seconds < 5
    finally:
        writer.close()


def test_a_lock_never_released_fails_migrate_with_one_clear_line(db_url):
    writer = psycopg.connect(db_url)
    try:
        writer.execute("LOCK TABLE mailroom.tokens IN ROW EXCLUSIVE MODE")
        with pytest.raises(UserError, match=r"held by another transaction for longer than 0.3s, 2 times; "
                                            r"nothing was applied"):
            migrate.migrate(db_url, lock_timeout=0.3, retries=1)
    finally:
        writer.close()


def _waiting_on_a_lock(conn: psycopg.Connection, application: str, within: float = 60) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                        " AND wait_event_type = 'Lock'", (application,)).fetchone()[0]:
            return True
        time.sleep(0.05)
    return False


def test_a_deadlock_with_a_running_transaction_rolls_back_and_is_tried_again(db_url):
    """The upgrade under load met it (tests/db/test_upgrade_under_load.py, 40P01 in sql/31): sql/ replaces
    the triggers of tokens (sql/11) and later of outbound_messages (sql/31); a transaction writing
    outbound_messages then tokens closes the circle, and PostgreSQL aborts the migrate, which waited
    first. Nothing was applied: the run is tried again, as after a lock timeout, not failed."""
    writer = psycopg.connect(db_url)
    watcher = psycopg.connect(db_url, autocommit=True)
    try:
        writer.execute("LOCK TABLE mailroom.outbound_messages IN ROW EXCLUSIVE MODE")  # as an UPDATE holds it

        def close_the_circle() -> None:
            if _waiting_on_a_lock(watcher, "mailroom migrate"):  # the migrate holds tokens, waits for us
                try:
                    writer.execute("LOCK TABLE mailroom.tokens IN ROW EXCLUSIVE MODE")  # waits for it: a deadlock
                    time.sleep(0.5)
                finally:
                    writer.commit()

        threading.Thread(target=close_the_circle, daemon=True).start()
        result, _seconds, said = run_migrate(db_url, timeout=120, lock_timeout=30)
        assert result is not None, said
        assert result.lock_retries >= 1, said
        assert any("deadlocked with a running transaction; rolled back, trying again" in line for line in said), said
    finally:
        writer.close()
        watcher.close()
