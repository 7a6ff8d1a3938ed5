"""Server-side prepared statements of the servers' pools (mailroom.db.pool, connect.prepare_when_direct).

A pool's connection that reaches PostgreSQL itself prepares a call it repeats (parsed, analysed and
planned once per connection: a tenth of PostgreSQL's CPU a message on the inbound path, issue 46);
through PgBouncer (transaction mode) it never does; with the fast paths off it never does; a
prepared call that meets the schema changed under it (its result's type) is answered by the
upgrade backoff's retry, not by the same error for ever.
"""

from __future__ import annotations

import asyncio

import psycopg

from mailroom import testing
from mailroom.core import fastpaths
from mailroom.core.errors import is_upgrade_condition
from mailroom.db.pool import async_pool, front_call
from mailroom.inboxes import sqlapi

LOGIN = "mr_inbound"


async def _calls(url: str, n: int) -> tuple[list, int]:
    """n recipient checks on one pooled connection, then the statements prepared on it."""
    pool = async_pool(url, max_size=1, application_name="mailroom-test")
    await pool.open()
    try:
        async with pool.connection() as conn:
            rows = [await sqlapi.check_bounce_recipient.arow(conn, address="nobody@mailroom.test") for _ in range(n)]
            cur = await conn.execute(
                "SELECT count(*) FROM pg_catalog.pg_prepared_statements WHERE statement LIKE %s",
                ("%check_bounce_recipient%",),
            )
            return rows, (await cur.fetchone())[0]
    finally:
        await pool.close()


def test_a_direct_connection_prepares_a_repeated_call(db_url):
    rows, prepared = asyncio.run(_calls(testing.as_login(db_url, LOGIN), 3))
    assert prepared == 1
    assert {r.verdict for r in rows} == {"unknown"}, "the same answer prepared or not"


def test_the_switch_off_prepares_nothing(db_url, monkeypatch):
    monkeypatch.setattr(fastpaths, "_ENABLED", False)
    rows, prepared = asyncio.run(_calls(testing.as_login(db_url, LOGIN), 3))
    assert prepared == 0
    assert {r.verdict for r in rows} == {"unknown"}


def test_through_pgbouncer_nothing_is_prepared(pooled_db_url):
    """PgBouncer hands each transaction to any of its server connections: a statement prepared on one
    is missing on the next (the calls would fail with 26000); its backend key is its own, so the pool
    sees it is not talking to PostgreSQL itself."""
    rows, prepared = asyncio.run(_calls(testing.as_login(pooled_db_url, LOGIN), 8))
    assert prepared == 0
    assert len(rows) == 8


def test_a_prepared_call_recovers_when_the_result_type_changes(db_url, conn):
    """`db migrate` re-creates a function with another result type while a server holds it prepared:
    PostgreSQL answers "cached plan must not change result type" (an upgrade condition: the caller
    waits and retries); the statements are dropped then, so the retry succeeds."""

    async def scenario() -> tuple[BaseException | None, object]:
        pool = async_pool(testing.as_login(db_url, LOGIN), max_size=1, application_name="mailroom-test")
        await pool.open()
        try:
            async with pool.connection() as c:
                for _ in range(3):
                    await sqlapi.check_bounce_recipient.arow(c, address="nobody@mailroom.test")
                conn.execute("""
                    BEGIN;
                    ALTER FUNCTION mailroom.check_bounce_recipient(text, bigint, boolean)
                        RENAME TO check_bounce_recipient_old;
                    CREATE FUNCTION mailroom.check_bounce_recipient(
                        p_address text, p_size bigint DEFAULT NULL, p_sink boolean DEFAULT false
                    ) RETURNS TABLE (verdict text, address varchar, reply text)
                    LANGUAGE sql AS $$ SELECT 'ok'::text, p_address::varchar, NULL::text $$;
                    GRANT EXECUTE ON FUNCTION mailroom.check_bounce_recipient(text, bigint, boolean)
                        TO mailroom_inbound;
                    COMMIT;
                """)
                met = None
                try:
                    await sqlapi.check_bounce_recipient.arow(c, address="nobody@mailroom.test")
                except psycopg.Error as exc:
                    met = exc
                return met, await sqlapi.check_bounce_recipient.arow(c, address="nobody@mailroom.test")
        finally:
            await pool.close()

    met, after = asyncio.run(scenario())
    assert met is not None and is_upgrade_condition(met), met  # once: "cached plan must not change result type"
    assert after.verdict == "ok" and after.address == "nobody@mailroom.test"


async def _front(url: str) -> tuple[list, int, str | None, str]:
    """On a direct connection: front_call's statement timeout (the session's own) and its calls prepared."""
    pool = async_pool(url, max_size=1, application_name="mailroom-test")
    await pool.open()
    try:
        async def check(conn: psycopg.AsyncConnection) -> object:
            return await sqlapi.check_bounce_recipient.arow(conn, address="nobody@mailroom.test")

        async def setting(conn: psycopg.AsyncConnection) -> str:
            cur = await conn.execute("SELECT current_setting('statement_timeout')")
            return (await cur.fetchone())[0]

        async def sleep(conn: psycopg.AsyncConnection) -> None:
            await conn.execute("SELECT pg_sleep(5)")

        rows = [await front_call(pool, check, pool_timeout=5, statement_timeout=0.3) for _ in range(3)]
        timeout = await front_call(pool, setting, pool_timeout=5, statement_timeout=0.3)
        cancelled = None
        try:
            await front_call(pool, sleep, pool_timeout=5, statement_timeout=0.3)
        except psycopg.errors.QueryCanceled as exc:
            cancelled = exc.sqlstate
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM pg_catalog.pg_prepared_statements WHERE statement LIKE %s",
                ("%check_bounce_recipient%",),
            )
            prepared = (await cur.fetchone())[0]
        return rows, prepared, cancelled, timeout
    finally:
        await pool.close()


def test_front_calls_on_a_direct_connection_are_bounded_and_prepared(db_url):
    """The HTTP and MCP faces' calls (front_call): a direct connection keeps the statement timeout in its
    session (set once) and prepares the call; a statement past the timeout is cancelled (57014)."""
    rows, prepared, cancelled, timeout = asyncio.run(_front(testing.as_login(db_url, LOGIN)))
    assert {r.verdict for r in rows} == {"unknown"}
    assert prepared == 1
    assert timeout == "300ms"
    assert cancelled == "57014"


def test_front_calls_through_pgbouncer_set_the_timeout_per_transaction(pooled_db_url):
    """Through PgBouncer nothing stays on a server connection: the timeout travels with each call (SET
    LOCAL in the call's own string), and is cancelled there too; nothing is prepared."""
    rows, prepared, cancelled, timeout = asyncio.run(_front(testing.as_login(pooled_db_url, LOGIN)))
    assert {r.verdict for r in rows} == {"unknown"}
    assert prepared == 0
    assert timeout == "300ms"
    assert cancelled == "57014"
