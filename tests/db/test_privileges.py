"""The privilege matrix, derived (issue 36, item 4): the GRANT lines of sql/ are the declaration.

Each function's grants are written once, in its `sql/` file right after its COMMENT:
`GRANT EXECUTE ON FUNCTION mailroom.f(argument types) TO mailroom_<role>[, …];` (docs/architecture.md,
"How grants are declared"). This file parses those lines from the repository's own sql/ files and
compares them with a migrated catalog, for every function of schemas mailroom and mailroom_internal
and every runtime role (has_function_privilege, so a role's memberships count: mailroom_admin
executes what is granted to mailroom_monitor):

- every declared grant names an existing function of schema mailroom, and holds;
- nothing else is executable by any runtime role;
- PUBLIC executes nothing, nothing in mailroom_internal is granted, and no runtime role (nor PUBLIC)
  has USAGE on schema mailroom_internal;
- every function of mailroom has at least one grant, or is listed in OWNER_ONLY with its reason;
- the views a runtime role reads are the declared `GRANT SELECT ON mailroom.<view>` lines.

pgTAP (tests/pgtap/05_privileges.sql) keeps only the invariants that need no list of names.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

from mailroom import testing

# Functions of schema mailroom that no runtime role may call, and why (each one reviewed).
OWNER_ONLY = {
    "redact_pii": "a tag oracle for the redaction pepper: the error_log trigger and the owner's "
    "functions call it, no runtime role may (docs/security.md)",
}

SCHEMAS = ("mailroom", "mailroom_internal")

_DOLLAR_QUOTED = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$.*?\$\1\$", re.S)
_COMMENT = re.compile(r"--[^\n]*")
_GRANT_EXECUTE = re.compile(
    r"\bGRANT\s+EXECUTE\s+ON\s+(?:FUNCTION|PROCEDURE|ROUTINE)\s+(.+?)\s+TO\s+([^;]+);", re.S | re.I
)
_GRANT_SELECT = re.compile(r"\bGRANT\s+SELECT\s+ON\s+(?:TABLE\s+)?([\w.]+)\s+TO\s+([^;]+);", re.S | re.I)
_REVOKE_FROM_ROLE = re.compile(r"\bREVOKE\s[^;]*?\bFROM\s+mailroom_\w+", re.S | re.I)


def _top_level(text: str) -> str:
    """A file's statements without function bodies and comments (a GRANT is a statement of its own)."""
    return _COMMENT.sub("", _DOLLAR_QUOTED.sub("", text))


