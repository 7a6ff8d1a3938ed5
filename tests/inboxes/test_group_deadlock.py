"""A group commit that deadlocks is delivered one by one, never answered as a lost answer.

Two group commits take the row locks of the same inboxes in other orders (each delivers its
messages in its sessions' order), and PostgreSQL aborts one with 40P01. psycopg files class 40
under OperationalError, which the server took for a lost connection: it settled by the receipt,
found nothing stored and answered 451 (tests/pooled/test_inbox_pooled.py met it: 2 of 500 at 451).
A rollback is an answer: nothing was kept, so the group goes alone, message by message.
"""

from __future__ import annotations

import asyncio
import time

import psycopg

from mailroom.db.pool import async_pool
from mailroom.inboxes.delivery import Delivery, DeliveryParams, receipt_key
from mailroom.inboxes.mime import ParsedMessage

RAW = b"Subject: deadlock\r\n\r\nbody\r\n"


def _waits_on_a_lock(conn: psycopg.Connection, within: float = 60) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'deadlock test'"
                        " AND wait_event_type = 'Lock'").fetchone()[0]:
            return True
        time.sleep(0.05)
    return False


def test_a_deadlocked_group_goes_one_by_one(conn, db_url, make_mailbox):
    first, second = make_mailbox(), make_mailbox()
    group = [DeliveryParams(RAW, ParsedMessage(subject="a"), "a@example.com", [first.address]),
             DeliveryParams(RAW, ParsedMessage(subject="b"), "b@example.com", [second.address])]
    other = psycopg.connect(db_url)  # a transaction taking the two inboxes' rows the other way round
    watcher = psycopg.connect(db_url, autocommit=True)

    async def run() -> tuple[list[str] | None, list[str]]:
        pool = async_pool(db_url, max_size=2, application_name="deadlock test")
        await pool.open()
        try:
            delivery = Delivery(pool, parser=None, timeout=60)  # type: ignore[arg-type]: no parsing here
            other.execute("UPDATE mailroom.mailboxes SET message_count = message_count WHERE address = %s",
                          (second.address,))

            def close_the_circle() -> None:
                assert _waits_on_a_lock(watcher), "the group never waited for the second inbox"
                try:  # the group holds the first inbox and waits for the second: a circle
                    other.execute("UPDATE mailroom.mailboxes SET message_count = message_count WHERE address = %s",
                                  (first.address,))
                finally:
                    other.rollback()

            circle = asyncio.get_running_loop().run_in_executor(None, close_the_circle)
            grouped = await delivery._deliver_group(group, receipt_key())
            await circle
            alone = [await delivery._deliver_alone(p) for p in group] if grouped is None else []
            return grouped, alone
        finally:
            await pool.close()

    try:
        grouped, alone = asyncio.run(run())
    finally:
        other.close()
        watcher.close()
    assert grouped is None, "the deadlocked group was answered, not delivered one by one"
    assert [reply[:3] for reply in alone] == ["250", "250"]
    counts = conn.execute("SELECT count(*) FROM mailroom.messages WHERE envelope_to = ANY(%s)",
                          ([first.address, second.address],)).fetchone()[0]
    assert counts == 2, "each message stored once"
