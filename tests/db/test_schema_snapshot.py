"""The committed schema snapshot (tests/db/schema.snapshot) is what a fresh `db migrate` builds.

Any difference fails with the diff and the command that regenerates the file: a schema change is
always a reviewed change of that file."""

from __future__ import annotations

import difflib
from pathlib import Path

import psycopg
import pytest

from mailroom import testing
from mailroom.db import snapshot

ROOT = Path(__file__).resolve().parents[2]


def take(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        return snapshot.take(conn)


def diff(want: str, got: str, want_name: str, got_name: str) -> str:
    return "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), want_name, got_name, n=0))


def test_a_fresh_migrate_matches_the_committed_snapshot(db_url):
    want = (ROOT / testing.SNAPSHOT).read_text()
    got = take(db_url)
    if got != want:
        pytest.fail(
            f"the schema a fresh migrate builds differs from {testing.SNAPSHOT}:\n"
            f"{diff(want, got, str(testing.SNAPSHOT), 'fresh migrate')}\n"
            f"If the change is meant, regenerate the file with `{testing.SNAPSHOT_COMMAND}` and commit it.",
            pytrace=False,
        )


@pytest.mark.parametrize("change", [
    # a function body, a grant, a comment, an index, a column default, a trigger, a table's privilege
    "CREATE OR REPLACE FUNCTION mailroom.schema_version() RETURNS integer LANGUAGE sql STABLE SECURITY DEFINER"
    " SET search_path = pg_catalog, pg_temp AS $$ SELECT 1 $$",
    "REVOKE EXECUTE ON FUNCTION mailroom.schema_version() FROM mailroom_app",
    "COMMENT ON FUNCTION mailroom.schema_version() IS 'changed'",
    "CREATE INDEX settings_kind_idx ON mailroom.settings (kind)",
    "ALTER TABLE mailroom.settings ALTER COLUMN description SET DEFAULT 'x'",
    "ALTER TABLE mailroom.tokens DISABLE TRIGGER USER",
    "GRANT SELECT ON mailroom.settings TO mailroom_monitor",
    "ALTER TABLE mailroom.migration_lock OWNER TO postgres",
])
def test_the_snapshot_sees_each_kind_of_change(db_url, change):
    before = take(db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(change)
    after = take(db_url)
    assert after != before, f"the snapshot missed: {change}"
    assert len(diff(before, after, "a", "b").splitlines()) <= 12, "one change, a few lines of diff"


def test_time_partitions_of_the_day_are_left_out(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        parts = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'mailroom'::regnamespace AND relispartition"
            " AND relname ~ '_p[0-9]{8}t[0-9]{4}$'").fetchone()[0]
        assert parts > 0, "a fresh migrate makes time partitions (sql/05_partitions.sql)"
    text = take(db_url)
    assert "_default" in text and "partition-by=RANGE" in text
    assert not any(line for line in text.splitlines() if "_p20" in line), "no dated partition in the snapshot"
