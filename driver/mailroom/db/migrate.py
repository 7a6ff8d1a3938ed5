"""Migration runner: numbered files in migrations/ once each, then every file in sql/, as ONE transaction.

What `db migrate` does (docs/upgrading.md tells it to operators):

- The SQL comes from the package (mailroom.db.files): the wheel carries migrations/ and sql/.
- Its lock is a table lock on `mailroom.migration_lock`, an empty table created before anything
  else (on a fresh database, in a short transaction of its own), owned by mailroom_owner, on which
  nobody else has any privilege. `db migrate` takes it in SHARE UPDATE EXCLUSIVE mode: concurrent
  runs queue up, and no other role can hold it: the only locks a login without privileges can
  keep on a table it can name (the ones parsing a statement takes) do not conflict with that mode,
  and a login with no mailroom role cannot even name it. Never an advisory lock (any login on the
  server can take those).
- Every pending migration and then the whole sql/ pass run in ONE transaction, each file in a
  savepoint (to name the file that fails), each migration together with its row in
  mailroom.schema_migrations (version, name, sha256, applied_at). Running workers see the schema
  before or after, never between: a migration that drops a function to change its signature and
  the sql/ file that re-creates it commit together. Anything failing rolls everything back.
- Locks: `lock_timeout` (default 5 s) bounds each wait for a lock a running transaction holds; on
  a timeout the whole transaction rolls back (it held its locks for at most that long) and is
  tried again, up to LOCK_RETRIES times. A deadlock with a running transaction (PostgreSQL aborts one
  of the two after deadlock_timeout; a worker's transaction and the sql/ pass replacing triggers on
  two tables in opposite order) is the same case: nothing was applied, so the whole run is tried
  again (a retry after a deadlock). Once it has its locks, it holds them until COMMIT: the
  time of the pending migrations plus the sql/ pass (docs/upgrading.md gives the measured figure).
- A first line `-- mailroom:no-transaction` runs a file in autocommit (for CREATE INDEX
  CONCURRENTLY), split at lines ending in `;`. Such files run after the transaction commits, in
  order, while a second connection holds the migration lock; nothing in the transaction may
  depend on them.
- An applied file whose checksum changed stops the run before anything is applied; a file that had
  to change after release lists the checksums it replaces (`-- mailroom:replaces-sha256 <hex>`):
  a database that applied a listed version is accepted and re-recorded.
- Ownership: migrations up to ROLES_VERSION run as the connecting role (that one creates the roles
  and hands every object to mailroom_owner); later migrations and the sql/ pass run under
  SET LOCAL ROLE mailroom_owner, so every object is the owner's. A migration whose first lines
  hold `-- mailroom:as-migrator` runs as the connecting role (role and grant work).
- On a Citus coordinator (mailroom.db.citus.is_coordinator) the files of sql/citus/ follow sql/:
  they distribute the schema (docs/scale.md). On an upgrade they run in the same transaction. On
  the first install everything before them runs with Citus' DDL propagation off (the schema is
  all local then, and objects owned by roles created or changed in this very transaction cannot
  be created on the workers through other connections), and they run in a second transaction.
- What migrations say (RAISE NOTICE / WARNING) reaches the caller (`notices`), each line prefixed
  with its file; PostgreSQL's own "…, skipping" chatter of IF [NOT] EXISTS is left out.
- MAILROOM_SECRET_KEY (issue 33, item 2): releases before the keyring (migration 0125) signed links
  with it. When this run creates the keyring on a database an earlier release installed (0125 is
  applied now and the ledger already had rows) and the variable is in migrate's environment, it is
  imported as the active signing key in the same transaction, and the key 0125 generated (it signed
  nothing) is retired: workers restarted with the same environment keep signing with the key the
  applications' verifiers hold. Not on a fresh install (the keyring's own key signs; `collect` and
  `send` refuse a MAILROOM_SECRET_KEY that is not active and name `mailroom keys import --active`).
  Whatever the run, `result.steps` lists the one-time steps left (mailroom.upgrade_steps: that key,
  the relay-password conversion); `db migrate` prints them.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path

import psycopg

from mailroom.core.errors import UserError
from mailroom.db.connect import connect
from mailroom.db.files import schema_files

LOCK_TABLE = "mailroom.migration_lock"
LOCK_MODE = "SHARE UPDATE EXCLUSIVE"
LOCK_TIMEOUT = 5.0  # seconds: the longest migrate waits for one lock a running transaction holds
LOCK_RETRIES = 5  # whole-transaction retries after a lock timeout
NO_TRANSACTION_MARKER = "-- mailroom:no-transaction"
AS_MIGRATOR_MARKER = "-- mailroom:as-migrator"
REPLACES_MARKER = "-- mailroom:replaces-sha256 "
ROLES_VERSION = 50  # migrations/0050_roles.sql: from here on, objects belong to mailroom_owner
KEYRING_VERSION = 125  # migrations/0125_keyring.sql: releases before it signed with MAILROOM_SECRET_KEY
SECRET_KEY_ENV = "MAILROOM_SECRET_KEY"  # noqa: S105 - the name of the variable, not a key
OWNER_ROLE = "mailroom_owner"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

# Before anything else, in a transaction of its own: the schema and the lock table (nothing in them).
BOOTSTRAP = """\
CREATE SCHEMA IF NOT EXISTS mailroom;
CREATE TABLE IF NOT EXISTS mailroom.migration_lock ();"""

LOCK = f"LOCK TABLE {LOCK_TABLE} IN {LOCK_MODE} MODE"

LEDGER = """\
CREATE TABLE IF NOT EXISTS mailroom.schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    sha256 text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);"""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path | Traversable
    text: str

    @property
    def label(self) -> str:
        return f"migrations/{self.name}"

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
    """The migrations this driver carries (or those under `root`), in order."""
    found: list[Migration] = []
    seen: dict[int, str] = {}
    for path in schema_files(root).migration_files():
        match = _NAME.match(path.name)
        if not match:
            raise UserError(f"migration file name {path.name} does not match NNNN_name.sql")
        version = int(match.group(1))
        if version in seen:
            raise UserError(f"migrations {seen[version]} and {path.name} share version {version}")
        seen[version] = path.name
        found.append(Migration(version, path.name, path, path.read_text()))
    return found


def load_sql_files(root: Path | None = None) -> list[Path | Traversable]:
    return list(schema_files(root).sql_files())


def load_citus_files(root: Path | None = None) -> list[Path | Traversable]:
    return list(schema_files(root).citus_files())


@dataclass
class _Citus:
    """What migrate does on a Citus coordinator: the layout files, and whether the schema is distributed yet."""

    files: list
    distributed: bool
    # the earlier layout (mailboxes a Citus local table): sql/citus/10 re-creates mailboxes, and
    # Citus drops the functions typed by its row with the old table, so sql/ is applied once more
    relayout: bool = False

    @classmethod
    def detect(cls, conn: psycopg.Connection, root: Path | None) -> _Citus | None:
        from mailroom.db.citus import is_coordinator, is_distributed, mailboxes_local

        if not is_coordinator(conn):
            return None
        return cls(load_citus_files(root), is_distributed(conn), mailboxes_local(conn))


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


_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")


def sql_statements(text: str) -> list[str]:
    """Split SQL text into its statements at top-level ';' (quotes, dollar quotes, comments respected).

    A Citus coordinator propagates a DDL statement to the workers with its source text, which must
    then be one statement: on Citus, files are sent statement by statement."""
    statements: list[str] = []
    start = i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if c == "-" and text.startswith("--", i):
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "'":
            j = i + 1
            while j < n:
                if text[j] == "'" and text.startswith("''", j):
                    j += 2
                elif text[j] == "'":
                    break
                else:
                    j += 1
            i = j + 1
        elif c == "$" and (m := _DOLLAR.match(text, i)) and not (i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
            tag = m.group(0)
            j = text.find(tag, m.end())
            i = n if j < 0 else j + len(tag)
        elif c == ";":
            stmt = text[start:i + 1].strip()
            if _has_code(stmt):
                statements.append(stmt)
            start = i = i + 1
        else:
            i += 1
    tail = text[start:].strip()
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


def _fail(label: str, text: str, exc: psycopg.Error, consequence: str = "nothing was applied") -> UserError:
    message = exc.diag.message_primary or str(exc).strip().splitlines()[0]
    sqlstate = f" (SQLSTATE {exc.sqlstate})" if exc.sqlstate else ""
    return UserError(f"{label}{_line_of(text, exc)}: {message}{sqlstate}; {consequence}")


def applied_versions(conn: psycopg.Connection) -> dict[int, tuple[str, str]]:
    """The ledger (the owner's view of it): version -> (name, sha256)."""
    rows = conn.execute("SELECT version, name, sha256 FROM mailroom.schema_migrations").fetchall()
    return {v: (n, s) for v, n, s in rows}


def check_checksums(migrations: list[Migration], applied: dict[int, tuple[str, str]]) -> None:
    for m in migrations:
        if m.version in applied and not checksum_accepted(m, applied[m.version][1]):
            raise UserError(
                f"{m.label} was edited after it was applied (recorded sha256 "
                f"{applied[m.version][1][:12]}…, file {m.sha256[:12]}…); "
                "restore it and put the change in a new migration"
            )


@dataclass
class MigrateResult:
    applied: list[str]
    sql_files: int
    notices: list[str] = field(default_factory=list)
    held_seconds: float = 0.0  # from the first statement after the lock to COMMIT
    lock_retries: int = 0
    distributed: bool = False  # a Citus coordinator's schema was distributed by this run (sql/citus/)
    imported_key: int | None = None  # MAILROOM_SECRET_KEY imported as the active signing key (its id)
    retired_keys: list[int] = field(default_factory=list)  # the keys 0125 generated, retired for it
    steps: list[tuple[str, str, str]] = field(default_factory=list)  # mailroom.upgrade_steps: (step, command, reason)

    def step_lines(self) -> list[str]:
        """What `db migrate` prints after its summary: the imported key, then the steps left."""
        lines = []
        if self.imported_key is not None:
            retired = f"; the generated key {', '.join(map(str, self.retired_keys))} (it signed nothing) is retired" \
                if self.retired_keys else ""
            lines.append(f"{SECRET_KEY_ENV} is now the active signing key (key {self.imported_key}){retired}: "
                         "restart collect and send with it set, or unset it once no verifier needs it")
        if self.steps:
            lines.append("one-time steps left (docs/upgrading.md):")
            lines += [f"  {n}. {command}: {reason}" for n, (_step, command, reason) in enumerate(self.steps, 1)]
        return lines


class _Notices:
    """Collects (and passes on) what the server says while a file runs, prefixed with the file."""

    def __init__(self, sink: Callable[[str], None] | None) -> None:
        self.sink = sink
        self.current = ""
        self.lines: list[str] = []

    def __call__(self, diag: psycopg.errors.Diagnostic) -> None:
        primary = diag.message_primary or ""
        if primary.endswith(", skipping"):  # IF [NOT] EXISTS chatter, not something a file said
            return
        line = f"{self.current}: {diag.severity or 'NOTICE'}: {primary}" if self.current else f"{diag.severity}: {primary}"
        if diag.message_detail:
            line += f" DETAIL: {diag.message_detail}"
        if diag.message_hint:
            line += f" HINT: {diag.message_hint}"
        self.lines.append(line)
        if self.sink is not None:
            self.sink(line)


class _LockTimeout(Exception):
    """A lock was not granted within lock_timeout, or the run was the victim of a deadlock: the
    transaction rolled back (nothing applied), try again."""

    def __init__(self, label: str, exc: psycopg.Error) -> None:
        super().__init__(label)
        self.label = label
        self.exc = exc
        self.deadlock = isinstance(exc, psycopg.errors.DeadlockDetected)


# the errors after which the whole run rolled back without applying anything and may be tried again
_RETRIED = (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected)


def migrate(
    url: str,
    *,
    upto: int | None = None,
    apply_sql: bool = True,
    root: Path | None = None,
    notices: Callable[[str], None] | None = None,
    lock_timeout: float = LOCK_TIMEOUT,
    retries: int = LOCK_RETRIES,
    say: Callable[[str], None] | None = None,
    environ: Mapping[str, str] | None = None,
) -> MigrateResult:
    """Apply pending migrations (up to `upto`) and then sql/ in one transaction; what was applied.

    `notices` receives each NOTICE/WARNING line as it comes; `say` the runner's own progress
    (waiting for the lock, a retry after a lock timeout). `environ` (default os.environ) is where
    MAILROOM_SECRET_KEY is looked for (see the module docstring)."""
    from mailroom.db.config import hex_key

    env = os.environ if environ is None else environ
    secret = hex_key(SECRET_KEY_ENV, env.get(SECRET_KEY_ENV), required=False)  # (a bad value: exit 2, nothing done)
    migrations = [m for m in load_migrations(root) if upto is None or m.version <= upto]
    sql_files = load_sql_files(root) if apply_sql else []
    heard = _Notices(notices)
    tell = say or (lambda _line: None)
    with connect(url, application_name="mailroom migrate") as conn:
        conn.add_notice_handler(heard)
        _bootstrap(conn)
        citus = _Citus.detect(conn, root) if apply_sql else None
        attempt = 0
        while True:
            try:
                result = _run_once(conn, migrations, sql_files, heard, lock_timeout, tell, citus, secret)
                break
            except _LockTimeout as timeout:
                attempt += 1
                if attempt > retries and timeout.deadlock:
                    raise UserError(
                        f"{timeout.label}: deadlocked with a running transaction, the last of {attempt} tries; "
                        "nothing was applied. Find the transactions writing mailroom's tables (pg_stat_activity) "
                        "and run it again",
                    ) from None
                if attempt > retries:
                    raise UserError(
                        f"{timeout.label}: a lock it needs was held by another transaction for longer than "
                        f"{lock_timeout:g}s, {attempt} times; nothing was applied. Find the long transaction "
                        "(pg_stat_activity) or raise --lock-timeout",
                    ) from None
                delay = min(2.0 ** attempt, 30.0)
                why = ("deadlocked with a running transaction" if timeout.deadlock
                       else f"waited {lock_timeout:g}s for a lock held by a running transaction")
                tell(f"{timeout.label}: {why}; rolled back, trying again in {delay:g}s "
                     f"(attempt {attempt + 1} of {retries + 1})")
                time.sleep(delay)
        result.lock_retries = attempt
        if citus is not None and not citus.distributed:
            for attempt in range(2):
                try:
                    with connect(url, application_name="mailroom migrate (citus)") as fresh:
                        # a session of its own: Citus does not propagate the objects this session made locally
                        fresh.add_notice_handler(heard)
                        _distribute(fresh, citus, heard)
                    break
                except UserError as exc:
                    # Citus copied the owner role to a worker once more, NOLOGIN, after it was let in
                    # (its background metadata sync): the files are idempotent, so once again
                    if attempt or "is not permitted to log in" not in str(exc):
                        raise
                    tell("a worker refused mailroom_owner (copied again by Citus as NOLOGIN): distributing once more")
            result.distributed = True
            # and sql/ once more, as on every later migrate: through Citus now (the functions reach
            # the workers, the ones typed by a table Citus took over are re-created)
            citus.distributed = True
            _run_once(conn, [], sql_files, heard, lock_timeout, tell, citus)
        tail = [m for m in migrations if not m.transactional]
        if tail:
            result.applied += _run_no_transaction(conn, url, tail, heard)
    result.notices = heard.lines
    return result


def _bootstrap(conn: psycopg.Connection) -> None:
    """The schema and the lock table, before anything else (a concurrent first run may race us)."""
    for attempt in range(3):
        try:
            with conn.transaction():
                conn.execute(BOOTSTRAP)
            return
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateSchema, psycopg.errors.DuplicateTable):
            if attempt == 2:
                raise
        except psycopg.Error as exc:
            raise _fail("migrate: creating schema mailroom", BOOTSTRAP, exc) from None


