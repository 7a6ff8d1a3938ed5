"""`mailroom db verify`: the shipped pgTAP suite, run against a live installation.

The suite is `tests/pgtap/*.sql`, shipped in the wheel as the resource package `mailroom.db.pgtap`
(pyproject.toml). Each file is one transaction that rolls back (BEGIN … ROLLBACK), makes the rows
it asserts on and asserts on those alone, so it may run on a production database:

- before a file runs, its statements are checked: it must open with BEGIN and end with ROLLBACK,
  and nothing in between may end the transaction or act outside it (COMMIT, END, ABORT, PREPARE
  TRANSACTION, VACUUM, CHECKPOINT, ALTER SYSTEM, dblink, …); a file that does is failed unrun;
- while it runs, a statement that leaves the transaction before the final ROLLBACK fails the file;
- every session runs with `lock_timeout` (LOCK_TIMEOUT) and `statement_timeout` (STATEMENT_TIMEOUT):
  a row a live worker holds makes a test fail within the lock timeout, never wait behind it;
- before its ROLLBACK, a file that holds a lock of DDL on a mailroom table (SHARE, SHARE ROW EXCLUSIVE,
  ACCESS EXCLUSIVE: live workers' statements wait for it), also taken inside a function it called, fails.

The runner is psycopg, not pg_prove: no Perl or psql needed on the DBA's machine. It splits each
file into statements as psql would (the one meta-command the suite uses, `\\ir`, is inlined), prints
the TAP rows pgTAP returns, and ends with pg_prove's summary (`Files=N, Tests=M, …` and
`Result: PASS` or `FAIL`).

A file may declare what it needs in a header comment line: `-- verify: needs superuser` (it reads or
does what only a superuser may; SET SESSION AUTHORIZATION and CREATE ROLE are detected), `-- verify:
not on citus: <reason>` (on Citus only CITUS_FILES run at all), `-- verify: not on a live database yet:
<reason>` (it still assumes the data around it, or takes the installation's rows). Files that `SET
[LOCAL] ROLE mailroom_x` need membership of that role. A file whose needs the connected role lacks is
skipped with the reason (TAP `1..0 # SKIP …`), never failed.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import psycopg
from psycopg import pq

from mailroom.core.errors import UserError
from mailroom.db.files import HOME_ENV

LOCK_TIMEOUT = "1s"
STATEMENT_TIMEOUT = "60s"
SUITE_PACKAGE = "mailroom.db.pgtap"

# Statements a verify file may never run: they end the transaction or act outside it
FORBIDDEN = re.compile(
    r"^\s*(COMMIT|END|ABORT|PREPARE\s+TRANSACTION|COMMIT\s+PREPARED|VACUUM|CHECKPOINT|ALTER\s+SYSTEM|"
    r"CREATE\s+DATABASE|DROP\s+DATABASE|CREATE\s+TABLESPACE|CLUSTER|REINDEX|COPY\s+.*\s+TO\s+PROGRAM)\b",
    re.I | re.S,
)
DBLINK = re.compile(r"\bdblink\w*\s*\(|\bpostgres_fdw\b|\bCREATE\s+SERVER\b", re.I)
# A write to every row of a mailroom table locks rows a live worker may need (its finalize would wait)
WHOLE_TABLE = re.compile(r"^\s*(DELETE\s+FROM|UPDATE|TRUNCATE(\s+TABLE)?)\s+(ONLY\s+)?mailroom\w*\.", re.I)
# DDL and ANALYZE on a mailroom object: ACCESS EXCLUSIVE (or SHARE) locks held until the ROLLBACK, and
# ANALYZE writes pg_class's estimates in place (not rolled back)
SCHEMA_CHANGE = re.compile(
    r"^\s*(?:(?:DROP|ALTER|ANALYZE|VACUUM|REINDEX|CLUSTER|COMMENT\s+ON|SECURITY\s+LABEL)\b.*\bmailroom(?:_internal)?\."
    r"|CREATE\s+(?:UNIQUE\s+)?INDEX\b.*?\bON\s+(?:ONLY\s+)?mailroom(?:_internal)?\."
    r"|CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE|VIEW|TRIGGER|TABLE|TYPE|SEQUENCE)\s+mailroom(?:_internal)?\."
    r")",
    re.I | re.S,
)
SUPERUSER_ONLY = re.compile(r"^\s*(SET\s+(LOCAL\s+|SESSION\s+)?SESSION\s+AUTHORIZATION|CREATE\s+(ROLE|USER))\b", re.I)
SET_ROLE = re.compile(r"^\s*SET\s+(?:LOCAL\s+|SESSION\s+)?ROLE\s+([a-z_][a-z0-9_]*)", re.I)
HEADER = re.compile(r"^--\s*verify:\s*(.+?)\s*$", re.M)
TAP_RESULT = re.compile(r"^(not )?ok\b")
TAP_PLAN = re.compile(r"^1\.\.(\d+)")


def suite() -> Traversable:
    """The shipped pgTAP suite (tests/pgtap of the checkout in an editable install), or MAILROOM_HOME's
    tests/pgtap when it has one (as `db migrate` reads MAILROOM_HOME's SQL: mailroom.db.files)."""
    home = os.environ.get(HOME_ENV)
    if home and (Path(home) / "tests" / "pgtap").is_dir():
        return Path(home) / "tests" / "pgtap"
    try:
        return resources.files(SUITE_PACKAGE)
    except ModuleNotFoundError:  # pragma: no cover - a broken install
        raise UserError("this mailroom installation carries no pgTAP suite (mailroom.db.pgtap); reinstall it") from None


def suite_files() -> list[Traversable]:
    return sorted((f for f in suite().iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)


# ----------------------------------------------------------------------------- splitting

def split_statements(text: str, include: Callable[[str], str] | None = None) -> list[str]:
    """The statements of a psql script, as psql sends them: split at top-level semicolons, outside
    quotes, dollar quotes, comments and parentheses; `\\ir FILE` replaced by `include(FILE)`'s
    statements; no other meta-command is allowed."""
    out: list[str] = []
    buf: list[str] = []
    i, n = 0, len(text)
    depth = 0
    at_line_start = True

    def flush() -> None:
        stmt = "".join(buf).strip()
        buf.clear()
        if stmt and not _only_comments(stmt):
            out.append(stmt)

    while i < n:
        c = text[i]
        if at_line_start and c == "\\" and _only_comments("".join(buf)):
            end = text.find("\n", i)
            end = n if end < 0 else end
            meta = text[i:end].split()
            if meta and meta[0] in ("\\ir", "\\i", "\\include_relative", "\\include") and len(meta) == 2 and include:
                out.extend(split_statements(include(meta[1]), include))
            else:
                raise UserError(f"psql meta-command not supported by db verify: {text[i:end].strip()}")
            i = end
            continue
        if c == "\\" and text.startswith("\\gset", i):  # psql's \gset: run the statement, keep its row as variables
            end = text.find("\n", i)
            end = n if end < 0 else end
            flush()
            out.append(text[i:end].strip())
            i = end
            continue
        at_line_start = c == "\n" or (at_line_start and c in " \t")
        if c == "-" and text.startswith("--", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            buf.append(text[i:end])
            i = end
            continue
        if c == "/" and text.startswith("/*", i):
            j, level = i + 2, 1
            while j < n and level:
                if text.startswith("/*", j):
                    level, j = level + 1, j + 2
                elif text.startswith("*/", j):
                    level, j = level - 1, j + 2
                else:
                    j += 1
            buf.append(text[i:j])
            i = j
            continue
        if c in ("'", '"'):
            escapes = c == "'" and i > 0 and text[i - 1] in "eE" and (i < 2 or not (text[i - 2].isalnum() or text[i - 2] == "_"))
            j = i + 1
            while j < n:
                if text[j] == c:
                    if j + 1 < n and text[j + 1] == c:
                        j += 2
                        continue
                    break
                if escapes and text[j] == "\\":
                    j += 2
                    continue
                j += 1
            buf.append(text[i:j + 1])
            i = j + 1
            continue
        if c == "$":
            m = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$", text[i:])
            if m and not (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
                tag = m.group(0)
                end = text.find(tag, i + len(tag))
                end = n if end < 0 else end + len(tag)
                buf.append(text[i:end])
                i = end
                continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth = max(0, depth - 1)
        elif c == ";" and depth == 0:
            buf.append(c)
            flush()
            i += 1
            continue
        buf.append(c)
        i += 1
    flush()
    return out


def substitute(stmt: str, variables: dict[str, str]) -> str:
    """psql's variables in a statement: `:name`, `:'name'` (a literal), `:"name"` (an identifier), outside
    quotes, dollar quotes and comments; `::` casts untouched."""
    if not variables or ":" not in stmt:
        return stmt
    out: list[str] = []
    i, n = 0, len(stmt)
    while i < n:
        c = stmt[i]
        skip = None
        if stmt.startswith("--", i):
            end = stmt.find("\n", i)
            skip = n if end < 0 else end
        elif stmt.startswith("/*", i):
            end = stmt.find("*/", i + 2)
            skip = n if end < 0 else end + 2
        elif c in ("'", '"'):
            j = i + 1
            while j < n and not (stmt[j] == c and not stmt.startswith(c * 2, j)):
                j += 2 if stmt.startswith(c * 2, j) else 1
            skip = j + 1
        elif c == "$" and (m := re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$", stmt[i:])) \
                and not (i and (stmt[i - 1].isalnum() or stmt[i - 1] == "_")):
            end = stmt.find(m.group(0), i + len(m.group(0)))
            skip = n if end < 0 else end + len(m.group(0))
        elif c == ":" and not stmt.startswith("::", i) and not (i and stmt[i - 1] == ":"):
            m = re.match(r":(?:'([A-Za-z_][A-Za-z0-9_]*)'|\"([A-Za-z_][A-Za-z0-9_]*)\"|([A-Za-z_][A-Za-z0-9_]*))", stmt[i:])
            if m and (name := m.group(1) or m.group(2) or m.group(3)) in variables:
                value = variables[name]
                if m.group(1):
                    value = "'" + value.replace("'", "''") + "'"
                elif m.group(2):
                    value = '"' + value.replace('"', '""') + '"'
                out.append(value)
                i += len(m.group(0))
                continue
        if skip is not None:
            out.append(stmt[i:skip])
            i = skip
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _only_comments(stmt: str) -> bool:
    return not re.sub(r"--[^\n]*|/\*.*?\*/", "", stmt, flags=re.S).strip()


def _code(stmt: str) -> str:
    """The statement without its comments and string contents (for the checks)."""
    return re.sub(r"--[^\n]*|/\*.*?\*/", " ", stmt, flags=re.S).strip()


# ----------------------------------------------------------------------------- one file

@dataclass
class VerifyFile:
    name: str
    statements: list[str]
    headers: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, file: Traversable) -> VerifyFile:
        def include(relative: str) -> str:  # relative to the suite's folder (fixtures/…)
            return suite().joinpath(*relative.split("/")).read_text(encoding="utf-8")

        text = file.read_text(encoding="utf-8")
        return cls(file.name, split_statements(text, include), HEADER.findall(text))

    def unsafe(self) -> str | None:
        """Why this file may not run on a live database, or None."""
        if not self.statements or not re.fullmatch(r"BEGIN(\s+TRANSACTION)?(\s+ISOLATION\s+LEVEL\s+[A-Z ]+)?;?",
                                                    _code(self.statements[0]), re.I):
            return "it does not open with BEGIN"
        if not re.fullmatch(r"ROLLBACK;?", _code(self.statements[-1]), re.I):
            return "it does not end with ROLLBACK"
        for stmt in self.statements[1:-1]:
            code = _code(stmt)
            if FORBIDDEN.match(code) or re.match(r"^\s*(BEGIN|START\s+TRANSACTION|ROLLBACK)\s*;?\s*$", code, re.I):
                return f"it runs {code.split()[0].upper()} inside the suite's transaction"
            if DBLINK.search(code):
                return "it reaches outside its transaction (dblink or a foreign server)"
            if SCHEMA_CHANGE.match(code):
                return (f"it changes the schema or its statistics ({' '.join(code.split()[:3])}): its locks stop "
                        "live workers until the ROLLBACK, and ANALYZE's row estimates are not rolled back")
            if WHOLE_TABLE.match(code) and not re.search(r"\bWHERE\b", code, re.I):
                return f"it writes every row of a table ({' '.join(code.split()[:3])}): it would lock rows a live worker holds"
        return None

    def roles(self) -> set[str]:
        return {m.group(1).lower() for s in self.statements if (m := SET_ROLE.match(_code(s)))}

    def needs_superuser(self) -> bool:
        """Declared (`-- verify: needs superuser`), or read from the statements: SET SESSION AUTHORIZATION,
        CREATE ROLE (a test login of its own, rolled back with it)."""
        return any(h.lower().startswith("needs superuser") for h in self.headers) or any(
            SUPERUSER_ONLY.match(_code(s)) for s in self.statements)

    def not_live_yet(self) -> str | None:
        """`-- verify: not on a live database yet: <why>`: a file that still assumes the data around it
        (or takes rows of the installation), skipped by db verify until it makes and asserts on its own."""
        for h in self.headers:
            if h.lower().startswith("not on a live database yet"):
                return h.split(":", 1)[1].strip() if ":" in h else "it still assumes the data around it"
        return None

    def not_on_citus(self) -> str | None:
        for h in self.headers:
            if h.lower().startswith("not on citus"):
                return h.split(":", 1)[1].strip() if ":" in h else "it does not apply to a distributed schema"
        return None


@dataclass
class FileResult:
    name: str
    planned: int | None = None
    run: int = 0
    failed: list[int] = field(default_factory=list)
    skipped: str | None = None
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        if self.skipped is not None:
            return True
        return self.error is None and not self.failed and self.planned == self.run


@dataclass
class Connected:
    """What the connected role may do (for the skip decisions)."""

    user: str
    superuser: bool
    member_of: set[str]
    citus: bool
    pgtap_schema: str


def inspect(conn: psycopg.Connection) -> Connected:
    row = conn.execute(
        "SELECT current_user, r.rolsuper, (SELECT n.nspname FROM pg_extension AS e JOIN pg_namespace AS n"
        " ON n.oid = e.extnamespace WHERE e.extname = 'pgtap'), EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
        " FROM pg_roles AS r WHERE r.rolname = current_user"
    ).fetchone()
    assert row is not None
    user, superuser, schema, citus = row
    if schema is None:
        raise UserError("the pgtap extension is not installed in this database: a superuser runs "
                        "`CREATE EXTENSION pgtap;` once (any schema; on Debian: apt-get install postgresql-NN-pgtap)",
                        exit_code=2)
    members = {r[0] for r in conn.execute(
        "SELECT rolname FROM pg_roles WHERE rolname LIKE 'mailroom%%' AND pg_has_role(current_user, oid, 'MEMBER')")}
    return Connected(user, bool(superuser), members, bool(citus), schema)


# The files that apply on a Citus coordinator: the catalog's checks (documentation, grants, error codes,
# schema version) and the pure functions (addresses, crypto, patterns). The others test a single node's
# tables inside one transaction, which Citus refuses across its placements and connections (a definer
# function's writes and the caller's reads, subqueries it cannot push down); the distributed behaviour
# of those rules is proven by tests/citus (docs/architecture.md, "Changing a function that has a seam").
# Measured on `mailroom db up --workers 2` (issue 47): these pass, every other file fails for that reason.
CITUS_FILES = frozenset({
    "01_api_documented.sql", "02_addresses.sql", "03_crypto.sql", "04_error_codes.sql", "04_schema_version.sql",
    "05_privileges.sql", "09_patterns.sql", "42_collector_privileges.sql",
})
CITUS_SKIP = "single-node tables in one transaction; on Citus its rules are proven by tests/citus"


def skip_reason(vf: VerifyFile, who: Connected) -> str | None:
    if who.citus and (why := vf.not_on_citus()):
        return f"not on Citus: {why}"
    if who.citus and vf.name not in CITUS_FILES:
        return f"not on Citus: {CITUS_SKIP}"
    if vf.needs_superuser() and not who.superuser:
        return f"needs a superuser; {who.user} is not"
    if not who.superuser:
        missing = sorted(r for r in vf.roles() if r not in who.member_of)
        if missing:
            return f"needs membership of {', '.join(missing)} (SET ROLE); {who.user} has none"
    return None


def run_file(url: str, vf: VerifyFile, who: Connected, emit: Callable[[str], None]) -> FileResult:
    result = FileResult(vf.name)
    started = time.monotonic()
    if (why := vf.not_live_yet()) is not None:
        result.skipped = f"not on a live database yet: {why}"
        emit(f"1..0 # SKIP {result.skipped}")
        return result
    if (why := vf.unsafe()) is not None:
        result.error = f"refused: {why}"
        emit(f"not ok - {vf.name} refused: {why}")
        return result
    if (why := skip_reason(vf, who)) is not None:
        result.skipped = why
        emit(f"1..0 # SKIP {why}")
        return result
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        conn.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT}'")
        conn.execute("SET client_min_messages = warning")
        conn.execute("SELECT pg_catalog.set_config('search_path', "
                     "pg_catalog.current_setting('search_path') || ', ' || pg_catalog.quote_ident(%s), false)",
                     (who.pgtap_schema,))
        last = len(vf.statements) - 1
        variables: dict[str, str] = {}
        for index, stmt in enumerate(vf.statements):
            if stmt.startswith("\\gset"):
                continue
            if index == last and (held := _strong_locks(conn)):
                # before the ROLLBACK that releases them: what the file held while it ran (a function
                # it called may do DDL no statement of it shows, as maintain_partitions does)
                result.error = (f"it held {held} until its ROLLBACK: live workers' writes there (and, under "
                                "ACCESS EXCLUSIVE, their reads) waited behind the file")
                emit(f"# {vf.name}: {result.error}")
                conn.execute("ROLLBACK")
                break
            following = vf.statements[index + 1] if index < last else ""
            gset = following.split()[1:] if following.startswith("\\gset") else None
            try:
                with conn.cursor() as cur:
                    cur.execute(substitute(stmt, variables), prepare=False)
                    if cur.description is not None and cur.pgresult is not None \
                            and cur.pgresult.status == pq.ExecStatus.TUPLES_OK:
                        rows = cur.fetchall()
                        if gset is not None:
                            if len(rows) != 1:
                                raise psycopg.DataError(f"\\gset: the query returned {len(rows)} rows, not one")
                            prefix = gset[0] if gset else ""
                            for col_index, col in enumerate(cur.description):  # as psql prints it: the text form
                                raw = cur.pgresult.get_value(0, col_index)
                                variables[prefix + col.name] = "" if raw is None else _text(raw)
                            continue
                        for row in rows:
                            for line in ("" if row[0] is None else str(row[0])).splitlines():
                                _tap_line(line, result, emit)
            except psycopg.Error as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                result.error = f"statement {index + 1} failed: {first}"
                emit(f"# {vf.name}: {result.error}")
                if conn.info.transaction_status != pq.TransactionStatus.IDLE:
                    conn.rollback() if not conn.autocommit else conn.execute("ROLLBACK")
                break
            if index < last and conn.info.transaction_status == pq.TransactionStatus.IDLE:
                result.error = f"statement {index + 1} ended the transaction before the final ROLLBACK"
                emit(f"# {vf.name}: {result.error}")
                break
    result.seconds = time.monotonic() - started
    return result


# The lock modes of DDL, which live workers' statements wait for: ACCESS EXCLUSIVE (CREATE, ALTER, DROP,
# a partition created or attached: even reads wait), SHARE (CREATE INDEX) and SHARE ROW EXCLUSIVE (CREATE
# TRIGGER, a foreign key): writes wait. EXCLUSIVE is not among them: it is the keyrings' own serialization
# of key changes (sql/15_keyring.sql, sql/30_outbound_senders.sql), under which readers go on and which
# no worker's statement takes or waits for.
_BLOCKING_MODES = ("ShareLock", "ShareRowExclusiveLock", "AccessExclusiveLock")


def _strong_locks(conn: psycopg.Connection) -> str:
    """The locks of DDL this session holds on mailroom's relations, which live workers' statements would
    wait for ("" when none): `mode on schema.table`, comma-separated."""
    rows = conn.execute(
        "SELECT l.mode || ' on ' || n.nspname || '.' || c.relname FROM pg_catalog.pg_locks AS l"
        " JOIN pg_catalog.pg_class AS c ON c.oid = l.relation"
        " JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace"
        " WHERE l.pid = pg_catalog.pg_backend_pid() AND l.locktype = 'relation' AND l.granted"
        " AND l.mode = ANY(%s) AND n.nspname IN ('mailroom', 'mailroom_internal')"
        " ORDER BY 1 LIMIT 5",
        (list(_BLOCKING_MODES),),
    ).fetchall()
    return ", ".join(r[0] for r in rows)


def _text(raw: bytes) -> str:
    """A value as psql prints it (for \\gset): the server's text form (psycopg asks for text by default)."""
    return raw.decode("utf-8")


def _tap_line(line: str, result: FileResult, emit: Callable[[str], None]) -> None:
    if m := TAP_PLAN.match(line):
        result.planned = int(m.group(1))
    elif m := TAP_RESULT.match(line):
        result.run += 1
        if m.group(1):
            result.failed.append(result.run)
    emit(line)


# ----------------------------------------------------------------------------- the run

def verify(url: str, names: Iterable[str] = (), *, verbose: bool = False,
           out: Callable[[str], None] = print) -> int:
    """Run the suite (or the named files) against `url`; TAP and pg_prove's summary to `out`; 0 or 1."""
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        who = inspect(conn)
    files = suite_files()
    wanted = [n if n.endswith(".sql") else f"{n}.sql" for n in names]
    if wanted:
        known = {f.name: f for f in files}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise UserError(f"no such file in the suite: {', '.join(unknown)}", exit_code=2)
        files = [known[n] for n in wanted]
    out(f"# mailroom db verify: {len(files)} files as {who.user}"
        f"{' (superuser)' if who.superuser else ''}, pgtap in schema {who.pgtap_schema}"
        f"{', Citus' if who.citus else ''}; lock_timeout {LOCK_TIMEOUT}, statement_timeout {STATEMENT_TIMEOUT}")
    results: list[FileResult] = []
    width = max((len(f.name) for f in files), default=0) + 1
    for file in files:
        vf = VerifyFile.load(file)
        lines: list[str] = []
        result = run_file(url, vf, who, lines.append)
        results.append(result)
        if verbose or not result.ok:
            for line in lines:
                if verbose or line.startswith(("not ok", "#", "  ")) or not TAP_RESULT.match(line) and not TAP_PLAN.match(line):
                    out(line)
        out(f"{vf.name} {'.' * (width - len(vf.name) + 1)} {_verdict(result)}")
    failed = [r for r in results if not r.ok]
    skipped = [r for r in results if r.skipped is not None]
    if failed:
        out("")
        out("Test Summary Report")
        out("-------------------")
        for r in failed:
            out(f"{r.name} (Tests: {r.run} Failed: {len(r.failed)})")
            if r.failed:
                out(f"  Failed tests: {', '.join(map(str, r.failed))}")
            if r.error:
                out(f"  {r.error}")
            elif r.planned != r.run:
                out(f"  Parse errors: Bad plan.  You planned {r.planned} tests but ran {r.run}.")
    elif skipped:
        out(f"All tests successful ({len(skipped)} file(s) skipped).")
    else:
        out("All tests successful.")
    tests = sum(r.run for r in results)
    out(f"Files={len(results)}, Tests={tests}, {time.monotonic() - started:.0f} wallclock secs")
    out(f"Result: {'FAIL' if failed else 'PASS'}")
    return 1 if failed else 0


def _verdict(r: FileResult) -> str:
    if r.skipped is not None:
        return f"skipped: {r.skipped}"
    if r.ok:
        return "ok"
    if r.error:
        return f"Failed {len(r.failed)}/{r.planned or r.run} subtests; {r.error}"
    if r.planned != r.run:
        return f"Failed: planned {r.planned}, ran {r.run}"
    return f"Failed {len(r.failed)}/{r.run} subtests"


# ----------------------------------------------------------------------------- the proof it changed nothing

def checksums(conn: psycopg.Connection) -> dict[str, str]:
    """md5 of every table's rows in schemas mailroom and mailroom_internal (partitioned tables read
    through their parent), keyed by table; `settings` is among them. Equal before and after a verify
    run: the suite left nothing behind (sequences aside: a rolled-back nextval is not given back)."""
    tables = [r[0] for r in conn.execute(
        "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace"
        " WHERE n.nspname IN ('mailroom', 'mailroom_internal') AND c.relkind IN ('r', 'p') AND NOT c.relispartition"
        " ORDER BY 1")]
    out: dict[str, str] = {}
    for table in tables:
        row = conn.execute(
            f"SELECT count(*), md5(coalesce(string_agg(t::text, E'\\n' ORDER BY t::text), '')) FROM {table} AS t"  # noqa: S608
        ).fetchone()
        assert row is not None
        out[table] = f"{row[0]}:{row[1]}"
    return out

