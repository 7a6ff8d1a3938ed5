"""No lock a stranger can hold, and waits that do not hold up partition maintenance (issue 21, item 4).

Advisory locks are global to the server: any login could take the keys mailroom used. Each test
here logs in as a role with no mailroom role at all (created here), takes the old key, tries the
new lock (a row of a mailroom table: refused), and checks that mailroom goes on as if it were not
there. Then the readers: an application waiting with CALL mailroom.await_message, or a writer with
an open transaction, does not make maintain_partitions report lock_busy for the partitions it
creates, and the wait does not pin xmin.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from mailroom import testing


@pytest.fixture
def stranger(pg, db_url):
    """The URL of a login with no mailroom role at all (CONNECT on the database, as PUBLIC has)."""
    name = f"stranger_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg.url("postgres"), autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{name}" LOGIN')
    yield testing.as_login(db_url, name)
    with psycopg.connect(pg.url("postgres"), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        admin.execute(f'DROP ROLE "{name}"')


def _as(db_url: str, login: str, **kwargs) -> psycopg.Connection:
    return psycopg.connect(testing.as_login(db_url, login), autocommit=True, **kwargs)


def _refused(conn: psycopg.Connection, sql: str) -> str:
    """The SQLSTATE the stranger gets for `sql` in a transaction block (it must not succeed)."""
    conn.execute("BEGIN")
    try:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(sql)
    finally:
        conn.execute("ROLLBACK")
    return err.value.sqlstate


def test_a_stranger_cannot_make_partition_maintenance_skip(db_url, stranger):
    with psycopg.connect(stranger, autocommit=True) as bad, _as(db_url, "mr_admin") as admin:
        assert bad.execute("SELECT pg_try_advisory_lock(1835101285, 1885435252)").fetchone()[0]  # the old key
        assert _refused(bad, "SELECT * FROM mailroom.job_locks FOR UPDATE") == "42501"
        assert _refused(bad, "LOCK TABLE mailroom.job_locks") == "42501"
        actions = [r[0] for r in admin.execute("SELECT action FROM mailroom.maintain_partitions()")]
        assert "skipped" not in actions


def test_a_stranger_cannot_hold_a_domains_deliveries(db_url, conn, stranger):
    conn.execute("SELECT mailroom.upsert_sender('main', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    conn.execute("SELECT mailroom.set_domain_limit('capped.test', 2, NULL)")
    conn.execute("SELECT mailroom.enqueue_message('main', ARRAY['a@capped.test'], 's', 'b')")
    with psycopg.connect(stranger, autocommit=True) as bad, _as(db_url, "mr_sender") as sender:
        assert bad.execute("SELECT pg_try_advisory_lock(hashtextextended('mailroom.domain:capped.test', 0))").fetchone()[0]
        assert _refused(bad, "SELECT * FROM mailroom.domain_locks FOR UPDATE") == "42501"
        sender.execute("SET statement_timeout = '10s'")
        claimed = sender.execute("SELECT id FROM mailroom.claim_messages(10, 'w')").fetchall()
        assert len(claimed) == 1, "the capped domain is claimed whatever the stranger holds"


def test_a_stranger_cannot_block_recovery_requests(db_url, conn, stranger):
    conn.execute("SELECT mailroom.create_account('owner@example.com', 'owner')")
    conn.execute("UPDATE mailroom.accounts SET status = 'active'")
    with psycopg.connect(stranger, autocommit=True) as bad, _as(db_url, "mr_app") as app:
        key = "hashtextextended('mailroom.recovery:' || lower('owner@example.com'), 0)"
        assert bad.execute(f"SELECT pg_try_advisory_lock({key})").fetchone()[0]
        assert _refused(bad, "SELECT * FROM mailroom.recovery_requests FOR UPDATE") == "42501"
        app.execute("SET statement_timeout = '5s'")
        started = time.monotonic()
        app.execute("SELECT mailroom.request_password_recovery('owner@example.com')")
        assert time.monotonic() - started < 5
    dequeue = "SELECT count(*) FROM mailroom.dequeue_tokens(10) WHERE action = 'password_recovery'"
    conn.execute(dequeue)  # issues the requested token; the next call hands it out
    assert conn.execute(dequeue).fetchone()[0] == 1


def _maintain(admin: psycopg.Connection, days_ahead: int) -> list[tuple[str, str, str | None]]:
    """maintain_partitions with the clock days ahead (so it has partitions to create)."""
    when = datetime.now(UTC) + timedelta(days=days_ahead)
    admin.execute("SELECT set_config('mailroom.clock', %s, false)", (when.isoformat(),))
    return [tuple(r) for r in admin.execute("SELECT action, table_name, partition_name FROM mailroom.maintain_partitions()")]


def test_an_open_writer_does_not_hold_up_creating_partitions(db_url, conn):
    conn.execute("SELECT mailroom.upsert_sender('main', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    with _as(db_url, "mr_app") as app, _as(db_url, "mr_admin") as admin:
        app.execute("BEGIN")
        app.execute("SELECT mailroom.enqueue_message('main', ARRAY['a@example.com'], 's', 'b')")  # stays open
        rows = _maintain(admin, 10)
        app.execute("ROLLBACK")
    created = {table for action, table, _ in rows if action == "created"}
    assert "outbound_messages" in created, rows
    assert ("lock_busy", "outbound_messages", None) not in rows, "attaching a partition waited for the writer"


def test_await_message_neither_holds_up_maintenance_nor_pins_xmin(db_url, conn, pg):
    box = conn.execute("SELECT address, session_token FROM mailroom.create_mailbox(60, 'free')").fetchone()
    result: dict[str, object] = {}

    def wait() -> None:
        with _as(db_url, "mr_app") as app:
            result["pid"] = app.info.backend_pid
            try:
                result["id"] = app.execute("CALL mailroom.await_message(%s, %s, '8 seconds', 'Late%%')",
                                           box).fetchone()[0]
            except psycopg.Error as exc:
                result["error"] = exc.sqlstate

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        with psycopg.connect(pg.url("postgres"), autocommit=True) as root, _as(db_url, "mr_admin") as admin:
            deadline = time.monotonic() + 5
            while "pid" not in result and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)  # the waiter is polling
            rows = _maintain(admin, 10)
            # a transaction committed while the waiter waits: the waiter's snapshot moves past it
            committed = conn.execute("SELECT txid_current()").fetchone()[0] % 2**32
            xmins = []
            for _ in range(40):
                xmin = root.execute("SELECT backend_xmin::text::bigint FROM pg_stat_activity WHERE pid = %s",
                                    (result["pid"],)).fetchone()[0]
                xmins.append(xmin)
                if xmin is None or xmin > committed:
                    break
                time.sleep(0.05)
            conn.execute("SELECT mailroom.deliver_message(%s, %s, '', 'Late mail')", (box[0], b"raw"))
    finally:
        waiter.join(15)
    assert "error" not in result, result
    assert result.get("id") is not None, "the waiter got the message"
    created = {table for action, table, _ in rows if action == "created"}
    assert "messages" in created, rows
    assert not [r for r in rows if r[0] == "lock_busy" and r[2] is None], f"creating a partition waited: {rows}"
    assert xmins[-1] is None or xmins[-1] > committed, f"the wait pinned xmin at {xmins} (committed {committed})"


def test_no_function_of_the_schema_takes_an_advisory_lock(conn):
    """A guard for the rule itself: no function of schemas mailroom and mailroom_internal calls pg_advisory_*/pg_try_advisory_*
    (the seed import took one before review: a row of mailroom.job_locks instead)."""
    names = [r[0] for r in conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc AS p"
        " WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace)"
        " AND p.prosrc ~* 'pg_(try_)?advisory_'").fetchall()]
    assert names == [], names
