"""One transaction with a statement timeout: `SET LOCAL statement_timeout` (transaction-pooler safe:
it ends with the transaction, so no setting outlives the call on a shared server connection)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import psycopg


def timeout_ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


@contextlib.asynccontextmanager
async def atimed_transaction(conn: psycopg.AsyncConnection, seconds: float) -> AsyncIterator[psycopg.AsyncConnection]:
    """A transaction on `conn` whose statements are cancelled after `seconds` each (SQLSTATE 57014)."""
    async with conn.transaction():
        await conn.execute(f"SET LOCAL statement_timeout = {timeout_ms(seconds):d}")
        yield conn
