"""Connections: one place that opens psycopg connections and turns failures into one-line errors.

Every connection is pooler-safe: no server-side prepared statements (`prepare_threshold=None`:
PgBouncer in transaction mode hands each transaction to any server connection, where a prepared
statement of another one does not exist) and no session state is set on it. The servers' pools
(mailroom.db.pool) turn them on for a connection that reaches PostgreSQL itself
(`prepare_when_direct`): a repeated call is then parsed, analysed and planned once per connection.
"""

from __future__ import annotations

import select
import sys
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from mailroom.core import fastpaths
from mailroom.core.errors import Kind, UserError, db_user_error, describe_db_error, kind_of, learn_error_codes
from mailroom.db import sqlapi
from mailroom.db.contract import SqlFunction

# whether this process has read mailroom.error_codes (once, at its first connection that can)
_vocabulary_read = False


def connection_kwargs(*, autocommit: bool = True, application_name: str = "mailroom", **extra: Any) -> dict[str, Any]:
    """psycopg connect() keyword arguments for a pooler-safe connection (also for pools' kwargs)."""
    return {"autocommit": autocommit, "application_name": application_name, "prepare_threshold": None, **extra}


# psycopg prepares a statement on its connection at its this-many-th execution there: the servers'
# calls repeat a few statement texts (one per function and set of named arguments)
PREPARE_THRESHOLD = 2


async def prepare_when_direct(conn: psycopg.AsyncConnection) -> bool:
    """Turn on server-side prepared statements on `conn` (idle, autocommit) when it reaches PostgreSQL
    itself, and say whether it did. A pooler (PgBouncer) gives its client a backend key of its own,
    so the process id psycopg was told differs from the one that answers: no prepared statements
    there (another transaction may run on another server connection). Under the fast-path switch
    (`MAILROOM_FAST_PATHS=off`: never)."""
    if not fastpaths.enabled():
        return False
    cur = await conn.execute("SELECT pg_catalog.pg_backend_pid()")
    row = await cur.fetchone()
    if row is None or row[0] != conn.info.backend_pid:
        return False
    conn.prepare_threshold = PREPARE_THRESHOLD
    return True


CONNECT_TIMEOUT = "10"  # seconds: an unreachable server is an answer within this, never a hang
# A silent network loss must surface as an error, not a call hanging for the kernel's two-hour
# default: TCP keepalives unless the URL sets its own (libpq ignores them on unix sockets).
TCP_DEFAULTS = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
                "keepalives_count": "3", "tcp_user_timeout": "30000"}


def with_defaults(url: str) -> str:
    """The URL plus the connect timeout and TCP keepalive defaults for the keys it does not set."""
    try:
        given = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return url  # let connect() report the malformed URL
    missing = {k: v for k, v in {"connect_timeout": CONNECT_TIMEOUT, **TCP_DEFAULTS}.items() if k not in given}
    return make_conninfo(url, **missing) if missing else url


def connection_lost(conn: psycopg.Connection | psycopg.AsyncConnection, exc: BaseException) -> bool:
    """Whether `exc` means the connection is gone, so reconnecting (not giving up) is the answer.

    An OperationalError or InterfaceError, or any error after which psycopg closed the connection:
    PgBouncer reports a server connection that died inside a transaction with two error results,
    which psycopg raises for COMMIT as InternalError ("received 2 results from command 'COMMIT'")."""
    return isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) or conn.closed or conn.broken


class ConnectFailed(UserError):
    """No connection: `kind` says whether waiting helps (Kind.UNAVAILABLE: the server is down or out of
    reach) or not (a wrong password, an unknown database: Kind.DENIED, Kind.CONFIG)."""

    def __init__(self, message: str, kind: Kind) -> None:
        super().__init__(message, kind.exit_code)
        self.kind = kind


def _failed(exc: psycopg.Error) -> ConnectFailed:
    return ConnectFailed(f"cannot connect to the database: {describe_db_error(exc)}", kind_of(exc))


def _read_vocabulary(rows: Any) -> None:
    global _vocabulary_read
    learn_error_codes((r.code, r.kind, r.meaning, r.smtp_reply, r.http_status) for r in rows)
    _vocabulary_read = True


def _vocabulary_unavailable(exc: psycopg.Error) -> None:
    """A login that may not read it: MR codes stay USAGE for this process (a lost connection is retried
    at the next one)."""
    global _vocabulary_read
    if not isinstance(exc, psycopg.OperationalError):
        _vocabulary_read = True


# Whether this database has the vocabulary (a catalog check: no failing call on an older schema, or
# on a database that is not mailroom's, which is asked again at the next connection).
_HAS_VOCABULARY = "SELECT to_regprocedure('mailroom.error_codes()') IS NOT NULL"


