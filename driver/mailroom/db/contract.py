"""The contract between the driver and the SQL API: every SQL function the driver calls, declared once.

An area declares the functions it calls in its `sqlapi.py`, with their full SQL signature:

    dequeue_tokens = SqlFunction("dequeue_tokens", "p_limit integer", returns=("action", "login", "signed"))
    purge_sent_messages = SqlFunction("purge_sent_messages", "p_before timestamptz, p_batch integer = default",
                                      returns="integer")

and calls them with keyword arguments named after the SQL parameters without their `p_` prefix:

    rows = sqlapi.dequeue_tokens.rows(conn, limit=100)            # list of named tuples
    n = sqlapi.purge_sent_messages.value(conn, before=cutoff)     # one value
    rows = await sqlapi.finalize_messages.arows(aconn, ids=[...], ...)
    rows = sqlapi.deliver_message.each(conn, [{"address": a} for a in rcpts], raw=raw, ...)  # one statement, many calls

The statement uses named notation with an explicit cast for every argument
(`SELECT … FROM mailroom.dequeue_tokens(p_limit => %(limit)s::integer)`), so an argument renamed
or retyped in SQL fails at the call, never silently binds to another overload; a keyword the
declaration does not name, or a required one left out, is a TypeError before anything is sent.
`tests/db/test_contract.py` checks every declaration against a migrated catalog (function name,
argument names, types and defaults, the result's type or columns, and that the statement plans):
the contract and the schema cannot drift.

Only this layer holds SQL text that names mailroom's API. Transport and admin statements (LISTEN, a
liveness check, the migration runner's own bookkeeping, cluster admin) stay in `db/`, and the catalog
probes of `mailroom doctor` (pg_roles, pg_settings, session state) in `ops/probes.py`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection, Connection
from psycopg.errors import InsufficientPrivilege
from psycopg.rows import namedtuple_row

from mailroom.core.errors import is_upgrade_condition

SCHEMA = "mailroom"

# Every declaration, in import order: what tests/db/test_contract.py checks against the catalog.
REGISTRY: list[SqlFunction] = []

_PARAM = re.compile(r"^\s*(p_[a-z0-9_]+)\s+(.+?)(\s*=\s*default)?\s*$", re.IGNORECASE)
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class Param:
    """One input parameter of a SQL function, as declared."""

    sql_name: str  # p_limit
    type: str  # integer, bigint[], mailroom.token_action
    optional: bool  # the SQL function has a DEFAULT for it: a call may leave it out

    @property
    def name(self) -> str:
        """The Python keyword: the SQL name without its `p_` prefix."""
        return self.sql_name[2:]


def _parse_params(text: str) -> tuple[Param, ...]:
    params: list[Param] = []
    for part in filter(str.strip, text.split(",")):
        match = _PARAM.match(part)
        if not match:
            raise ValueError(f"cannot read parameter {part.strip()!r}: expected 'p_name type [= default]'")
        params.append(Param(match.group(1).lower(), match.group(2).strip(), bool(match.group(3))))
    seen_optional = False
    for p in params:
        if seen_optional and not p.optional:
            raise ValueError(f"{p.sql_name}: a required parameter after an optional one")
        seen_optional = seen_optional or p.optional
    return tuple(params)


class SqlFunction:
    """A function of the SQL API as the driver calls it; see the module docstring."""

    def __init__(self, name: str, params: str = "", *, returns: str | Sequence[str] = "void", setof: bool = False,
                 binary: Iterable[str] = ()):
        """`name`: the function in schema mailroom. `params`: its full input signature, in order,
        'p_name type' with '= default' where SQL has a default. `returns`: 'void', a type (one value
        per row), or the names of the result columns the driver reads (rows). `setof`: a scalar
        function returning a set (rows of one value). `binary`: parameters sent in binary format
        (`%(name)b`: a bytea[] or jsonb[] of a hot path, not escaped into text on either side)."""
        if not _IDENT.match(name):
            raise ValueError(f"bad function name {name!r}")
        self.name = name
        self.qualified = f"{SCHEMA}.{name}"
        self.params = _parse_params(params)
        self.by_name = {p.name: p for p in self.params}
        self.binary = frozenset(binary)
        if self.binary - self.by_name.keys():
            raise ValueError(f"{name}: binary names no parameter: {sorted(self.binary - self.by_name.keys())}")
        if isinstance(returns, str):
            self.columns: tuple[str, ...] = ()
            self.returns = returns
        else:
            self.columns = tuple(returns)
            self.returns = "record"
            for column in self.columns:
                if not _IDENT.match(column):
                    raise ValueError(f"{name}: bad result column {column!r}")
        self.setof = setof or bool(self.columns)
        self._statements: dict[frozenset[str], str] = {}
        REGISTRY.append(self)

    def __repr__(self) -> str:
        return f"SqlFunction({self.qualified})"

    # -- statements ---------------------------------------------------------------------------

    def _select(self, call: str) -> str:
        if self.columns:
            return f"SELECT {', '.join(self.columns)} FROM {call}"
        return f"SELECT {call}"

    def _check(self, given: Iterable[str]) -> frozenset[str]:
        given = frozenset(given)
        unknown = given - self.by_name.keys()
        if unknown:
            raise TypeError(f"{self.qualified}: no parameter {', '.join(sorted(unknown))}")
        missing = [p.name for p in self.params if not p.optional and p.name not in given]
        if missing:
            raise TypeError(f"{self.qualified}: missing {', '.join(missing)}")
        return given

    def statement(self, given: Iterable[str] | None = None) -> str:
        """The SQL text for a call passing `given` (default: every parameter)."""
        names = self._check(self.by_name if given is None else given)
        text = self._statements.get(names)
        if text is None:
            args = ", ".join(f"{p.sql_name} => %({p.name}){'b' if p.name in self.binary else 's'}::{p.type}"
                             for p in self.params if p.name in names)
            text = self._statements[names] = self._select(f"{self.qualified}({args})")
        return text

    def each_statement(self, per_row: Sequence[str], shared: Iterable[str]) -> str:
        """The SQL text of `each`: one call per element of the `per_row` arrays, in order."""
        per_row = list(per_row)
        names = self._check([*per_row, *shared])
        for name in per_row:
            if self.by_name[name].type.endswith("]"):
                raise TypeError(f"{self.qualified}: {name} is an array; it cannot vary per row")
        arrays = ", ".join(f"%({n}__each)s::{self.by_name[n].type}[]" for n in per_row)
        columns = ", ".join(f"{n}__each" for n in per_row)
        args = ", ".join(
            f"{p.sql_name} => " + (f"u.{p.name}__each" if p.name in per_row else f"%({p.name})s::{p.type}")
            for p in self.params
            if p.name in names
        )
        source = f"unnest({arrays}) WITH ORDINALITY AS u ({columns}, n__each)"
        if self.columns:
            return (f"SELECT {', '.join('r.' + c for c in self.columns)} FROM {source}"
                    f" CROSS JOIN LATERAL {self.qualified}({args}) AS r ORDER BY u.n__each")
        return f"SELECT {self.qualified}({args}) FROM {source} ORDER BY u.n__each"

    # -- sync calls ---------------------------------------------------------------------------

    def _execute(self, cur: Any, query: str, params: Mapping[str, Any]) -> None:
        try:
            cur.execute(query, params)
        except InsufficientPrivilege as exc:
            _name_roles(cur.connection, exc, self.name)
            raise

    async def _aexecute(self, cur: Any, query: str, params: Mapping[str, Any]) -> None:
        try:
            await cur.execute(query, params)
        except InsufficientPrivilege as exc:
            await _aname_roles(cur.connection, exc, self.name)
            raise
        except psycopg.Error as exc:
            if is_upgrade_condition(exc):
                await forget_prepared(cur.connection)
            raise

    def rows(self, conn: Connection, /, **kwargs: Any) -> list[Any]:
        """Every result row (named tuples: by attribute or by position)."""
        with conn.cursor(row_factory=namedtuple_row) as cur:
            self._execute(cur, self.statement(kwargs), kwargs)
            return cur.fetchall()

    def row(self, conn: Connection, /, **kwargs: Any) -> Any:
        """The first result row, or None."""
        with conn.cursor(row_factory=namedtuple_row) as cur:
            self._execute(cur, self.statement(kwargs), kwargs)
            return cur.fetchone()

    def value(self, conn: Connection, /, **kwargs: Any) -> Any:
        """The first column of the first row (None when there is no row)."""
        with conn.cursor() as cur:
            self._execute(cur, self.statement(kwargs), kwargs)
            row = cur.fetchone()
            return None if row is None else row[0]

    def call(self, conn: Connection, /, **kwargs: Any) -> None:
        """Run it for its effect."""
        with conn.cursor() as cur:
            self._execute(cur, self.statement(kwargs), kwargs)

    def each(self, conn: Connection, rows: Sequence[Mapping[str, Any]], /, **shared: Any) -> list[Any]:
        """One statement calling the function once per mapping of `rows` (the keys that vary), with
        the `shared` keywords for every call; the results in the order of `rows` (one row per
        call for a scalar function; a row function's rows, call after call)."""
        query, params = self._each(rows, shared)
        with conn.cursor(row_factory=namedtuple_row) as cur:
            self._execute(cur, query, params)
            return cur.fetchall() if self.columns else [r[0] for r in cur.fetchall()]

    # -- async calls --------------------------------------------------------------------------

    async def arows(self, conn: AsyncConnection, /, **kwargs: Any) -> list[Any]:
        async with conn.cursor(row_factory=namedtuple_row) as cur:
            await self._aexecute(cur, self.statement(kwargs), kwargs)
            return await cur.fetchall()

    async def arow(self, conn: AsyncConnection, /, **kwargs: Any) -> Any:
        async with conn.cursor(row_factory=namedtuple_row) as cur:
            await self._aexecute(cur, self.statement(kwargs), kwargs)
            return await cur.fetchone()

    async def avalue(self, conn: AsyncConnection, /, **kwargs: Any) -> Any:
        async with conn.cursor() as cur:
            await self._aexecute(cur, self.statement(kwargs), kwargs)
            row = await cur.fetchone()
            return None if row is None else row[0]

    async def acall(self, conn: AsyncConnection, /, **kwargs: Any) -> None:
        async with conn.cursor() as cur:
            await self._aexecute(cur, self.statement(kwargs), kwargs)

    async def aeach(self, conn: AsyncConnection, rows: Sequence[Mapping[str, Any]], /, **shared: Any) -> list[Any]:
        query, params = self._each(rows, shared)
        async with conn.cursor(row_factory=namedtuple_row) as cur:
            await self._aexecute(cur, query, params)
            found = await cur.fetchall()
            return found if self.columns else [r[0] for r in found]

    def _each(self, rows: Sequence[Mapping[str, Any]], shared: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        per_row = list(rows[0]) if rows else []
        for r in rows:
            if list(r) != per_row:
                raise TypeError(f"{self.qualified}: every row of each() must name the same keys")
        params: dict[str, Any] = dict(shared)
        for name in per_row:
            params[f"{name}__each"] = [r[name] for r in rows]
        return self.each_statement(per_row, shared), params


# Which of mailroom's group roles may execute a function of the API: the grants in the catalog,
# asked when a call was refused (42501), so the error names the role that would allow it.
_ROLES_ALLOWED = """
SELECT coalesce(array_agg(g.rolname ORDER BY g.rank), '{}')
FROM (
    SELECT DISTINCT r.rolname::text AS rolname,
        -- the least a caller needs first: the read-only monitor, the workers' roles, the admin last
        array_position(ARRAY['mailroom_monitor', 'mailroom_app', 'mailroom_collector', 'mailroom_sender',
                             'mailroom_inbound', 'mailroom_timekeeper', 'mailroom_admin'], r.rolname::text) AS rank
    FROM pg_catalog.pg_proc AS p
    CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS a
    INNER JOIN pg_catalog.pg_roles AS r ON a.grantee = r.oid
    WHERE p.pronamespace = (SELECT n.oid FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'mailroom')
        AND p.proname = %s AND a.privilege_type = 'EXECUTE' AND r.rolname LIKE 'mailroom\\_%%'
        AND r.rolname <> 'mailroom_owner'
) AS g
"""


def _note_roles(exc: InsufficientPrivilege, name: str, roles: list[str] | None, login: str | None) -> None:
    """What mailroom.core.errors.describe_db_error appends to a refused call: the role that allows it."""
    primary = getattr(exc.diag, "message_primary", None) or ""
    if "schema mailroom" in primary:
        exc.mailroom_hint = (f"{login or 'this login'} is granted no mailroom_* group role "  # type: ignore[attr-defined]
                             "(docs/security.md lists what each may do)")
    elif roles:
        grant = " or ".join(roles)
        exc.mailroom_hint = (f"mailroom.{name} needs the group role {grant}: "  # type: ignore[attr-defined]
                             f"GRANT {roles[0]} TO {login or '<login>'}")


def _name_roles(conn: Connection, exc: InsufficientPrivilege, name: str) -> None:
    roles = None
    if conn.autocommit and not conn.closed:  # (in a failed transaction nothing more can be asked)
        try:
            roles = conn.execute(_ROLES_ALLOWED, (name,)).fetchone()[0]
        except Exception:  # noqa: BLE001 - the refusal itself is what the caller must see
            roles = None
    _note_roles(exc, name, roles, conn.info.user)


async def _aname_roles(conn: AsyncConnection, exc: InsufficientPrivilege, name: str) -> None:
    roles = None
    if conn.autocommit and not conn.closed:
        try:
            cur = await conn.execute(_ROLES_ALLOWED, (name,))
            roles = (await cur.fetchone())[0]
        except Exception:  # noqa: BLE001
            roles = None
    _note_roles(exc, name, roles, conn.info.user)


def declarations() -> list[SqlFunction]:
    """Every SqlFunction of the driver: imports each area's `sqlapi` module, then the registry."""
    import importlib
    import pkgutil

    import mailroom

    for info in pkgutil.walk_packages(mailroom.__path__, "mailroom."):
        if info.name.rsplit(".", 1)[-1] == "sqlapi":
            importlib.import_module(info.name)
    return list(REGISTRY)


async def forget_prepared(conn: AsyncConnection) -> None:
    """After a call met the schema changing under it (`db migrate`: a function re-created with another
    result, "cached plan must not change result type"), drop the connection's prepared statements so
    the retry plans afresh; psycopg forgets its own when it sees DEALLOCATE ALL succeed. Inside a
    transaction (failed) nothing is sent: its ROLLBACK makes psycopg deallocate them."""
    if conn.prepare_threshold is None or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return
    try:
        await conn.execute("DEALLOCATE ALL")
    except psycopg.Error:
        pass  # the connection is gone or broken: the pool discards it
