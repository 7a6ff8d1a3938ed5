"""The driver's SQL contract (mailroom.db.contract) against a migrated catalog: they cannot drift.

Every SqlFunction declared in an area's `sqlapi.py` must name a function of schema mailroom with
exactly its input parameters (names, types, which have defaults), its result type, and a statement
that PostgreSQL accepts (parse analysis resolves the overload and the result columns).
"""

from __future__ import annotations

import ast
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from mailroom import testing
from mailroom.db import contract

CATALOG = """
SELECT coalesce(p.proargnames, '{}') AS names,
       coalesce(p.proargmodes::text[], array_fill('i'::text, ARRAY[p.pronargs])) AS modes,
       array(SELECT format_type(t.oid, NULL) FROM unnest(coalesce(p.proallargtypes, p.proargtypes::oid[]))
             WITH ORDINALITY AS t (oid, n) ORDER BY t.n) AS types,
       p.pronargs, p.pronargdefaults, format_type(p.prorettype, NULL) AS returns, p.proretset
FROM pg_proc AS p
WHERE p.pronamespace = 'mailroom'::regnamespace AND p.proname = %s
"""


# the attributes of a composite type made by CREATE TYPE (not a table's row type), in order
ATTRIBUTES = """
SELECT a.attname
FROM pg_type AS t
JOIN pg_class AS c ON c.oid = t.typrelid AND c.relkind = 'c'
JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE t.oid = %s::regtype
ORDER BY a.attnum
"""


def _attributes(conn: psycopg.Connection, type_name: str) -> list[str]:
    return [name for (name,) in conn.execute(ATTRIBUTES, (type_name,)).fetchall()]


def _normalized(conn: psycopg.Connection, type_name: str) -> str:
    return conn.execute("SELECT format_type(%s::regtype, NULL)", (type_name,)).fetchone()[0]


def _signature(conn: psycopg.Connection, fn: contract.SqlFunction) -> list[tuple[str, str, bool]]:
    return [(p.sql_name, _normalized(conn, p.type), p.optional) for p in fn.params]


def _overloads(conn: psycopg.Connection, fn: contract.SqlFunction) -> list[dict]:
    found = []
    for names, modes, types, nargs, ndefaults, returns, retset in conn.execute(CATALOG, (fn.name,)).fetchall():
        inputs = [(n, t) for n, m, t in zip(names, modes, types, strict=False) if m in ("i", "b", "v")]
        found.append({
            "inputs": [(n, t, i >= nargs - ndefaults) for i, (n, t) in enumerate(inputs)],
            "returns": returns,
            "setof": retset,
        })
    return found


def _prepare(conn: psycopg.Connection, fn: contract.SqlFunction) -> None:
    """Parse analysis of the generated statement (nothing runs): the overload and the columns resolve."""
    names: list[str] = []

    def number(match: re.Match) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    query = re.sub(r"%\((\w+)\)[sb]", number, fn.statement())
    result = conn.pgconn.prepare(f"contract_{fn.name}".encode(), query.encode())
    message = result.error_message.decode(errors="replace").strip()
    assert result.status == psycopg.pq.ExecStatus.COMMAND_OK, f"{fn.qualified}: {message}"
    conn.pgconn.exec_(f"DEALLOCATE contract_{fn.name}".encode())


def test_the_contract_declares_the_drivers_calls() -> None:
    declared = contract.declarations()
    assert declared, "no SqlFunction declared: is any area's sqlapi.py importable?"
    names = [fn.name for fn in declared]
    assert len(names) == len(set(names)), "a function is declared twice"


@pytest.fixture(scope="module")
def catalog(pg, template_db: str) -> Iterator[psycopg.Connection]:
    """One migrated database for the module's catalog reads (they change nothing: parse analysis only),
    instead of a clone per declaration: 150-odd CREATE/DROP DATABASE less per run."""
    name = f"t_contract_{uuid.uuid4().hex[:8]}"
    url = testing.create_database(pg, name, template=template_db)
    try:
        with psycopg.connect(url, autocommit=True) as connection:
            yield connection
    finally:
        testing.drop_database(pg, name)


