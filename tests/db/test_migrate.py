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
    assert result.applied == files
    rows = ledger(empty_db)
    assert [r[1] for r in rows] == files
    for version, name, sha in rows:
        assert migrate.Migration(version, name, project / "migrations" / name,
                                 (project / "migrations" / name).read_text()).sha256 == sha
    assert migrate.migrate(empty_db, root=project).applied == []


def test_failing_migration_names_file_and_line_and_applies_nothing(empty_db, project):
    migrate.migrate(empty_db, root=project)
    bad = project / "migrations" / "9998_bad.sql"
    bad.write_text("CREATE TABLE mailroom.half_done (id int);\n\nSELECT no_such_function();\n")
    with pytest.raises(UserError) as err:
        migrate.migrate(empty_db, root=project)
    assert "migrations/9998_bad.sql line 3" in str(err.value)
    assert "no_such_function" in str(err.value)
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT to_regclass('mailroom.half_done')").fetchone()[0] is None
    assert 9998 not in [r[0] for r in ledger(empty_db)]


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
        "nothing from this file was applied"
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


def ledger_of_fresh_build(pg) -> list[tuple]:
    url = testing.migrated_database(pg, "m_reference")
    try:
        return ledger(url)
    finally:
        testing.drop_database(pg, "m_reference")


def test_sql_is_idempotent_and_upgrades_match_fresh_builds(pg):
    fresh = testing.migrated_database(pg, "m_fresh")
    upgraded = testing.create_database(pg, "m_upgraded")
    try:
        before = dump(pg, fresh)
        migrate.migrate(fresh)
        assert dump(pg, fresh) == before, "re-applying sql/ changed the schema"

        versions = [m.version for m in migrate.load_migrations()]
        assert len(versions) >= 2
        # an older release: the first half of the migrations; then upgrade to this one
        migrate.migrate(upgraded, upto=versions[len(versions) // 2 - 1], apply_sql=False)
        assert migrate.migrate(upgraded).applied == [m.name for m in migrate.load_migrations()][len(versions) // 2:]
        assert dump(pg, upgraded) == before, "an upgraded database differs from a fresh build"
    finally:
        testing.drop_database(pg, "m_fresh")
        testing.drop_database(pg, "m_upgraded")