def _take_lock(conn: psycopg.Connection, say: Callable[[str], None]) -> None:
    """The migration lock in the current transaction: at once, or after saying why we wait."""
    try:
        with conn.transaction():
            conn.execute(LOCK + " NOWAIT")
        return
    except psycopg.errors.LockNotAvailable:
        pass
    say("another `mailroom db migrate` is running on this database; waiting for it to finish")
    conn.execute("SET LOCAL lock_timeout = 0")
    conn.execute(LOCK)


def _run_once(
    conn: psycopg.Connection,
    migrations: list[Migration],
    sql_files: list,
    heard: _Notices,
    lock_timeout: float,
    say: Callable[[str], None],
    citus: _Citus | None = None,
    secret: bytes | None = None,
) -> MigrateResult:
    done: list[str] = []
    label = "migrate"
    keys: tuple[int | None, list[int], list[tuple[str, str, str]]] = (None, [], [])
    try:
        with conn.transaction():
            _take_lock(conn, say)
            started = time.monotonic()
            conn.execute(f"SET LOCAL lock_timeout = '{int(lock_timeout * 1000)}ms'")
            split = citus is not None and citus.distributed
            if citus is not None and not citus.distributed:
                conn.execute("SET LOCAL citus.enable_ddl_propagation = off")
            elif citus is not None:
                # sql/ re-creates the row triggers of distributed tables (sql/citus/10 says which)
                conn.execute("SET LOCAL citus.enable_unsafe_triggers = on")
            conn.execute(LEDGER)
            applied = applied_versions(conn)
            check_checksums(migrations, applied)
            _rerecord_replaced(conn, migrations, applied)
            for m in migrations:
                if m.version in applied or not m.transactional:
                    continue
                label = m.label
                _apply_migration(conn, m, heard, split=split)
                done.append(m.name)
            if sql_files:
                label = "sql/"
                if split:
                    from mailroom.db.citus import DROP_SHARD_ROWTYPE_FUNCTIONS

                    conn.execute(DROP_SHARD_ROWTYPE_FUNCTIONS)
                _apply_sql(conn, sql_files, heard, split=split)
            if citus is not None and citus.distributed:
                label = "sql/citus/"
                _apply_sql(conn, citus.files, heard, prefix="sql/citus", split=True)
                if citus.relayout and sql_files:
                    label = "sql/ (after the move from the earlier layout)"
                    _apply_sql(conn, sql_files, heard, split=True)
                    _apply_sql(conn, citus.files, heard, prefix="sql/citus", split=True)
            if sql_files:
                label = "the signing key and the steps left"
                # an upgrade from a release that signed with MAILROOM_SECRET_KEY: this run made the keyring
                upgrade = bool(applied) and any(m.version == KEYRING_VERSION and m.name in done for m in migrations)
                keys = _secret_key_and_steps(conn, secret if upgrade else None, secret)
            held = time.monotonic() - started
    except _RETRIED as exc:
        raise _LockTimeout(heard.current or label, exc) from None
    except _Nested as nested:
        if isinstance(nested.exc, _RETRIED):
            raise _LockTimeout(nested.label, nested.exc) from None
        raise nested.error from None
    finally:
        heard.current = ""
    return MigrateResult(done, len(sql_files), held_seconds=held, imported_key=keys[0], retired_keys=keys[1],
                         steps=keys[2])


