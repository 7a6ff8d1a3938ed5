"""File numbers, error codes and migration names agree by area (CONTRIBUTING, "Numbers agree by area")."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AREAS = {"0": "foundation", "1": "accounts", "2": "inboxes", "3": "outbound", "4": "collector"}
RAISE = re.compile(r"ERRCODE\s*=\s*'MR([0-9])[0-9]{2}'")
# handed to parallel branches before migrations named their area (they keep their names)
BEFORE_THE_RULE = range(120, 160)


def test_a_sql_file_raises_only_its_areas_codes() -> None:
    wrong = []
    for path in sorted((ROOT / "sql").glob("*.sql")):
        digit = path.name[0]
        assert digit in AREAS, f"{path.name}: no area has the number {path.name[:2]}"
        wrong += [f"{path.name}: MR{d}nn ({AREAS.get(d)})" for d in sorted(set(RAISE.findall(path.read_text())))
                  if d != digit]
    assert wrong == [], "a sql/ file raises another area's codes (move it or renumber the code):\n" + "\n".join(wrong)


def test_each_sql_file_has_its_pgtap_file() -> None:
    tests = {p.name[:2] for p in (ROOT / "tests" / "pgtap").glob("*.sql")}
    missing = [p.name for p in sorted((ROOT / "sql").glob("*.sql")) if p.name[:2] not in tests]
    assert missing == [], f"no tests/pgtap/NN_*.sql for {missing}"


def test_new_migrations_name_their_area() -> None:
    wrong = []
    for path in sorted((ROOT / "migrations").glob("*.sql")):
        version = int(path.name[:4])
        if version < 110 or version in BEFORE_THE_RULE:
            continue
        if not re.match(rf"^[0-9]{{4}}_({'|'.join(AREAS.values())})_[a-z0-9_]+\.sql$", path.name):
            wrong.append(path.name)
    assert wrong == [], f"a migration from 0110 on is NNNN_<area>_<what>.sql: {wrong}"
