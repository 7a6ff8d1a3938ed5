"""Citus as seams only (issue 36, item 2): sql/citus/ replaces no base function but declared seams.

No database and no Citus: the files of sql/ and sql/citus/ are parsed for their CREATE FUNCTION
statements (name and argument types) and checked against mailroom.db.citus.SEAMS (hooks: a small
base body) and WHOLE_OVERRIDES (whole bodies still replaced, each with its reason, a list that only
shrinks). docs/architecture.md, "Citus", says how a change to a function with a seam is tested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mailroom.db import citus

ROOT = Path(__file__).resolve().parents[2]
SQL = ROOT / "sql"
CREATE = re.compile(r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+([\w.]+)\s*\(", re.IGNORECASE)
BODY = re.compile(r"\bAS\s+(\$\w*\$|')", re.IGNORECASE)
MODES = {"in", "out", "inout", "variadic"}
ALIASES = {
    "timestamp with time zone": "timestamptz", "int": "integer", "int4": "integer", "int8": "bigint",
    "bool": "boolean", "character varying": "varchar",
}


@dataclass(frozen=True)
class Definition:
    file: str  # e.g. "sql/citus/12_accounts.sql"
    line: int
    code_lines: int  # non-blank lines of the body that are not only a comment
    comment_above: str  # the comment lines right above the CREATE


def _closing(text: str, start: int) -> int:
    depth = 1
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError("unbalanced parentheses")


def _split(args: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in args:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p for p in (*parts, current) if p.strip()]


def argument_types(args: str) -> list[str]:
    """The input argument types of a parameter list, as written: `p_x text DEFAULT 'a'` → `text`."""
    types = []
    for part in _split(re.sub(r"--[^\n]*", "", args)):
        declared = re.split(r"\s+DEFAULT\s+|\s*=\s*", part.strip(), maxsplit=1, flags=re.IGNORECASE)[0]
        words = declared.split()
        mode = words[0].lower() if words[0].lower() in MODES else "in"
        if words[0].lower() in MODES:
            words = words[1:]
        if mode == "out":
            continue
        # every parameter of mailroom is named (house style): the first word is its name
        type_ = " ".join(words[1:] if len(words) > 1 else words).lower()
        type_ = re.sub(r"\s+\[", "[", type_)
        types.append(ALIASES.get(type_, type_))
    return types


def definitions(text: str, file: str) -> dict[str, Definition]:
    """`name(type, …)` → its definition, for every CREATE FUNCTION or PROCEDURE in a file's text."""
    found: dict[str, Definition] = {}
    lines = text.splitlines()
    for match in CREATE.finditer(text):
        close = _closing(text, match.end())
        signature = f"{match.group(1)}({', '.join(argument_types(text[match.end():close]))})"
        body_start = BODY.search(text, close)
        if body_start is None:
            continue
        quote = body_start.group(1)
        body = text[body_start.end():text.index(quote, body_start.end())]
        code = sum(1 for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("--"))
        line = text.count("\n", 0, match.start())  # 0-based index of the CREATE's line
        above = []
        for previous in reversed(lines[:line]):
            if not previous.strip().startswith("--"):
                break
            above.append(previous.strip())
        found.setdefault(signature, Definition(file, line + 1, code, "\n".join(reversed(above))))
    return found


def tree(folder: Path) -> dict[str, Definition]:
    found: dict[str, Definition] = {}
    for path in sorted(folder.glob("*.sql")):
        for signature, definition in definitions(path.read_text(), str(path.relative_to(ROOT))).items():
            found.setdefault(signature, definition)
    return found


def problems(base: dict[str, Definition], on_citus: dict[str, Definition], seams: dict[str, str],
             whole: dict[str, str], max_lines: int, max_whole: int) -> list[str]:
    """What breaks the rule: an undeclared override, a seam that is no hook, a stale or undocumented one."""
    found = []
    overrides = sorted(set(base) & set(on_citus))
    for signature in overrides:
        where = f"{on_citus[signature].file}:{on_citus[signature].line}"
        if signature not in seams and signature not in whole:
            found.append(f"{where} replaces {signature} of {base[signature].file}, which is no declared seam "
                         "(mailroom.db.citus.SEAMS): move the shared logic into the base function and give it a hook")
        if on_citus[signature].file not in base[signature].comment_above:
            found.append(f"{base[signature].file}:{base[signature].line}: the comment above {signature} does not "
                         f"name its Citus form, {on_citus[signature].file}")
    for signature in sorted(set(seams) | set(whole)):
        if signature in seams and signature in whole:
            found.append(f"{signature} is declared both a seam and a whole override")
        if signature not in overrides:
            found.append(f"{signature} is declared but not defined in both sql/ and sql/citus/: drop its entry")
    for signature in sorted(set(seams) & set(overrides)):
        if base[signature].code_lines > max_lines:
            found.append(f"{base[signature].file}:{base[signature].line}: the seam {signature} has "
                         f"{base[signature].code_lines} lines of code in sql/ (at most {max_lines}): a seam is a "
                         "hook, the shared logic belongs in the function that calls it")
    if len(whole) > max_whole:
        found.append(f"{len(whole)} whole overrides declared, at most {max_whole}: the list only shrinks")
    return found


