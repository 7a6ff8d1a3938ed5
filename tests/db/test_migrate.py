"""The migration runner: ledger, checksums, failures, the psql bundle, and schema drift."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from mailroom import testing
from mailroom.core.errors import UserError
from mailroom.db import migrate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of migrations/ and sql/ that a test may add files to."""
    root = tmp_path / "project"
    shutil.copytree(ROOT / "migrations", root / "migrations")
    shutil.copytree(ROOT / "sql", root / "sql")
    return root


@pytest.fixture
def empty_db(pg):
    name = f"m_{id(object()) & 0xFFFFFF:x}"
    url = testing.create_database(pg, name)
    yield url
    testing.drop_database(pg, name)


def ledger(url: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT version, name, sha256 FROM mailroom.schema_migrations ORDER BY 1").fetchall()


def dump(pg, url: str) -> str:
    dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    out = subprocess.run(
        ["pg_dump", "--schema-only", "--no-owner", "-h", str(pg.home), "-p", str(pg.port), "-U", "postgres", dbname],
        capture_output=True, text=True, check=True,
    ).stdout
    return "\n".join(line for line in out.splitlines() if not line.startswith(("--", "\\restrict", "\\unrestrict")))


def test_ledger_records_every_file_with_its_checksum(empty_db, project):
    result = migrate.migrate(empty_db, root=project)
    files = sorted(p.name for p in (project / "migrations").glob("*.sql"))
    # in one transaction in order, then those that cannot run in one (mailroom:no-transaction), in order
    loaded = migrate.load_migrations(project)
    assert result.applied == [m.name for m in loaded if m.transactional] + [m.name for m in loaded if not m.transactional]
    rows = ledger(empty_db)
    assert sorted(r[1] for r in rows) == files
    for version, name, sha in rows:
        assert migrate.Migration(version, name, project / "migrations" / name,
                                 (project / "migrations" / name).read_text()).sha256 == sha
    assert migrate.migrate(empty_db, root=project).applied == []


def test_failing_migration_names_file_and_line_and_applies_nothing(empty_db, project):
    migrate.migrate(empty_db, root=project)
    (project / "migrations" / "9997_fine.sql").write_text("CREATE TABLE mailroom.fine_before (id int);\n")
    bad = project / "migrations" / "9998_bad.sql"
    bad.write_text("CREATE TABLE mailroom.half_done (id int);\n\nSELECT no_such_function();\n")
    with pytest.raises(UserError) as err:
        migrate.migrate(empty_db, root=project)
    assert "migrations/9998_bad.sql line 3" in str(err.value)
    assert "no_such_function" in str(err.value)
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT to_regclass('mailroom.half_done')").fetchone()[0] is None
        # one transaction: the migration before it in the same run is not kept either
        assert conn.execute("SELECT to_regclass('mailroom.fine_before')").fetchone()[0] is None
    assert {9997, 9998}.isdisjoint(r[0] for r in ledger(empty_db))


def test_a_failing_sql_file_keeps_the_functions_the_migrations_dropped(empty_db, project):
    """The issue-20 window: a migration drops a function to change its signature and sql/ re-creates
    it. If sql/ fails, the drop must not stay committed (workers would meet 42883 until a fix)."""
    migrate.migrate(empty_db, root=project)
    testing.ensure_test_logins(empty_db)
    (project / "migrations" / "9997_drop.sql").write_text("DROP FUNCTION mailroom.schema_version();\n")
    (project / "sql" / "99_broken.sql").write_text("SELECT mailroom.no_such_function();\n")
    with pytest.raises(UserError, match=r"sql/99_broken.sql line 1: .*no_such_function.*nothing was applied"):
        migrate.migrate(empty_db, root=project)
    with psycopg.connect(testing.as_login(empty_db, "mr_app")) as conn:
        assert conn.execute("SELECT mailroom.schema_version()").fetchone()[0] == max(v for v, *_ in ledger(empty_db))
    assert 9997 not in [r[0] for r in ledger(empty_db)]


def test_cli_reports_failing_migration_in_one_line(db_url, project):
    (project / "migrations" / "9998_bad.sql").write_text("SELECT 1/0;\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mailroom", "db", "migrate"],
        env={"PATH": "/usr/bin:/bin", "MAILROOM_DATABASE_URL": db_url, "MAILROOM_HOME": str(project)},
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "mailroom: error: migrations/9998_bad.sql: division by zero (SQLSTATE 22012); "
        "nothing was applied"
    )


def test_edited_migration_is_refused(empty_db, project):
    migrate.migrate(empty_db, root=project)
    first = sorted((project / "migrations").glob("*.sql"))[0]
    first.write_text(first.read_text() + "\n-- edited\n")
    with pytest.raises(UserError, match=rf"migrations/{first.name} was edited after it was applied"):
        migrate.migrate(empty_db, root=project)


def test_no_transaction_marker_allows_concurrent_index(empty_db, project):
    (project / "migrations" / "9997_concurrent.sql").write_text(
        "-- mailroom:no-transaction\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS settings_value_idx\n    ON mailroom.settings (value);\n"
    )
    migrate.migrate(empty_db, root=project)
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT to_regclass('mailroom.settings_value_idx')").fetchone()[0] is not None
    assert 9997 in [r[0] for r in ledger(empty_db)]


