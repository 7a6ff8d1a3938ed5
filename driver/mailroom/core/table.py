"""Plain-text output of the operator commands: one format for values, tables and key/value blocks.

Times are UTC (`2030-01-01 12:00:00Z`), ages short (`3m`, `2h 5m`), NULL is `-`, booleans yes/no.
Nothing here decides what a value means; the SQL functions did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import typer


def fmt(value: Any) -> str:
    """One value as text."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.0f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


def table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str], *, headers: Sequence[str] | None = None,
          indent: str = "", empty: str | None = None) -> None:
    """Rows as aligned columns under upper-case headers (`empty` printed instead when there is no row)."""
    cells = [[fmt(r[c]) if not isinstance(r[c], str) else r[c] for c in columns] for r in rows]
    if not cells and empty is not None:
        typer.echo(f"{indent}{empty}")
        return
    names = [h.upper() for h in (headers or columns)]
    widths = [max([len(n)] + [len(row[i]) for row in cells]) for i, n in enumerate(names)]
    typer.echo(indent + "  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip())
    for row in cells:
        typer.echo(indent + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def fields(pairs: Mapping[str, Any], *, indent: str = "") -> None:
    """`label  value` lines, labels aligned."""
    width = max((len(k) for k in pairs), default=0)
    for key, value in pairs.items():
        typer.echo(f"{indent}{key.ljust(width)}  {fmt(value) if not isinstance(value, str) else value}")