def _secret_key_and_steps(
    conn: psycopg.Connection, to_import: bytes | None, secret: bytes | None,
) -> tuple[int | None, list[int], list[tuple[str, str, str]]]:
    """In the run's transaction, as the owner: import `to_import` as the active signing key and retire the
    keys the keyring migration generated (never exported: they signed nothing); then the steps left."""
    from mailroom.db import sqlapi
    from mailroom.db.keyring import fingerprint

    conn.execute(f"SET LOCAL ROLE {OWNER_ROLE}")
    imported, retired = None, []
    if to_import is not None:
        imported = sqlapi.import_signing_key.value(conn, key=to_import, active=True)
        for key in sqlapi.list_signing_keys.rows(conn):
            if key.state == "verify_only" and key.origin == "generated" and key.last_exported_at is None:
                sqlapi.retire_signing_key.call(conn, id=key.id)
                retired.append(key.id)
    steps = []
    if conn.execute("SELECT to_regprocedure('mailroom.upgrade_steps(text)') IS NOT NULL").fetchone()[0]:
        try:
            with conn.transaction():  # (a tree of other files, `root`, may lack what it reads: no steps then)
                steps = sqlapi.upgrade_steps.rows(
                    conn, key_fingerprint=fingerprint(secret) if secret is not None else None)
        except psycopg.Error:
            steps = []
    conn.execute("RESET ROLE")
    return imported, retired, [(r.step, r.command, r.reason) for r in steps]


