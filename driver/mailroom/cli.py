"""The `mailroom` command: a root typer app that each driver module adds its commands to."""

from __future__ import annotations

import importlib
import sys

import typer

from mailroom.errors import UserError

app = typer.Typer(
    name="mailroom",
    help="mailroom: a PostgreSQL-native mail lifecycle engine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module exposes register(app); the order is the order of `mailroom --help`.
COMMAND_MODULES = (
    "mailroom.cluster_cli",
    "mailroom.collector",
    "mailroom.inbox_cli",
    "mailroom.expiry",
    "mailroom.sender",
    "mailroom.outbound",
    "mailroom.supervisor",
    "mailroom.demo",
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    """Entry point: run the app, turning UserError into one line and an exit code."""
    try:
        app(standalone_mode=True)
    except UserError as exc:
        print(f"mailroom: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
