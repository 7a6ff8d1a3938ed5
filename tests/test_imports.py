"""The driver's modules import each other without a circle (issue 36, item 5), and only down the layers
(issue 43, item 5; docs/architecture.md, "Layering").

The graph is built from the source (ast), not by importing: every `import` and `from … import`
counts, wherever it stands (a module's top, inside a function, under TYPE_CHECKING), so two modules
held apart by an import inside a function are still a circle here. `http/` had one (app ↔ page ↔ ses),
broken by moving ApiError, State (http/state.py) and the credential helpers (http/credentials.py) to
modules of their own.

The layers: core ← db ← areas (accounts, inboxes, outbound, checks) ← api ← faces (http, mcp) ← ops ←
the root command (cli.py) ← `python -m mailroom` (__main__.py) ← the test harness (testing.py). A
module imports only its own package and the layers below it: no area imports another, no face
another; the failure names each offending import with its file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mailroom

ROOT = Path(mailroom.__file__).parent


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


def import_graph(package: Path, root: Path = ROOT) -> dict[str, set[str]]:
    """module → the modules of `package` it imports (a `from pkg import mod` names the submodule)."""
    return {name: {target for target, _ in found} for name, found in module_imports(package, root).items()}


def module_imports(package: Path, root: Path = ROOT) -> dict[str, list[tuple[str, int]]]:
    """module → (a module of `package` it imports, the line of the import), in the order of the source."""
    modules = {module_name(p, root): p for p in package.rglob("*.py")}
    graph: dict[str, list[tuple[str, int]]] = {name: [] for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for imported in targets:
                # the longest module of the package the name starts with
                target = imported
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + ".") \
                        and (target, node.lineno) not in graph[name]:
                    graph[name].append((target, node.lineno))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = grey
        stack.append(node)
        for nxt in sorted(graph[node]):
            if colour[nxt] == grey:
                return [*stack[stack.index(nxt):], nxt]
            if colour[nxt] == white and (found := visit(nxt)):
                return found
        stack.pop()
        colour[node] = black
        return None

    for node in sorted(graph):
        if colour[node] == white and (found := visit(node)):
            return found
    return None


PACKAGES = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").exists())


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    graph = import_graph(ROOT / package)
    assert graph, f"no modules under {package}"
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " → ".join(cycle or [])


def test_the_checker_sees_a_function_level_circle(tmp_path: Path) -> None:
    # the test above must be able to fail: the circle http/ had, held apart by an import inside a function
    root = tmp_path / "mailroom"
    (root / "http").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "http" / "__init__.py").write_text("")
    (root / "http" / "app.py").write_text("from mailroom.http import page\n")
    (root / "http" / "page.py").write_text("def add_routes():\n    from .app import ApiError\n")
    graph = import_graph(root / "http", root)
    assert find_cycle(graph) == ["mailroom.http.app", "mailroom.http.page", "mailroom.http.app"]
    real = import_graph(ROOT / "http")
    assert "mailroom.http.state" in real["mailroom.http.page"]
    assert "mailroom.http.page" in real["mailroom.http.app"]


# the layers, lowest first: a module imports its own package and the layers below it, nothing else
LAYERS: list[tuple[str, set[str]]] = [
    ("core", {"__init__", "core"}),  # mailroom/__init__.py holds only __version__
    ("db", {"db"}),
    ("areas", {"accounts", "inboxes", "outbound", "checks"}),
    ("api", {"api"}),  # the operation table (docs/architecture.md, "Agreed for issues 43–47")
    ("faces", {"http", "mcp"}),
    ("ops", {"ops"}),
    ("the root command", {"cli"}),
    ("python -m mailroom", {"__main__"}),
    ("the test harness", {"testing"}),
]
LAYER = {unit: (rank, layer) for rank, (layer, units) in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    """mailroom.db.hub → db; mailroom.cli → cli; mailroom → __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layering_breaks(root: Path = ROOT) -> list[str]:
    """Every import that goes up or sideways, as `file:line: a imports b (why)`."""
    breaks = []
    for name, found in sorted(module_imports(root, root).items()):
        unit = unit_of(name)
        if unit not in LAYER:
            breaks.append(f"{name}: {unit} is in no layer (place it in LAYERS and in docs/architecture.md)")
            continue
        rank, layer = LAYER[unit]
        for target, line in found:
            other = unit_of(target)
            if any(t.startswith(target + ".") and at == line for t, at in found):
                continue  # `from mailroom.accounts import secret_key`: named once, by its module
            if other == unit or other not in LAYER:
                continue  # within a package (circles: above); an unplaced one is reported for itself
            other_rank, other_layer = LAYER[other]
            if other_rank < rank:
                continue
            why = (f"no module of {layer} imports another of its layer" if other_rank == rank
                   else f"{layer} is below {other_layer}")
            path = name.replace(".", "/") + (".py" if not (root.parent / name.replace(".", "/")).is_dir()
                                             else "/__init__.py")
            breaks.append(f"{path}:{line}: {name} imports {target} ({why})")
    return breaks


def test_imports_go_down_the_layers() -> None:
    breaks = layering_breaks()
    assert not breaks, "imports against the layering (docs/architecture.md, Layering):\n" + "\n".join(breaks)


def test_the_layering_check_names_the_offending_import(tmp_path: Path) -> None:
    # the breaks issue 43 found: db importing an area, an area another, a face another, and core an area
    root = tmp_path / "mailroom"
    for package in ("core", "db", "accounts", "outbound", "http", "mcp", "ops"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "accounts" / "secret_key.py").write_text("")
    (root / "http" / "events.py").write_text("")
    (root / "db" / "migrate.py").write_text("import os\n\ndef f():\n    from mailroom.accounts import secret_key\n")
    (root / "outbound" / "sender.py").write_text("from mailroom.accounts.secret_key import check\n")
    (root / "mcp" / "server.py").write_text("from mailroom.core import log\nfrom mailroom.http.events import Hub\n")
    (root / "ops" / "run.py").write_text("from mailroom.accounts import secret_key\nfrom mailroom.mcp import server\n")
    (root / "core" / "log.py").write_text("import mailroom.db.migrate\n")
    (root / "nowhere.py").write_text("")
    assert layering_breaks(root) == [
        "mailroom/core/log.py:1: mailroom.core.log imports mailroom.db.migrate (core is below db)",
        "mailroom/db/migrate.py:4: mailroom.db.migrate imports mailroom.accounts.secret_key (db is below areas)",
        "mailroom/mcp/server.py:2: mailroom.mcp.server imports mailroom.http.events"
        " (no module of faces imports another of its layer)",
        "mailroom.nowhere: nowhere is in no layer (place it in LAYERS and in docs/architecture.md)",
        "mailroom/outbound/sender.py:1: mailroom.outbound.sender imports mailroom.accounts.secret_key"
        " (no module of areas imports another of its layer)",
    ]