def test_sql_citus_replaces_no_base_function_but_declared_seams() -> None:
    found = problems(tree(SQL), tree(SQL / "citus"), citus.SEAMS, citus.WHOLE_OVERRIDES,
                     citus.SEAM_MAX_LINES, citus.WHOLE_OVERRIDES_MAX)
    assert not found, "\n".join(found)


def test_the_parser_sees_what_it_checks() -> None:
    # the check above is only as good as the parse: both trees hold functions it must see
    base, on_citus = tree(SQL), tree(SQL / "citus")
    assert "mailroom.create_account(text, text)" in base
    assert "mailroom_internal._hmac_many(bytea[], bytea, text)" in base  # created by dynamic SQL (sql/03)
    assert "mailroom_internal._outbound_lane()" in on_citus  # Citus only
    assert base["mailroom_internal._mailbox_id(text)"].code_lines <= citus.SEAM_MAX_LINES
    assert len(set(base) & set(on_citus)) == len(citus.SEAMS) + len(citus.WHOLE_OVERRIDES)


def test_the_check_fails_on_an_undeclared_override_and_on_a_whole_copy() -> None:
    base = definitions(
        "-- Citus form: sql/citus/99_x.sql\n"
        "CREATE OR REPLACE FUNCTION mailroom.f(p_a integer, p_b text DEFAULT 'x')\nRETURNS int\n"
        "LANGUAGE plpgsql\nAS $$\nBEGIN\n" + "    PERFORM 1;\n" * 20 + "END;\n$$;\n"
        "CREATE FUNCTION mailroom.g(OUT p_id bigint, p_x bytea [])\nLANGUAGE sql\nAS $$ SELECT 1 $$;\n",
        "sql/99_x.sql",
    )
    on_citus = definitions(
        "CREATE OR REPLACE FUNCTION mailroom.f(p_a integer, p_b text)\nRETURNS int\nLANGUAGE sql\nAS $$ SELECT 1 $$;\n"
        "CREATE OR REPLACE FUNCTION mailroom.g(p_x bytea[])\nRETURNS int\nLANGUAGE sql\nAS $$ SELECT 2 $$;\n",
        "sql/citus/99_x.sql",
    )
    assert set(base) == {"mailroom.f(integer, text)", "mailroom.g(bytea[])"}
    undeclared = problems(base, on_citus, {}, {}, 15, 0)
    assert any("mailroom.f(integer, text) of sql/99_x.sql, which is no declared seam" in p for p in undeclared)
    assert any("the comment above mailroom.g(bytea[]) does not name its Citus form" in p for p in undeclared)
    whole_copy = problems(base, on_citus, {"mailroom.f(integer, text)": "r", "mailroom.g(bytea[])": "r"}, {}, 15, 0)
    assert [p for p in whole_copy if "is no declared seam" in p] == []
    assert any("the seam mailroom.f(integer, text) has 22 lines of code" in p for p in whole_copy)
    stale = problems(base, on_citus, {"mailroom.f(integer, text)": "r", "mailroom.g(bytea[])": "r",
                                      "mailroom.h()": "r"}, {}, 30, 0)
    assert stale == ["sql/99_x.sql:29: the comment above mailroom.g(bytea[]) does not name its Citus form, "
                     "sql/citus/99_x.sql", "mailroom.h() is declared but not defined in both sql/ and sql/citus/: "
                     "drop its entry"]


def test_the_architecture_names_every_seam() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("\n## Citus\n"):]
    section = section[:section.index("\n## ", 1)]
    missing = [s for s in (*citus.SEAMS, *citus.WHOLE_OVERRIDES)
               if f"`{s.split('(')[0].removeprefix('mailroom_internal.').removeprefix('mailroom.')}" not in section]
    assert not missing, f"docs/architecture.md, Citus, does not name the seams {missing}"
