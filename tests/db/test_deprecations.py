"""Deprecations on a schedule (issue 36, item 4): every shim says `Deprecated since X, removed in Y`,
and this test fails once the package's version reaches Y, so a shim cannot outlive its release.

Read from the migrated catalog (every function's COMMENT) and from the `sql/` files (a `--` line that
says a form is deprecated or goes "in the next release" must name the versions too).
"""

from __future__ import annotations

import re
from pathlib import Path

import mailroom

ROOT = Path(__file__).resolve().parents[2]
SCHEDULE = re.compile(r"[Dd]eprecated since (\d+\.\d+\.\d+), removed in (\d+\.\d+\.\d+)")
UNDATED = re.compile(r"[Dd]eprecated|next release", re.IGNORECASE)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.match(r"(\d+)\.(\d+)\.(\d+)", version).groups())


def test_every_deprecated_function_names_its_release_and_its_removal(conn):
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text, obj_description(p.oid, 'pg_proc') FROM pg_proc AS p"
        " WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace)"
        " AND obj_description(p.oid, 'pg_proc') ~* 'deprecated'"
    ).fetchall()
    assert rows, "no deprecated function at all: drop this test's schedule check with the last shim"
    current = _release(mailroom.__version__)
    for name, comment in rows:
        match = SCHEDULE.search(comment)
        assert match, f"{name}: a deprecation without 'Deprecated since X, removed in Y': {comment!r}"
        since, removed = _release(match.group(1)), _release(match.group(2))
        assert since < removed, name
        assert current < removed, (f"{name} was to be removed in {match.group(2)} and the package is "
                                   f"{mailroom.__version__}: a migration drops it now (CONTRIBUTING, contract)")


def test_sql_files_date_what_they_deprecate():
    for path in sorted((ROOT / "sql").rglob("*.sql")):
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if UNDATED.search(line) and not SCHEDULE.search(line):
                raise AssertionError(f"{path.relative_to(ROOT)}:{n}: a deprecation without its dates: {line.strip()}")