def print_bundle(*flags: str, url: str | None = None) -> str:
    env = {"PATH": "/usr/bin:/bin", **({"MAILROOM_DATABASE_URL": url} if url else {})}
    proc = subprocess.run([sys.executable, "-m", "mailroom", "db", "migrate", "--print", *flags],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_printed_bundle_applies_through_psql_and_is_recorded(empty_db, pg, tmp_path):
    # as in the README: mailroom db migrate --print > bundle.sql; psql -v ON_ERROR_STOP=1 -f bundle.sql
    bundle = tmp_path / "bundle.sql"
    bundle.write_text(print_bundle("--offline"))
    proc = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(bundle), empty_db],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ledger(empty_db) == ledger_of_fresh_build(pg)
    # the runner sees everything as applied and only re-applies sql/
    assert migrate.migrate(empty_db).applied == []
    # against an up-to-date database the bundle holds no migration, only sql/
    again = print_bundle(url=empty_db)
    assert "-- migrations/" not in again
    assert "-- sql/00_clock.sql" in again
    # one transaction under the table lock, as `db migrate` runs; no advisory lock
    body = again[again.index("BEGIN;"):]
    assert body.index("LOCK TABLE mailroom.migration_lock IN SHARE UPDATE EXCLUSIVE MODE;") < body.index("-- sql/")
    assert body.count("BEGIN;") == 1 and body.rstrip().endswith("COMMIT;")
    assert "advisory" not in again[:again.index("BEGIN;")] and "7305853001" not in again  # 0.1.0's lock key


def ledger_of_fresh_build(pg) -> list[tuple]:
    url = testing.migrated_database(pg, "m_reference")
    try:
        return ledger(url)
    finally:
        testing.drop_database(pg, "m_reference")


def test_sql_is_idempotent(pg):
    """Re-applying sql/ changes nothing (upgrades from a real previous release: tests/db/test_upgrade.py)."""
    fresh = testing.migrated_database(pg, "m_fresh")
    try:
        before = dump(pg, fresh)
        assert migrate.migrate(fresh).applied == []
        assert dump(pg, fresh) == before, "re-applying sql/ changed the schema"
    finally:
        testing.drop_database(pg, "m_fresh")


def test_migrate_prints_what_migrations_say(db_url, project):
    """Issue 21 item 9: NOTICE and WARNING of a migration reach the operator, with the file they came
    from; PostgreSQL's own "already exists, skipping" chatter does not."""
    (project / "migrations" / "9990_says.sql").write_text(
        "DO $$ BEGIN RAISE NOTICE 'hello from 9990'; RAISE WARNING 'careful: %', 'something' "
        "USING HINT = 'do this'; END $$;\n"
        "CREATE TABLE IF NOT EXISTS mailroom.settings (name text);\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "mailroom", "db", "migrate"],
        env={"PATH": "/usr/bin:/bin", "MAILROOM_DATABASE_URL": db_url, "MAILROOM_HOME": str(project)},
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert "migrations/9990_says.sql: NOTICE: hello from 9990" in lines, proc.stderr
    assert "migrations/9990_says.sql: WARNING: careful: something HINT: do this" in lines, proc.stderr
    assert "skipping" not in proc.stderr
    assert "applied 9990_says.sql" in lines
    assert any(line.startswith("migrations applied: 1; sql files applied:") and "locks held" in line for line in lines)


def test_version_names_the_package_and_its_schema(tmp_path):
    from mailroom import __version__

    proc = subprocess.run([sys.executable, "-m", "mailroom", "--version"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    last = max(m.version for m in migrate.load_migrations())
    assert proc.stdout == f"mailroom {__version__} (schema {last})\n"


@pytest.mark.parametrize("login", ["mr_admin", "mr_monitor", "mr_collector"])
def test_db_status_works_for_runtime_logins(db_url, login):
    """Issue 23 reported a traceback for the admin: the ledger is the owner's; status reads
    mailroom.list_migrations(), which every runtime role may call."""
    proc = subprocess.run([sys.executable, "-m", "mailroom", "db", "status"],
                          env={"PATH": "/usr/bin:/bin", "MAILROOM_DATABASE_URL": testing.as_login(db_url, login)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    last = max(m.version for m in migrate.load_migrations())
    assert f"schema:   {last} (" in proc.stdout, proc.stdout
    assert "pending:  none" in proc.stdout, proc.stdout


def test_db_status_says_what_is_pending_and_what_a_stranger_may_not_see(pg, db_url, project):
    from test_upgrade import install_previous_release

    # 0.1.0 as it was released (before list_migrations()): this release's sql/ needs its migrations
    previous = install_previous_release(pg, "status_from_0_1_0")
    env = {"PATH": "/usr/bin:/bin", "MAILROOM_DATABASE_URL": previous}
    proc = subprocess.run([sys.executable, "-m", "mailroom", "db", "status"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "schema:   100 (" in proc.stdout and "0120_migration_lock.sql" in proc.stdout, proc.stdout
    with psycopg.connect(pg.url("postgres"), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'mr_stranger'").fetchone():
            conn.execute("CREATE ROLE mr_stranger LOGIN")
    env["MAILROOM_DATABASE_URL"] = testing.as_login(db_url, "mr_stranger")
    proc = subprocess.run([sys.executable, "-m", "mailroom", "db", "status"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr
    assert "schema:   unknown: this login may not call mailroom.list_migrations()" in proc.stdout, proc.stdout + proc.stderr
    testing.drop_database(pg, "status_from_0_1_0")