def learn_vocabulary(conn: psycopg.Connection) -> None:
    """Read mailroom.error_codes once per process (connect() does it): what each MRnnn SQLSTATE means."""
    if _vocabulary_read:
        return
    try:
        if conn.execute(_HAS_VOCABULARY).fetchone()[0]:
            _read_vocabulary(sqlapi.error_codes.rows(conn))
    except psycopg.Error as exc:
        _vocabulary_unavailable(exc)
    finally:
        if not conn.autocommit and not conn.closed:
            conn.rollback()


async def alearn_vocabulary(conn: psycopg.AsyncConnection) -> None:
    """Async twin of learn_vocabulary()."""
    if _vocabulary_read:
        return
    try:
        if (await (await conn.execute(_HAS_VOCABULARY)).fetchone())[0]:
            _read_vocabulary(await sqlapi.error_codes.arows(conn))
    except psycopg.Error as exc:
        _vocabulary_unavailable(exc)
    finally:
        if not conn.autocommit and not conn.closed:
            await conn.rollback()


def connect(url: str, *, autocommit: bool = True, application_name: str = "mailroom", **extra: Any) -> psycopg.Connection:
    """Open a connection or raise UserError naming what went wrong (no password echoed); the first one
    of a process also reads the error vocabulary."""
    try:
        conn = psycopg.connect(with_defaults(url),
                               **connection_kwargs(autocommit=autocommit, application_name=application_name, **extra))
    except psycopg.Error as exc:
        raise _failed(exc) from None
    learn_vocabulary(conn)
    return conn


async def connect_async(
    url: str, *, autocommit: bool = True, application_name: str = "mailroom", **extra: Any
) -> psycopg.AsyncConnection:
    """Async twin of connect()."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            with_defaults(url), **connection_kwargs(autocommit=autocommit, application_name=application_name, **extra)
        )
    except psycopg.Error as exc:
        raise _failed(exc) from None
    await alearn_vocabulary(conn)
    return conn


def print_notice(diag: psycopg.errors.Diagnostic) -> None:
    """What SQL says besides its result (RAISE NOTICE / WARNING: a TTL clamped, recipients dropped),
    one line on stderr: `mailroom: notice: …`."""
    severity = (diag.severity_nonlocalized or diag.severity or "notice").lower()
    print(f"mailroom: {severity}: {' '.join((diag.message_primary or '').split())}", file=sys.stderr)


def call_once(url: str, fn: SqlFunction, /, *, application_name: str, **kwargs: Any) -> list[Any]:
    """One contract call (mailroom.db.contract) on a short-lived connection, for operator commands:
    its rows (named tuples), or UserError with the one line and exit code of its kind. What SQL
    says on the way (NOTICE, WARNING) goes to stderr."""
    with connect(url, application_name=application_name) as conn:
        conn.add_notice_handler(print_notice)
        try:
            return fn.rows(conn, **kwargs)
        except psycopg.Error as exc:
            raise db_user_error(exc) from None


def granted_roles(conn: psycopg.Connection) -> set[str]:
    """The mailroom_* group roles the login of `conn` is a member of (a catalog probe: `mailroom run`
    checks each worker's login before starting it)."""
    row = conn.execute(
        "SELECT array(SELECT g.rolname::text FROM pg_catalog.pg_roles AS g WHERE g.rolname LIKE 'mailroom\\_%%'"
        " AND pg_catalog.pg_has_role(current_user, g.oid, 'MEMBER'))"
    ).fetchone()
    return set(row[0]) if row else set()


def ping(conn: psycopg.Connection) -> None:
    """A round trip that proves the connection alive (raises when it is not): the liveness check."""
    conn.execute("SELECT 1")


class StaleConnection(Exception):
    """A pooled connection failed its liveness check: nothing was sent, a retry is safe."""


def _has_pending_input(conn: psycopg.AsyncConnection) -> bool:
    """Whether an idle pooled connection's socket is readable (or unusable): the sign that the server
    sent it something, i.e. ended it (pg_terminate_backend, shutdown, crash). No round trip."""
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


async def ensure_alive(conn: psycopg.AsyncConnection) -> None:
    """Before anything is sent on a pooled connection: raise StaleConnection if the server ended
    it. An idle connection has nothing to read unless the server ended it (a FATAL message, then
    EOF): only then pay a round trip to find out."""
    if _has_pending_input(conn):
        try:
            await conn.execute("")  # liveness check: fails only before anything is sent
        except psycopg.OperationalError as exc:
            raise StaleConnection(describe_db_error(exc)) from None