class _Nested(Exception):
    """A file failed inside the transaction: its UserError, raised once the transaction rolled back."""

    def __init__(self, label: str, exc: psycopg.Error, error: UserError) -> None:
        super().__init__(str(error))
        self.label = label
        self.exc = exc
        self.error = error


def _rerecord_replaced(conn: psycopg.Connection, migrations: list[Migration], applied: dict) -> None:
    for m in migrations:
        if m.version in applied and applied[m.version][1] != m.sha256:
            conn.execute("UPDATE mailroom.schema_migrations SET sha256 = %s WHERE version = %s", (m.sha256, m.version))


def _record(conn: psycopg.Connection, m: Migration) -> None:
    conn.execute(
        "INSERT INTO mailroom.schema_migrations (version, name, sha256) VALUES (%s, %s, %s)",
        (m.version, m.name, m.sha256),
    )


def _apply_migration(conn: psycopg.Connection, m: Migration, heard: _Notices, *, split: bool = False) -> None:
    """One transactional migration in a savepoint of the run's transaction, with its ledger row."""
    heard.current = m.label
    try:
        with conn.transaction():
            if m.as_owner:
                conn.execute(f"SET LOCAL ROLE {OWNER_ROLE}")
            _execute(conn, m.text, split=split)
            if m.as_owner:
                conn.execute("RESET ROLE")
            _record(conn, m)
    except psycopg.Error as exc:
        raise _Nested(m.label, exc, _fail(m.label, m.text, exc)) from None


