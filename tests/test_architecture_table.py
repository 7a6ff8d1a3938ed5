"""docs/architecture.md's table "The driver, by folder" names every module of driver/mailroom/, each in
its own package's row, and names no module that does not exist (issue 43, item 5).

A row is a package (`mailroom/db/`: its modules named by file, `hub.py`, or by path from the package
root, `core/supervisor.py`; a third column other than "—" names its `cli.py`) or a top-level module
(`mailroom/cli.py`). `__init__.py` files are the packages themselves and are not named.
"""

from __future__ import annotations

import re
from pathlib import Path

import mailroom

ROOT = Path(mailroom.__file__).parent
DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
HEADING = "## The driver, by folder"


def cells(line: str) -> list[str]:
    """A table row's cells; a `|` inside backticks (`pgtap|all`) does not split."""
    out, cell, quoted = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            quoted = not quoted
        if ch == "|" and not quoted:
            out.append(cell.strip())
            cell = ""
        else:
            cell += ch
    return [*out, cell.strip()]


def table_rows(text: str) -> list[list[str]]:
    lines = text[text.index(HEADING):].splitlines()[1:]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:  # the header and its rule
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return rows


def named_modules(text: str, root: Path = ROOT) -> tuple[dict[str, set[str]], set[str], list[str]]:
    """(package or module of a row → the modules it names of its own, every module named, the rows'
    problems). Paths are relative to `root`, as `db/hub.py`."""
    own: dict[str, set[str]] = {}
    named: set[str] = set()
    problems: list[str] = []
    for row in table_rows(text):
        head = re.fullmatch(r"`mailroom/([\w/.]+)`", row[0])
        if head is None:
            problems.append(f"a row that names no package or module of mailroom/: {row[0]}")
            continue
        subject = head.group(1).rstrip("/")
        is_package = head.group(1).endswith("/")
        mentioned = set(re.findall(r"`([\w/]+\.py)`", " ".join(row[1:])))
        if is_package and len(row) > 2 and row[2] not in ("—", "-", ""):
            mentioned.add("cli.py")
        names = set()
        for token in mentioned:
            names.add(token if "/" in token or not is_package else f"{subject}/{token}")
        if not is_package:
            names.add(subject)
        own[subject] = {n for n in names if n == subject or n.startswith(subject + "/")}
        named |= names
    return own, named, problems


def modules(root: Path = ROOT) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*.py") if p.name != "__init__.py"}


def table_problems(text: str, root: Path = ROOT) -> list[str]:
    own, named, problems = named_modules(text, root)
    actual = modules(root)
    packages = {p.relative_to(root).as_posix() for p in root.iterdir() if (p / "__init__.py").exists()}
    for package in sorted(packages - own.keys()):
        problems.append(f"mailroom/{package}/ has no row")
    for subject in sorted(own.keys() - packages - actual):
        problems.append(f"a row for mailroom/{subject}, which does not exist")
    for path in sorted(actual):
        subject = path.split("/")[0] if "/" in path else path
        if path not in own.get(subject, set()):
            problems.append(f"mailroom/{path} is not named in the row of mailroom/{subject}")
    for path in sorted(named - actual):
        problems.append(f"mailroom/{path} is named but does not exist")
    return problems


def test_the_driver_table_names_every_module() -> None:
    problems = table_problems(DOC.read_text())
    assert not problems, f"{DOC.name}, {HEADING[3:]}:\n" + "\n".join(problems)


def test_the_table_check_can_fail(tmp_path: Path) -> None:
    root = tmp_path / "mailroom"
    (root / "db").mkdir(parents=True)
    (root / "mcp").mkdir()
    for path in ("__init__.py", "db/__init__.py", "db/hub.py", "db/cli.py", "mcp/__init__.py", "mcp/server.py",
                 "cli.py", "__main__.py"):
        (root / path).write_text("")
    text = (f"{HEADING}\n\n| package | what | commands (`cli.py`) |\n|---|---|---|\n"
            "| `mailroom/db/` | the hub (`hub.py`), the keyring (`keyring.py`) | `db` |\n"
            "| `mailroom/cli.py` | the root (`pgtap|all`, `ops/gone.py`) | — |\n\nafter\n")
    assert table_problems(text, root) == [
        "mailroom/mcp/ has no row",
        "mailroom/__main__.py is not named in the row of mailroom/__main__.py",
        "mailroom/mcp/server.py is not named in the row of mailroom/mcp",
        "mailroom/db/keyring.py is named but does not exist",
        "mailroom/ops/gone.py is named but does not exist",
    ]
