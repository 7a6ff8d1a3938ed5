"""The `mailroom` command: a root group that loads each area's typer commands only when used.

`mailroom collect` imports the accounts area and nothing of the others (`mailroom --help`
imports them all to render their help). Every failure ends here as one line on stderr,
`mailroom: error: …`, and an exit code: 2 for usage and configuration (a typo, a bad value, a
missing argument: click's own errors too, never its boxed panel), 1 for a runtime failure.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from mailroom.core.errors import UserError
from mailroom.core.options import CONTEXT_SETTINGS

try:  # typer vendors click from 0.2x on; its commands raise that click's exceptions
    from typer import _click as click_impl
except ImportError:  # pragma: no cover - an older typer on the real click
    import click as click_impl

# name -> (module, attribute holding the typer app, command inside it or None for a group)
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "db": ("mailroom.db.cli", "db_app", None),
    "settings": ("mailroom.db.cli", "settings_app", None),
    "erase": ("mailroom.db.cli", "erase_app", "erase"),
    "status": ("mailroom.ops.cli", "app", "status"),
    "collect": ("mailroom.accounts.cli", "app", "collect"),
    "keys": ("mailroom.accounts.cli", "keys_app", None),
    "account": ("mailroom.accounts.cli", "account_app", None),
    "inbox": ("mailroom.inboxes.cli", "inbox_app", None),
    "plans": ("mailroom.inboxes.cli", "app", "plans"),
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
    "mcp": ("mailroom.mcp.cli", "app", "mcp"),
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
    context_settings=CONTEXT_SETTINGS,
    rich_markup_mode=None,
)


def version_line() -> str:
    """`mailroom --version`: the package's version and the schema version its SQL brings."""
    from mailroom import __version__
    from mailroom.db.files import schema_version

    return f"mailroom {__version__} (schema {schema_version()})"


def fail(message: str, exit_code: int) -> None:
    """The one way the command line ends in error: one line on stderr and the exit code."""
    print(f"mailroom: error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(exit_code)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; UserError and click's usage errors become one line and an exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    supervisor = os.environ.pop("MAILROOM_SUPERVISOR_PID", "")  # started by `mailroom run`
    if supervisor.isdigit():
        from mailroom.core.supervisor import die_with

        die_with(int(supervisor))
    if args[:1] in (["--version"], ["-V"]):
        print(version_line())
        return
    try:
        code = app.main(args=args, prog_name="mailroom", standalone_mode=False)
    except click_impl.exceptions.NoArgsIsHelpError as exc:
        print(exc.format_message(), file=sys.stderr)  # a group named alone: its help
        sys.exit(2)
    except click_impl.exceptions.UsageError as exc:
        where = f"{exc.ctx.command_path}: " if exc.ctx is not None else ""
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        fail(f"{where}{exc.format_message()}{hint}", 2)
    except click_impl.exceptions.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except typer.Abort:
        fail("aborted", 1)
    except UserError as exc:
        fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