def _distribute(conn: psycopg.Connection, citus: _Citus, heard: _Notices) -> None:
    """First install on a coordinator: the layout of sql/citus/, each file a transaction of its own.

    The schema on the workers was created by the connecting role (propagated before the owner
    existed there); it is handed to mailroom_owner first, as on the coordinator. Each step commits
    before the next: Citus creates what a distributed table depends on (types, functions) on the
    workers through connections of its own, which see only committed objects."""
    from mailroom.db.citus import owner_may_log_in

    conn.execute(f"ALTER SCHEMA mailroom OWNER TO {OWNER_ROLE}")  # Citus copies the owner role to the workers now
    owner_may_log_in(conn)
    conn.execute(f"SET ROLE {OWNER_ROLE}")
    try:
        for path in citus.files:
            label = f"sql/citus/{path.name}"
            heard.current = label
            text = path.read_text()
            try:
                # statement by statement, in one transaction: a CREATE OR REPLACE of a function Citus
                # already copied to the workers (a distributed table's trigger function) is
                # propagated with its source text, which must be one statement
                with conn.transaction():
                    _execute(conn, text, split=True)
            except psycopg.Error as exc:
                raise _fail(label, text, exc, "the files before it stay applied; run `mailroom db migrate` again") from None
    finally:
        heard.current = ""
        if not conn.broken:
            conn.execute("RESET ROLE")


