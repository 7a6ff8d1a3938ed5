"""Where the SQL that `db migrate` applies comes from: the package itself.

`migrations/` and `sql/` live at the top of the repository and ship inside the wheel and the sdist
as the resource packages `mailroom.db.migrations` and `mailroom.db.sql` (pyproject.toml maps
them), so an installed `mailroom` carries the exact SQL of its version and needs no checkout. They
are read with importlib.resources: from the wheel's files when installed, from the checkout's
top-level directories in an editable install.

`MAILROOM_HOME` (a directory holding `migrations/` and `sql/`) overrides the packaged files; it is
meant for developing the SQL against an installed driver, and is not needed otherwise.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from mailroom.core.errors import UserError

HOME_ENV = "MAILROOM_HOME"
_MIGRATION_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class SchemaFiles:
    """The two directories of SQL a migrate applies, and where they came from (for messages)."""

    migrations: Traversable
    sql: Traversable
    origin: str  # "the mailroom package", or the MAILROOM_HOME / root directory

    def migration_files(self) -> list[Traversable]:
        return sorted((f for f in self.migrations.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)

    def sql_files(self) -> list[Traversable]:
        return sorted((f for f in self.sql.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)

    def citus_files(self) -> list[Traversable]:
        """sql/citus/: the distributed layout, applied after sql/ on a Citus coordinator only (docs/scale.md)."""
        citus = self.sql / "citus"
        if not citus.is_dir():
            return []
        return sorted((f for f in citus.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)


def schema_files(root: Path | None = None) -> SchemaFiles:
    """The SQL of this driver: `root` (tests) or MAILROOM_HOME when given, else the packaged files."""
    if root is None and os.environ.get(HOME_ENV):
        root = Path(os.environ[HOME_ENV])
    if root is not None:
        if not (root / "migrations").is_dir() or not (root / "sql").is_dir():
            raise UserError(f"{root} holds no migrations/ and sql/ directories ({HOME_ENV})", exit_code=2)
        return SchemaFiles(root / "migrations", root / "sql", str(root))
    try:
        return SchemaFiles(resources.files("mailroom.db.migrations"), resources.files("mailroom.db.sql"),
                           "the mailroom package")
    except ModuleNotFoundError:  # pragma: no cover - a broken install
        raise UserError("this mailroom installation carries no SQL (mailroom.db.migrations); reinstall it") from None


def schema_version(root: Path | None = None) -> int:
    """The schema version this driver expects: the number of its last migration."""
    versions = [int(m.group(1)) for f in schema_files(root).migration_files() if (m := _MIGRATION_NAME.match(f.name))]
    return max(versions, default=0)


def checkout_root() -> Path | None:
    """The repository this driver runs from (an editable install), or None for an installed package."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "pyproject.toml").is_file() and (parent / "migrations").is_dir() and (parent / "tests").is_dir():
            return parent
    return None
