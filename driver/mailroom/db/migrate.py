"""Migration runner: numbered files in migrations/ once each, then every file in sql/.

- One session advisory lock for the whole run, so concurrent `db migrate` calls queue up.
- Each pending migration runs in its own transaction together with its bookkeeping row
  (version, name, sha256, applied_at) in mailroom.schema_migrations.
- A first line `-- mailroom:no-transaction` runs the file's statements in autocommit
  (for CREATE INDEX CONCURRENTLY); statements are split at lines ending in `;`.
- An applied file whose checksum changed stops the run before anything is applied.
- Then sql/*.sql is re-applied in file-name order in one transaction (all idempotent).
- Ownership: migrations up to ROLES_VERSION run as the connecting role (that one creates the
  roles and hands every object to mailroom_owner); later migrations and the sql/ pass run under
  SET LOCAL ROLE mailroom_owner, so every object is the owner's. A migration whose first lines
  hold `-- mailroom:as-migrator` runs as the connecting role (role and grant work).
- A file that had to change after release (it could not run somewhere, e.g. as a non-superuser)
  lists the checksums it replaces: `-- mailroom:replaces-sha256 <hex>`. A database that applied
  a listed version is accepted and re-recorded; the change must be harmless for it (a later
  migration brings such databases to the same state).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

from mailroom.core.errors import UserError
from mailroom.db.connect import connect

LOCK_KEY = 7_305_853_001  # pg_advisory_lock key of the migration runner
NO_TRANSACTION_MARKER = "-- mailroom:no-transaction"
AS_MIGRATOR_MARKER = "-- mailroom:as-migrator"
REPLACES_MARKER = "-- mailroom:replaces-sha256 "
ROLES_VERSION = 50  # migrations/0050_roles.sql: from here on, objects belong to mailroom_owner
OWNER_ROLE = "mailroom_owner"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

BOOTSTRAP = """\
CREATE SCHEMA IF NOT EXISTS mailroom;
CREATE TABLE IF NOT EXISTS mailroom.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    sha256 text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);"""


def project_root() -> Path:
    """The directory holding migrations/ and sql/ (MAILROOM_HOME, else found above the package)."""
    env = os.environ.get("MAILROOM_HOME")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "migrations").is_dir() and (parent / "sql").is_dir():
            return parent
    raise UserError("cannot find the migrations/ and sql/ directories; set MAILROOM_HOME to the mailroom checkout")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    @property
    def transactional(self) -> bool:
        return NO_TRANSACTION_MARKER not in _markers(self.text)

    @property
    def replaces(self) -> set[str]:
        """sha256 values of earlier versions of this file that databases may have recorded."""
        return {line[len(REPLACES_MARKER):].strip() for line in _markers(self.text) if line.startswith(REPLACES_MARKER)}

    @property
    def as_owner(self) -> bool:
        """Whether the file runs under SET ROLE mailroom_owner (see the module docstring)."""
        return self.version > ROLES_VERSION and AS_MIGRATOR_MARKER not in _markers(self.text)


def checksum_accepted(m: Migration, recorded: str) -> bool:
    """Whether a recorded checksum matches the file, or a version the file says it replaces."""
    return recorded == m.sha256 or recorded in m.replaces

def _markers(text: str) -> set[str]:
    """The `-- mailroom:…` marker lines at the top of a file (before its first statement)."""
    found = set()
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        if line.startswith("-- mailroom:"):
            found.add(line.strip())
    return found


def load_migrations(root: Path | None = None) -> list[Migration]:
    root = root or project_root()
    found: list[Migration] = []
    seen: dict[int, str] = {}
    for path in sorted((root / "migrations").glob("*.sql")):
        match = _NAME.match(path.name)
        if not match:
            raise UserError(f"migration file name {path.name} does not match NNNN_name.sql")
        version = int(match.group(1))
        if version in seen:
            raise UserError(f"migrations {seen[version]} and {path.name} share version {version}")
        seen[version] = path.name
        found.append(Migration(version, path.name, path, path.read_text()))
    return found


def load_sql_files(root: Path | None = None) -> list[Path]:
    root = root or project_root()
    return sorted((root / "sql").glob("*.sql"))


def split_statements(text: str) -> list[str]:
    """Split a no-transaction migration at lines ending in ';' (no function bodies there)."""
    statements, current = [], []
    for line in text.splitlines():
        current.append(line)
        if line.rstrip().endswith(";"):
            stmt = "\n".join(current).strip()
            if _has_code(stmt):
                statements.append(stmt)
            current = []
    tail = "\n".join(current).strip()
    if _has_code(tail):
        statements.append(tail)
    return statements


def _has_code(stmt: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in stmt.splitlines())


def _line_of(text: str, exc: psycopg.Error) -> str:
    pos = getattr(exc.diag, "statement_position", None)
    if not pos:
        return ""
    try:
        offset = int(pos)
    except ValueError:
        return ""
    return f" line {text[: offset - 1].count(chr(10)) + 1}"


def _fail(path: Path, text: str, exc: psycopg.Error, consequence: str = "nothing from this file was applied") -> UserError:
    message = exc.diag.message_primary or str(exc).strip().splitlines()[0]
    sqlstate = f" (SQLSTATE {exc.sqlstate})" if exc.sqlstate else ""
    where = f"{path.parent.name}/{path.name}{_line_of(text, exc)}"
    return UserError(f"{where}: {message}{sqlstate}; {consequence}")


def applied_versions(conn: psycopg.Connection) -> dict[int, tuple[str, str]]:
    rows = conn.execute("SELECT version, name, sha256 FROM mailroom.schema_migrations").fetchall()
    return {v: (n, s) for v, n, s in rows}


def check_checksums(migrations: list[Migration], applied: dict[int, tuple[str, str]]) -> None:
    for m in migrations:
        if m.version in applied and not checksum_accepted(m, applied[m.version][1]):
            raise UserError(
                f"migrations/{m.name} was edited after it was applied (recorded sha256 "
                f"{applied[m.version][1][:12]}…, file {m.sha256[:12]}…); "
                "restore it and put the change in a new migration"
            )


@dataclass
class MigrateResult:
    applied: list[str]
    sql_files: int


def migrate(url: str, *, upto: int | None = None, apply_sql: bool = True, root: Path | None = None) -> MigrateResult:
    """Apply pending migrations (up to `upto`) and then sql/; returns what was applied."""
    root = root or project_root()
    migrations = [m for m in load_migrations(root) if upto is None or m.version <= upto]
    done: list[str] = []
    with connect(url, application_name="mailroom migrate") as conn:
        conn.execute("SET client_min_messages = warning")
        conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_KEY,))
        try:
            conn.execute(BOOTSTRAP)
            applied = applied_versions(conn)
            check_checksums(migrations, applied)
            _rerecord_replaced(conn, migrations, applied)
            for m in migrations:
                if m.version in applied:
                    continue
                _apply_migration(conn, m)
                done.append(m.name)
            sql_files = load_sql_files(root) if apply_sql else []
            if sql_files:
                _apply_sql(conn, sql_files)
        finally:
            if not conn.closed and not conn.broken:
                conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
    return MigrateResult(done, len(sql_files))


def _rerecord_replaced(conn: psycopg.Connection, migrations: list[Migration], applied: dict) -> None:
    for m in migrations:
        if m.version in applied and applied[m.version][1] != m.sha256:
            conn.execute("UPDATE mailroom.schema_migrations SET sha256 = %s WHERE version = %s", (m.sha256, m.version))


def _record(conn: psycopg.Connection, m: Migration) -> None:
    conn.execute(
        "INSERT INTO mailroom.schema_migrations (version, name, sha256) VALUES (%s, %s, %s)",
        (m.version, m.name, m.sha256),
    )


def _apply_migration(conn: psycopg.Connection, m: Migration) -> None:
    try:
        if m.transactional:
            with conn.transaction():
                if m.as_owner:
                    conn.execute(f"SET LOCAL ROLE {OWNER_ROLE}")
                conn.execute(m.text.encode())
                if m.as_owner:
                    conn.execute("RESET ROLE")
                _record(conn, m)
        else:
            if m.as_owner:
                conn.execute(f"SET ROLE {OWNER_ROLE}")
            try:
                for stmt in split_statements(m.text):
                    conn.execute(stmt.encode())
            finally:
                if m.as_owner and not conn.broken:
                    conn.execute("RESET ROLE")
            _record(conn, m)
    except psycopg.Error as exc:
        raise _fail(m.path, m.text, exc) from None


def _apply_sql(conn: psycopg.Connection, files: list[Path]) -> None:
    with conn.transaction():
        conn.execute(f"SET LOCAL ROLE {OWNER_ROLE}")
        for path in files:
            text = path.read_text()
            try:
                with conn.transaction():
                    conn.execute(text.encode())
            except psycopg.Error as exc:
                raise _fail(path, text, exc, "sql/ was rolled back as a whole") from None


def bundle(url: str | None, *, root: Path | None = None) -> str:
    """The SQL a DBA can review and pipe into psql: lock, pending files, bookkeeping, sql/, unlock.

    With a reachable database only pending migrations are included; without one (url None),
    all of them, for a fresh database.
    """
    root = root or project_root()
    migrations = load_migrations(root)
    applied: dict[int, tuple[str, str]] = {}
    if url is not None:
        with connect(url) as conn:
            conn.execute(BOOTSTRAP)
            applied = applied_versions(conn)
        check_checksums(migrations, applied)
    out = [
        "-- mailroom migration bundle: review, then `psql -v ON_ERROR_STOP=1 -f bundle.sql`",
        "\\set ON_ERROR_STOP on",
        f"SELECT pg_advisory_lock({LOCK_KEY});",
        BOOTSTRAP,
    ]
    for m in migrations:
        if m.version in applied:
            continue
        record = (
            "INSERT INTO mailroom.schema_migrations (version, name, sha256) "
            f"VALUES ({m.version}, '{m.name}', '{m.sha256}');"
        )
        out.append(f"\n-- migrations/{m.name}")
        if m.transactional:
            role = [f"SET LOCAL ROLE {OWNER_ROLE};"] if m.as_owner else []
            reset = ["RESET ROLE;"] if m.as_owner else []
            out += ["BEGIN;", *role, m.text.rstrip(), *reset, record, "COMMIT;"]
        elif m.as_owner:
            out += [f"SET ROLE {OWNER_ROLE};", m.text.rstrip(), "RESET ROLE;", record]
        else:
            out += [m.text.rstrip(), record]
    out.append("\n-- sql/ (idempotent, re-applied on every migrate), as the owner of every object")
    out.append("BEGIN;")
    out.append(f"SET LOCAL ROLE {OWNER_ROLE};")
    for path in load_sql_files(root):
        out += [f"-- sql/{path.name}", path.read_text().rstrip()]
    out.append("COMMIT;")
    out.append(f"SELECT pg_advisory_unlock({LOCK_KEY});")
    return "\n".join(out) + "\n"
