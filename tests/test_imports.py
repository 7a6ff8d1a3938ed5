"""The driver's modules import each other without a circle (issue 36, item 5).

The graph is built from the source (ast), not by importing: every `import` and `from … import`
counts, wherever it stands (a module's top, inside a function, under TYPE_CHECKING), so two modules
held apart by an import inside a function are still a circle here. `http/` had one (app ↔ page ↔ ses),
broken by moving ApiError, State (http/state.py) and the credential helpers (http/credentials.py) to
modules of their own.
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
    modules = {module_name(p, root): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
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
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
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


@pytest.mark.parametrize("package", ["http", "core", "db", "accounts", "inboxes", "outbound", "ops", "mcp"])
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