def _execute(conn: psycopg.Connection, text: str, *, split: bool = False) -> None:
    """A file's text: at once, or statement by statement (`split`: on a Citus coordinator)."""
    if not split:
        conn.execute(text.encode())
        return
    for stmt in sql_statements(text):
        conn.execute(stmt.encode())


def _apply_sql(conn: psycopg.Connection, files: list, heard: _Notices, prefix: str = "sql", *, split: bool = False) -> None:
    conn.execute(f"SET LOCAL ROLE {OWNER_ROLE}")
    for path in files:
        label = f"{prefix}/{path.name}"
        heard.current = label
        text = path.read_text()
        try:
            with conn.transaction():
                _execute(conn, text, split=split)
        except psycopg.Error as exc:
            raise _Nested(label, exc, _fail(label, text, exc)) from None
    conn.execute("RESET ROLE")


def _run_no_transaction(conn: psycopg.Connection, url: str, tail: list[Migration], heard: _Notices) -> list[str]:
    """The pending no-transaction migrations, in autocommit, while a second connection holds the lock.

    The lock holder runs nothing but LOCK TABLE, so its transaction has no snapshot: CREATE INDEX
    CONCURRENTLY, which waits for older snapshots, does not wait for it."""
    done: list[str] = []
    if all(m.version in applied_versions(conn) for m in tail):
        return done
    with connect(url, autocommit=False, application_name="mailroom migrate (lock)") as holder:
        holder.execute(LOCK)
        applied = applied_versions(conn)  # after the lock: what another run may have done meanwhile
        for m in tail:
            if m.version in applied:
                continue
            heard.current = m.label
            try:
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
                raise _fail(m.label, m.text, exc, "its earlier statements stay applied (no transaction)") from None
            finally:
                heard.current = ""
            done.append(m.name)
        holder.commit()
    return done


