"""NOTIFY only where someone listens (sql/08_notify.sql: deliver_message's channels mailroom_inbox and
mailroom_delivery), and the listener protocol that makes it safe. The channels that always notify,
token_insert first: tests/db/test_notify_channels.py.

A producer that found no listener commits without NOTIFY (so its commit does not take PostgreSQL's
notify lock); a listener registers, then `await_writers` waits for every transaction that was writing
when it registered, so whatever such a producer wrote is committed before the listener looks for work.
"""

from __future__ import annotations

import threading
import time

import psycopg
import psycopg.conninfo


def _mailbox(conn: psycopg.Connection) -> str:
    return conn.execute("SELECT address FROM mailroom.create_mailbox(600, 'free')").fetchone()[0]


def _deliver(conn: psycopg.Connection, address: str) -> None:
    conn.execute("SELECT mailroom.deliver_message(%s, %s)", (address, b"Subject: x\r\n\r\nbody\r\n"))


def test_no_notify_until_registered(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn, psycopg.connect(db_url, autocommit=True) as listener:
        address = _mailbox(conn)
        listener.execute("LISTEN mailroom_inbox")
        _deliver(conn, address)
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []  # LISTEN alone: nothing announced
        listener.execute("SELECT mailroom.listen(ARRAY['mailroom_inbox'])")
        _deliver(conn, address)
        assert [n.channel for n in listener.notifies(timeout=5, stop_after=1)] == ["mailroom_inbox"]
        listener.execute("SELECT mailroom.unlisten()")
        _deliver(conn, address)
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []


def test_await_writers_outlasts_a_producer_that_read_no_listener(db_url):
    """The race the protocol closes: a producer decides 'nobody listens', a listener registers and
    looks for work before the producer commits. await_writers makes the listener wait for it."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        address = _mailbox(conn)
    producer = psycopg.connect(db_url)  # a transaction left open after its write and its registry read
    listener = psycopg.connect(db_url, autocommit=True)
    try:
        _deliver(producer, address)  # no listener registered: no NOTIFY queued
        listener.execute("LISTEN mailroom_inbox")
        listener.execute("SELECT mailroom.listen(ARRAY['mailroom_inbox'])")
        assert listener.execute("SELECT mailroom.await_writers('0.3 seconds')").fetchone()[0] is False

        def commit_later() -> None:
            time.sleep(0.5)
            producer.commit()

        t = threading.Thread(target=commit_later)
        t.start()
        assert listener.execute("SELECT mailroom.await_writers('30 seconds')").fetchone()[0] is True
        # the look for work after the wait sees the producer's message
        count = listener.execute("SELECT count(*) FROM mailroom.messages AS m JOIN mailroom.mailboxes AS b"
                                 " ON b.id = m.mailbox_id WHERE b.address = %s", (address,)).fetchone()[0]
        t.join()
        assert count == 1
    finally:
        producer.close()
        listener.close()


def test_await_writers_ignores_other_databases(db_url):
    """A transaction writing in another database of the cluster cannot be this one's producer: a
    listener does not wait for it (a busy neighbour database would delay every listener's start)."""
    other_url = psycopg.conninfo.make_conninfo(db_url, dbname="postgres")
    with psycopg.connect(other_url) as other, psycopg.connect(db_url, autocommit=True) as listener:
        other.execute("SELECT pg_current_xact_id()")  # holds a transaction id, open
        t0 = time.monotonic()
        assert listener.execute("SELECT mailroom.await_writers('5 seconds')").fetchone()[0] is True
        assert time.monotonic() - t0 < 4  # not the timeout (a liveness bound, not a figure)
        other.rollback()