def _split_top(text: str) -> list[str]:
    """`a(x, y), b(z)` -> ['a(x, y)', 'b(z)']."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [" ".join(p.split()) for p in parts if p.strip()]


def declared(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]], list[str]]:
    """(function signature -> roles, relation -> roles, problems) from the GRANT lines of root/sql/*.sql."""
    functions: dict[str, set[str]] = {}
    relations: dict[str, set[str]] = {}
    problems: list[str] = []
    for path in sorted((root / "sql").glob("*.sql")):
        text = _top_level(path.read_text(encoding="utf-8"))
        for m in _GRANT_EXECUTE.finditer(text):
            for sig in _split_top(m.group(1)):
                functions.setdefault(sig, set()).update(_split_top(m.group(2)))
        for m in _GRANT_SELECT.finditer(text):
            relations.setdefault(m.group(1), set()).update(_split_top(m.group(2)))
        problems += [f"sql/{path.name}: a REVOKE from a runtime role ({m.group(0)[:60]}…): declare grants only"
                     for m in _REVOKE_FROM_ROLE.finditer(text)]
    return functions, relations, problems


def runtime_roles(conn: psycopg.Connection) -> list[str]:
    """mailroom's group roles but the owner (mailroom_app, _http, … , _timekeeper)."""
    return [r for (r,) in conn.execute(
        "SELECT rolname FROM pg_roles WHERE rolname ~ '^mailroom_' AND NOT rolcanlogin"
        " AND rolname <> 'mailroom_owner' ORDER BY 1")]


def mismatches(conn: psycopg.Connection, root: Path) -> list[str]:
    """Every difference between the declaration in root/sql/ and the catalog conn is connected to."""
    functions, relations, problems = declared(root)
    roles = runtime_roles(conn)
    members = {(r, g) for r, g in conn.execute(
        "SELECT r.rolname, g.rolname FROM pg_roles AS r, pg_roles AS g"
        " WHERE r.rolname = ANY(%s) AND g.rolname = ANY(%s) AND pg_has_role(r.oid, g.oid, 'USAGE')",
        (roles, roles))}
    expected: dict[int, set[str]] = {}
    for sig, grantees in functions.items():
        oid, schema = conn.execute(
            "SELECT p.oid::int, p.pronamespace::regnamespace::text FROM pg_proc AS p"
            " WHERE p.oid = to_regprocedure(%s)", (sig,)).fetchone() or (None, None)
        if oid is None:
            problems.append(f"GRANT on {sig}: no such function")
            continue
        if schema != "mailroom":
            problems.append(f"GRANT on {sig}: a grant outside schema mailroom")
        unknown = grantees - set(roles)
        if unknown:
            problems.append(f"GRANT on {sig} to {', '.join(sorted(unknown))}: not a runtime role")
        expected.setdefault(oid, set()).update(r for r in roles for g in grantees if (r, g) in members)

    for oid, sig, name, schema, public in conn.execute(
        """SELECT p.oid::int, p.oid::regprocedure::text, p.proname, p.pronamespace::regnamespace::text,
                  EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a
                          WHERE a.grantee = 0)
           FROM pg_proc AS p WHERE p.pronamespace::regnamespace::text = ANY(%s) ORDER BY 2""",
        (list(SCHEMAS),)):
        can = {r for (r,) in conn.execute(
            "SELECT r FROM unnest(%s::text[]) AS r WHERE has_function_privilege(r, %s::oid, 'EXECUTE')",
            (roles, oid))}
        want = expected.get(oid, set())
        if public:
            problems.append(f"{sig}: executable by PUBLIC")
        for role in sorted(can - want):
            problems.append(f"{sig}: {role} may execute it, and sql/ declares no such grant")
        for role in sorted(want - can):
            problems.append(f"{sig}: declared for {role} in sql/, not granted in the catalog")
        if schema == "mailroom" and not want and name not in OWNER_ONLY:
            problems.append(f"{sig}: no grant: a public function needs one, or an entry in OWNER_ONLY with its reason")
        if schema == "mailroom_internal" and name in OWNER_ONLY:
            problems.append(f"{sig}: in OWNER_ONLY, but internal (the list is for schema mailroom)")
    problems += [f"OWNER_ONLY names {name}, which is not a function of schema mailroom" for name in sorted(OWNER_ONLY)
                 if not conn.execute("SELECT 1 FROM pg_proc WHERE pronamespace = 'mailroom'::regnamespace"
                                     " AND proname = %s", (name,)).fetchone()]

    # the schema of the internals: nobody but its owner uses it
    problems += [f"schema mailroom_internal: {who} has USAGE" for (who,) in conn.execute(
        "SELECT r FROM unnest(%s::text[] || 'public'::text) AS r"
        " WHERE has_schema_privilege(r, 'mailroom_internal', 'USAGE')", (roles,))]

    # relations: only the declared SELECT grants (on views)
    wanted_rel = {(rel, r) for rel, grantees in relations.items()
                  for r in roles for g in grantees if (r, g) in members}
    for rel, role in conn.execute(
        """SELECT c.oid::regclass::text, r FROM pg_class AS c, unnest(%s::text[] || 'public'::text) AS r
           WHERE c.relnamespace = 'mailroom'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
               AND has_table_privilege(r, c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
           ORDER BY 1, 2""", (roles,)):
        if (rel, role) not in wanted_rel:
            problems.append(f"{rel}: {role} has a privilege on it, and sql/ declares no such grant")
    for rel, role in sorted(wanted_rel):
        if not conn.execute("SELECT has_table_privilege(%s, %s, 'SELECT')", (role, rel)).fetchone()[0]:
            problems.append(f"{rel}: declared readable by {role} in sql/, not in the catalog")
    return problems


def test_the_declared_grants_are_the_catalog(conn: psycopg.Connection) -> None:
    functions, relations, problems = declared(testing.checkout_root())
    assert len(functions) > 100 and relations, "the parser finds the GRANT lines of sql/"
    assert not problems, problems
    assert mismatches(conn, testing.checkout_root()) == []


def test_an_undeclared_grant_fails_the_check(conn: psycopg.Connection) -> None:
    """The check can fail: a grant made in the catalog and not declared in sql/, a lost grant, an
    internal function granted, USAGE on the internal schema, and a public function with no grant."""
    conn.execute("GRANT EXECUTE ON FUNCTION mailroom.set_setting(text, text) TO mailroom_app")
    conn.execute("REVOKE EXECUTE ON FUNCTION mailroom.claim_messages(integer, text, interval) FROM mailroom_sender")
    conn.execute("GRANT EXECUTE ON FUNCTION mailroom_internal._hmac(bytea, bytea, text) TO mailroom_admin")
    conn.execute("GRANT USAGE ON SCHEMA mailroom_internal TO mailroom_app")
    conn.execute("CREATE FUNCTION mailroom.undeclared() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    conn.execute("REVOKE ALL ON FUNCTION mailroom.undeclared() FROM public")
    found = mismatches(conn, testing.checkout_root())
    assert "mailroom.set_setting(text,text): mailroom_app may execute it, and sql/ declares no such grant" in found
    assert ("mailroom.claim_messages(integer,text,interval): declared for mailroom_sender in sql/, "
            "not granted in the catalog") in found
    assert any(p.startswith("mailroom_internal._hmac(bytea,bytea,text): mailroom_admin may execute") for p in found)
    assert "schema mailroom_internal: mailroom_app has USAGE" in found
    assert any(p.startswith("mailroom.undeclared(): no grant") for p in found)
    assert len(found) == 5, found