def bundle(url: str | None, *, root: Path | None = None) -> str:
    """The SQL a DBA can review and pipe into psql: the same single transaction as `db migrate`.

    With a reachable database only pending migrations are included; without one (url None),
    all of them, for a fresh database.
    """
    migrations = load_migrations(root)
    applied: dict[int, tuple[str, str]] = {}
    if url is not None:
        with connect(url) as conn:
            exists = conn.execute("SELECT to_regclass('mailroom.schema_migrations') IS NOT NULL").fetchone()[0]
            applied = applied_versions(conn) if exists else {}
        check_checksums(migrations, applied)
    out = [
        "-- mailroom migration bundle: review, then `psql -v ON_ERROR_STOP=1 -f bundle.sql`",
        "-- One transaction: the migration lock, every pending migration with its ledger row, then sql/.",
        "\\set ON_ERROR_STOP on",
        BOOTSTRAP,
        "BEGIN;",
        f"{LOCK};",
        LEDGER,
    ]
    tail: list[Migration] = []
    for m in migrations:
        if m.version in applied:
            continue
        if not m.transactional:
            tail.append(m)
            continue
        out.append(f"\n-- {m.label}")
        role = [f"SET LOCAL ROLE {OWNER_ROLE};"] if m.as_owner else []
        reset = ["RESET ROLE;"] if m.as_owner else []
        out += [*role, m.text.rstrip(), *reset, _record_sql(m)]
    out.append("\n-- sql/ (idempotent, re-applied on every migrate), as the owner of every object")
    out.append(f"SET LOCAL ROLE {OWNER_ROLE};")
    for path in load_sql_files(root):
        out += [f"-- sql/{path.name}", path.read_text().rstrip()]
    out.append("RESET ROLE;")
    out.append("COMMIT;")
    for m in tail:
        out.append(f"\n-- {m.label} (no transaction: after the others)")
        if m.as_owner:
            out += [f"SET ROLE {OWNER_ROLE};", m.text.rstrip(), "RESET ROLE;", _record_sql(m)]
        else:
            out += [m.text.rstrip(), _record_sql(m)]
    return "\n".join(out) + "\n"


def _record_sql(m: Migration) -> str:
    return (
        "INSERT INTO mailroom.schema_migrations (version, name, sha256) "
        f"VALUES ({m.version}, '{m.name}', '{m.sha256}');"
    )


@dataclass
class DatabaseSchema:
    """What a database has, as far as the connecting login may see (`db status`, `doctor`)."""

    installed: bool
    applied: dict[int, tuple[str, str]] | None  # None: this login may not read it
    reason: str = ""  # why `applied` is None

    @property
    def version(self) -> int | None:
        return max(self.applied, default=0) if self.applied is not None else None


def database_schema(conn: psycopg.Connection) -> DatabaseSchema:
    """The applied migrations through mailroom.list_migrations() (any runtime role may call it), or
    the ledger itself on a schema that predates the function (its owner may read it)."""
    from mailroom.db import sqlapi

    schema, usage = conn.execute(
        "SELECT to_regnamespace('mailroom') IS NOT NULL,"
        " CASE WHEN to_regnamespace('mailroom') IS NULL THEN false ELSE has_schema_privilege('mailroom', 'USAGE') END").fetchone()
    if schema and not usage:
        return DatabaseSchema(True, None, "this login may not call mailroom.list_migrations() (it has no mailroom role)")
    if not schema or not conn.execute("SELECT to_regclass('mailroom.schema_migrations') IS NOT NULL").fetchone()[0]:
        return DatabaseSchema(False, {})
    try:
        with conn.transaction():
            rows = sqlapi.list_migrations.rows(conn)
        return DatabaseSchema(True, {r.version: (r.name, r.sha256) for r in rows})
    except psycopg.errors.UndefinedFunction:
        pass  # a schema older than sql/04_schema_version.sql
    except psycopg.errors.InsufficientPrivilege as exc:
        return DatabaseSchema(True, None, f"this login may not call mailroom.list_migrations() ({exc.diag.message_primary})")
    try:
        with conn.transaction():
            return DatabaseSchema(True, applied_versions(conn))
    except psycopg.errors.InsufficientPrivilege:
        return DatabaseSchema(True, None, "the schema predates mailroom.list_migrations() and this login may not read "
                                          "mailroom.schema_migrations: ask its owner, or run `mailroom db migrate`")