@pytest.mark.parametrize("fn", contract.declarations(), ids=lambda fn: fn.name)
def test_declaration_matches_the_catalog(catalog: psycopg.Connection, fn: contract.SqlFunction) -> None:
    conn = catalog
    overloads = _overloads(conn, fn)
    assert overloads, f"{fn.qualified} does not exist"
    wanted = _signature(conn, fn)
    match = [o for o in overloads if o["inputs"] == wanted]
    assert match, f"{fn.qualified}: declared ({wanted}) but the catalog has {[o['inputs'] for o in overloads]}"
    found = match[0]
    if fn.columns:
        assert found["setof"] or found["returns"] == "record" or found["returns"].startswith("mailroom."), (
            f"{fn.qualified} returns {found['returns']}, declared as rows")
        attributes = _attributes(conn, found["returns"]) if found["returns"] != "record" else []
        if attributes:
            # a row type of its own (mailroom.claimed_message): the declaration is its attributes, in order
            assert list(fn.columns) == attributes, (
                f"{fn.qualified} returns {found['returns']} ({', '.join(attributes)}); declared {', '.join(fn.columns)}")
    else:
        assert found["returns"] == _normalized(conn, fn.returns), f"{fn.qualified} returns {found['returns']}"
        assert found["setof"] == fn.setof, f"{fn.qualified}: setof is {found['setof']}"
    _prepare(conn, fn)


def test_the_claims_row_is_one_type(catalog: psycopg.Connection) -> None:
    """Issue 36: the claim's row is mailroom.claimed_message, declared once in Python (CLAIMED_MESSAGE):
    a column added to the type without the declaration, or the other way round, fails here."""
    conn = catalog
    from mailroom.outbound import sqlapi

    assert list(sqlapi.CLAIMED_MESSAGE) == _attributes(conn, "mailroom.claimed_message")
    assert sqlapi.claim_messages.columns == sqlapi.CLAIMED_MESSAGE
    # finalize_and_claim carries the same row whole, in its column message
    (message_type,) = conn.execute(
        "SELECT format_type(t, NULL) FROM pg_proc AS p, unnest(p.proallargtypes, p.proargnames) AS a (t, n)"
        " WHERE p.oid = 'mailroom.finalize_and_claim'::regproc AND a.n = 'message'"
    ).fetchone()
    assert message_type == "mailroom.claimed_message"
    assert "message" in sqlapi.finalize_and_claim.columns


def test_calls_are_checked_before_anything_is_sent() -> None:
    fn = contract.SqlFunction("contract_example", "p_limit integer, p_lease interval = default", returns="integer")
    contract.REGISTRY.remove(fn)  # a throwaway declaration, not part of the driver's contract
    assert fn.statement(["limit"]) == "SELECT mailroom.contract_example(p_limit => %(limit)s::integer)"
    with pytest.raises(TypeError, match="missing limit"):
        fn.statement(["lease"])
    with pytest.raises(TypeError, match="no parameter limt"):
        fn.statement(["limt"])
    each = fn.each_statement(["limit"], ["lease"])
    assert "unnest(%(limit__each)s::integer[])" in each and "p_lease => %(lease)s::interval" in each
    bulk = contract.SqlFunction("contract_bulk", "p_raw bytea[], p_n integer", binary=("raw",))
    contract.REGISTRY.remove(bulk)
    assert bulk.statement() == "SELECT mailroom.contract_bulk(p_raw => %(raw)b::bytea[], p_n => %(n)s::integer)"
    with pytest.raises(ValueError, match="binary names no parameter"):
        contract.SqlFunction("contract_bulk", "p_raw bytea[]", binary=("rwa",))


def test_each_calls_once_per_row_in_order(conn: psycopg.Connection) -> None:
    fn = contract.SqlFunction("setting", "p_name text", returns="text")
    contract.REGISTRY.remove(fn)
    names = ["tokens.channel", "inbox.domain", "tokens.channel"]
    assert fn.each(conn, [{"name": n} for n in names]) == [fn.value(conn, name=n) for n in names]
    with pytest.raises(psycopg.Error) as info:
        fn.value(conn, name="no.such.setting")
    assert info.value.sqlstate == "MR001"


# Where SQL text may stand in driver/: the contract itself and the areas' declarations, db/ (transport
# and admin: LISTEN, liveness, migrate's bookkeeping, the cluster), doctor's catalog probes, the test harness.
SQL_TEXT_ALLOWED = ("db/", "ops/probes.py", "testing.py")
_SQL_START = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CALL)\s")


def _sql_text(path: Path) -> list[str]:
    """Statements a module writes itself: `.execute(...)` calls and string constants that start like SQL."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "execute", "executemany", "copy", "exec_"):
            found.append(f"{path.name}:{node.lineno}: .{node.func.attr}(…)")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL_START.match(node.value):
            found.append(f"{path.name}:{node.lineno}: {node.value[:40]!r}")
    return found


def test_no_sql_text_outside_the_contract() -> None:
    root = Path(contract.__file__).resolve().parents[1]  # driver/mailroom
    offenders = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(SQL_TEXT_ALLOWED) or relative.endswith("sqlapi.py"):
            continue
        offenders += _sql_text(path)
    assert offenders == [], "SQL text outside mailroom.db.contract declarations:\n" + "\n".join(offenders)
