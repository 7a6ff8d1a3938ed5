"""Connection pools of the long-running servers (inbound SMTP, the HTTP face): how one behaves
through an outage, decided once.

psycopg_pool retries a failed connection with delays that double (1, 2, 4 … 64 s and more) for up
to `reconnect_timeout` (5 minutes by default): after a long outage the first request waited a
minute for the next attempt, and every attempt logged several lines of its own. Here an attempt
gives up after RECONNECT_TIMEOUT seconds, so its delays stay under two seconds, and the next
request that finds the pool empty starts a new one at once: a returning server is found within
seconds, however long it was away. psycopg_pool's own log lines are silenced; the server says it
once, in its own format, through its `Outage` (mailroom.core.outage).

`PoolTimeout` (no connection within the wait) is unavailability (Kind.UNAVAILABLE), not an
internal error: mailroom.core.errors.kind_of says so.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from mailroom.db.connect import connection_kwargs, with_defaults

# An attempt to connect gives up after this many seconds (its retries 1 s apart, then 2 s).
RECONNECT_TIMEOUT = 3.0

# psycopg_pool logs each failed attempt at WARNING, over several lines: the servers say it once.
logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)


def async_pool(url: str, *, max_size: int, application_name: str, configure: Any = None,
               min_size: int = 1) -> AsyncConnectionPool:
    """An unopened pool of pooler-safe autocommit connections (open it with `await pool.open()`)."""
    return AsyncConnectionPool(
        with_defaults(url), min_size=min_size, max_size=max_size, open=False,
        kwargs=connection_kwargs(application_name=application_name), configure=configure,
        reconnect_timeout=RECONNECT_TIMEOUT,
    )


# The statement timeout of one transaction: a runtime role is a NOLOGIN group role (ALTER ROLE … SET
# on it does nothing), a pooler drops startup options, and a function's own SET does not re-arm the
# timer of the statement running it; so it is set per transaction, before the call (docs/deployment.md).
_SET_TIMEOUT = "SELECT pg_catalog.set_config('statement_timeout', %s, true)"


@contextlib.asynccontextmanager
async def bounded_transaction(conn: psycopg.AsyncConnection, statement_timeout: float) -> AsyncIterator[None]:
    """A transaction on `conn` whose every statement stops after `statement_timeout` seconds
    (57014). Pipelined: the BEGIN, the timeout and the first call travel in one round trip, the
    COMMIT in a second."""
    async with conn.pipeline(), conn.transaction():
        await conn.execute(_SET_TIMEOUT, (f"{max(1, int(statement_timeout * 1000))}ms",))
        yield
