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

import asyncio
import contextlib
import functools
import logging
import weakref
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from mailroom.core.log import get_logger
from mailroom.db.connect import StaleConnection, connection_kwargs, ensure_alive, prepare_when_direct, with_defaults

# An attempt to connect gives up after this many seconds (its retries 1 s apart, then 2 s).
RECONNECT_TIMEOUT = 3.0

# psycopg_pool logs each failed attempt at WARNING, over several lines: the servers say it once.
logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)


class _OneLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = " ".join(record.getMessage().split()), None
        return True


# psycopg's own warnings (a cancel request that failed, a pipeline ended in error) in the servers' format,
# one line each
_psycopg_log = get_logger("psycopg")
_psycopg_log.setLevel(logging.WARNING)
_psycopg_log.addFilter(_OneLine())


def async_pool(url: str, *, max_size: int, application_name: str, configure: Any = None,
               min_size: int = 1) -> AsyncConnectionPool:
    """An unopened pool of pooler-safe autocommit connections (open it with `await pool.open()`), each
    with server-side prepared statements when it reaches PostgreSQL itself (connect.prepare_when_direct)."""

    async def configured(conn: psycopg.AsyncConnection) -> None:
        await prepare_when_direct(conn)
        if configure is not None:
            await configure(conn)

    return AsyncConnectionPool(
        with_defaults(url), min_size=min_size, max_size=max_size, open=False,
        kwargs=connection_kwargs(application_name=application_name), configure=configured,
        reconnect_timeout=RECONNECT_TIMEOUT,
    )


# The statement timeout of one call: a runtime role is a NOLOGIN group role (ALTER ROLE … SET on it
# does nothing), a pooler drops startup options, and a function's own SET does not re-arm the timer of
# the statement running it; so it is set in the call's own transaction, before the call
# (docs/deployment.md). Both travel as ONE simple-query string: PostgreSQL runs a string of several
# statements as one implicit transaction (the SET LOCAL ends with it) and arms the statement timeout
# afresh for each of them, so the call is bounded; one message out, one round trip, no BEGIN/COMMIT.
# A connection that reaches PostgreSQL itself (no pooler: connect.prepare_when_direct) keeps its
# session's own statement_timeout instead, set once (_session_timeouts): the call is then its one
# statement, prepared at its repeat (the set_config's parse and run saved at every call).
_SET_TIMEOUT = "SELECT pg_catalog.set_config('statement_timeout', '{ms}ms', true); "
_SET_SESSION_TIMEOUT = "SELECT pg_catalog.set_config('statement_timeout', '{ms}ms', false)"

# a direct connection -> the statement_timeout (ms) its session was given by bounded_transaction
_session_timeouts: weakref.WeakKeyDictionary[psycopg.AsyncConnection, int] = weakref.WeakKeyDictionary()


class _BoundedCursor(psycopg.AsyncClientCursor):
    """A cursor whose every execute() is `SET LOCAL statement_timeout` + the statement in one string
    (the parameters bound by psycopg's client-side adaptation, as literals); it answers the statement's
    result (the set_config's is skipped)."""

    _prefix = ""

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = self._prefix + query if isinstance(query, str) else sql.Composed([sql.SQL(self._prefix), query])
        await super().execute(text, params, **kwargs)
        self.nextset()
        return self


@functools.cache
def _bounded_cursor(ms: int) -> type[psycopg.AsyncClientCursor]:
    return type("BoundedCursor", (_BoundedCursor,), {"_prefix": _SET_TIMEOUT.format(ms=ms)})


@contextlib.asynccontextmanager
async def bounded_transaction(conn: psycopg.AsyncConnection, statement_timeout: float) -> AsyncIterator[None]:
    """Inside: every statement run on `conn` (through conn.cursor() or conn.execute()) is its own
    transaction that stops it after `statement_timeout` seconds (57014), in one round trip."""
    ms = max(1, int(statement_timeout * 1000))
    if conn.prepare_threshold is not None:  # direct: the session's own timeout (set once), the call prepared
        if _session_timeouts.get(conn) != ms:
            await conn.execute(_SET_SESSION_TIMEOUT.format(ms=ms))
            _session_timeouts[conn] = ms
        yield
        return
    previous = conn.cursor_factory
    conn.cursor_factory = _bounded_cursor(ms)
    try:
        yield
    finally:
        conn.cursor_factory = previous


_abandoned: set[asyncio.Task] = set()


async def within(seconds: float, coro: Any) -> Any:
    """Await `coro` for at most `seconds`, then raise TimeoutError at once; its cancellation (psycopg sends
    a cancel request and waits for the query to end, up to 5 + 5 s, on a connection gone silent) finishes
    in the background, and the pool discards the connection."""
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if task in done:
        return task.result()
    task.cancel()
    _abandoned.add(task)
    task.add_done_callback(_abandoned.discard)
    raise TimeoutError


class NoConnection(Exception):
    """No usable pooled connection: none within the pool timeout (`cause`: the PoolTimeout), or every
    one tried was found ended by the server before anything was sent (`cause` None)."""

    def __init__(self, cause: BaseException | None = None) -> None:
        super().__init__(str(cause) if cause else "every pooled connection was found ended by the server")
        self.cause = cause


async def front_call(pool: AsyncConnectionPool, call: Any, *, pool_timeout: float, statement_timeout: float) -> Any:
    """`await call(conn)` as a front end that serves others does it (docs/architecture.md, "Faults at
    the front ends"): in a transaction under `statement_timeout` (bounded_transaction); a pooled
    connection the server ended while idle (found before anything is sent) replaced by the next one,
    nothing else retried (a cancelled or terminated statement, a connection lost under it: their
    psycopg error is raised); the whole call given up after pool_timeout + statement_timeout + 1 s
    (TimeoutError: a connection gone silent, which the server's timeout cannot end). NoConnection when
    no usable connection could be had."""
    async def attempts() -> Any:
        for _attempt in range(pool.max_size + 1):
            try:
                async with pool.connection(timeout=pool_timeout) as conn:
                    await ensure_alive(conn)
                    async with bounded_transaction(conn, statement_timeout):
                        return await call(conn)
            except StaleConnection:
                continue  # ended while idle, nothing was sent: the next connection
            except PoolTimeout as exc:
                raise NoConnection(exc) from None
        raise NoConnection()

    return await within(pool_timeout + statement_timeout + 1.0, attempts())
