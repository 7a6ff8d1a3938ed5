"""The `mailroom` command: a root group that loads each area's typer commands only when used.

`mailroom collect` imports the accounts area and nothing of the others (`mailroom --help`
imports them all to render their help).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from typer.core import TyperGroup

from mailroom.core.errors import UserError

# name -> (module, attribute holding the typer app, command inside it or None for a group)
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "db": ("mailroom.db.cli", "db_app", None),
    "collect": ("mailroom.accounts.cli", "app", "collect"),
    "keys": ("mailroom.accounts.cli", "keys_app", None),
    "inbox": ("mailroom.inboxes.cli", "inbox_app", None),
    "expire": ("mailroom.inboxes.cli", "app", "expire"),
    "send": ("mailroom.outbound.cli", "app", "send"),
    "outbound": ("mailroom.outbound.cli", "outbound", None),
    "suppress": ("mailroom.outbound.cli", "suppress_app", None),
    "run": ("mailroom.ops.cli", "app", "run"),
    "demo": ("mailroom.ops.cli", "app", "demo"),
    "doctor": ("mailroom.ops.cli", "app", "doctor"),
    "maintain": ("mailroom.ops.cli", "app", "maintain"),
    "http": ("mailroom.http.cli", "http_app", None),
    "apikey": ("mailroom.http.cli", "apikey_app", None),
    "catchall": ("mailroom.http.cli", "catchall_app", None),
}


def load_command(name: str) -> Any:
    """Import one area's typer app and return the click command for `name`."""
    import typer.main

    module, attribute, command = COMMANDS[name]
    typer_app = getattr(importlib.import_module(module), attribute)
    if command is None:
        group = typer.main.get_group(typer_app)
        group.name = name
        return group
    return typer.main.get_group(typer_app).commands[command]


class LazyGroup(TyperGroup):
    """A typer group whose sub-commands are imported on first use (help imports them all)."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        return load_command(cmd_name)


app = LazyGroup(
    name="mailroom",
    help="mailroom: a PostgreSQL-native mail lifecycle engine. `mailroom --version` prints the version and the "
    "schema version it installs.",
    no_args_is_help=True,
)


def version_line() -> str:
    """`mailroom --version`: the package's version and the schema version its SQL brings."""
    from mailroom import __version__
    from mailroom.db.files import schema_version

    return f"mailroom {__version__} (schema {schema_version()})"


def main() -> None:
    """Entry point: run the app, turning UserError into one line and an exit code."""
    if sys.argv[1:2] in (["--version"], ["-V"]):
        print(version_line())
        return
    try:
        app.main(prog_name="mailroom", standalone_mode=True)
    except UserError as exc:
        print(f"mailroom: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
