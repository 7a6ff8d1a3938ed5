"""The `mailroom` command: a root group that loads each area's typer commands only when used.

`mailroom collect` imports the accounts area and nothing of the others (`mailroom --help`
imports them all to render their help). Every failure ends here as one line on stderr,
`mailroom: error: …`, and an exit code: 2 for usage and configuration (a typo, a bad value, a
missing argument: click's own errors too, never its boxed panel), 1 for a runtime failure.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import re
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from mailroom.core import fastpaths
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
    "webhook": ("mailroom.outbound.cli", "webhook_app", None),
    "run": ("mailroom.ops.cli", "app", "run"),
    "demo": ("mailroom.ops.cli", "app", "demo"),
    "doctor": ("mailroom.ops.cli", "app", "doctor"),
    "maintain": ("mailroom.ops.cli", "app", "maintain"),
    "http": ("mailroom.http.cli", "http_app", None),
    "apikey": ("mailroom.http.cli", "apikey_app", None),
    "smtpcred": ("mailroom.http.cli", "smtpcred_app", None),
    "catchall": ("mailroom.http.cli", "catchall_app", None),
    "mcp": ("mailroom.mcp.cli", "app", "mcp"),
}


# Commands whose options are coerced without pydantic when the value is plainly valid (below); a
# group's sub-command as "group sub" (`inbox serve`: pydantic is ~9 MiB of a server's resident memory)
FAST_OPTIONS = frozenset({"collect", "send", "expire", "maintain", "inbox serve"})


def load_command(name: str) -> Any:
    """Import one area's typer app and return the click command for `name`."""
    import typer.main

    module, attribute, command = COMMANDS[name]
    typer_app = getattr(importlib.import_module(module), attribute)
    if command is None:
        group = typer.main.get_group(typer_app)
        group.name = name
        if fastpaths.enabled():  # MAILROOM_FAST_PATHS=off: typer's own coercion
            subs = [sub for key, sub in group.commands.items() if f"{name} {key}" in FAST_OPTIONS]
            for sub in subs:
                fast_options(sub)
            if subs:
                fast_options(group)  # the group's own -h, before it picks the sub-command
        return group
    click_command = typer.main.get_group(typer_app).commands[command]
    if name in FAST_OPTIONS and fastpaths.enabled():  # MAILROOM_FAST_PATHS=off: typer's own coercion
        fast_options(click_command)
    return click_command


def fast_options(command: Any) -> None:
    """Coerce the plainly valid values of `command`'s options without building pydantic adapters.

    typer 0.29 coerces every option value through a pydantic TypeAdapter, so a started command
    imports pydantic and builds one adapter an option (-h included): about a third of `mailroom
    collect`'s start above the `import psycopg, typer` floor (docs/accounts.md). Here a value typer
    would accept unchanged (a str for a str option, a bool for a flag, a decimal int within the
    option's min/max, a value the option's own parser accepts) is returned as typer returns it;
    anything else (a bad value, a bool from the environment, another type) goes to typer's own
    coercion, so every error message and edge case stays typer's. typer internals, guarded: pyproject.toml
    pins the tested minor, another typer keeps its own path with a warning, tests/accounts/test_collect_options.py
    fails then and tests/ops/test_startup.py checks that pydantic stays out. MAILROOM_FAST_PATHS=off: not used."""
    fast = _fast_param_factory()
    if fast is None:  # pragma: no cover - another typer (pyproject.toml pins the tested minor)
        print("mailroom: warning: this typer's coercion internals changed: its own path (pydantic) coerces"
              " the options", file=sys.stderr)
        return
    for param in command.params:
        fast(param)
    get_help_option = getattr(command, "get_help_option", None)
    if get_help_option is not None:
        def help_option(ctx: Any) -> Any:
            option = get_help_option(ctx)
            if option is not None:
                fast(option)
            return option

        command.get_help_option = help_option


_PLAIN_INT = re.compile(r"(?:0|[1-9][0-9]{0,17})")


@functools.cache
def _fast_param_factory() -> Any:
    """The function that gives one typer parameter the plain-value path of fast_options (None: another typer)."""
    try:
        from typer._coercion import RuntimeParam, build_runtime_param
        from typer.core import _TyperParameter
    except ImportError:  # pragma: no cover - another typer
        return None
    if not dataclasses.is_dataclass(RuntimeParam):  # pragma: no cover - another typer
        return None

    @dataclasses.dataclass(frozen=True)
    class FastParam(RuntimeParam):
        descriptor: Any = None
        slow: list = dataclasses.field(default_factory=list)  # typer's own, built on first need

        def _plain(self, value: Any) -> tuple[bool, Any]:
            info, annotation = self.parameter_info, self.annotation
            if info.parser is not None:
                try:
                    return True, info.parser(value)
                except Exception:  # noqa: BLE001 - typer's path reports it
                    return False, None
            if annotation is str or annotation is bool:
                return type(value) is annotation, value
            if annotation is int and not getattr(info, "clamp", False):
                if isinstance(value, str) and _PLAIN_INT.fullmatch(value):
                    number = int(value)
                elif type(value) is int:
                    number = value
                else:
                    return False, None
                low, high = info.min, info.max
                return (low is None or number >= low) and (high is None or number <= high), number
            return False, None

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            plain, result = self._plain(value)
            if plain:
                return result
            if not self.slow:
                self.slow.append(build_runtime_param(self.descriptor))
            return self.slow[0]._coerce_value(value, param=param, ctx=ctx)

    def fast(param: Any) -> None:
        descriptor = getattr(param, "type_descriptor", None)
        if (isinstance(param, _TyperParameter) and getattr(param, "_runtime_param", "") is None
                and descriptor is not None and descriptor.file_annotation is None):
            param._runtime_param = FastParam(parameter_info=descriptor.parameter_info,
                                             annotation=descriptor.annotation, descriptor=descriptor)

    return fast


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


def open_files_up_to_hard_limit() -> None:
    """The soft limit of open files up to the hard one, as Go's runtime does for every program: a server
    holds a socket per client (5,000 event streams, 1,000 SMTP sessions: docs/reliability.md, "Load held"),
    and the soft limit a service is often started with (1,024: systemd's default) would refuse the rest
    with EMFILE. The hard limit stays the operator's (LimitNOFILE=, ulimit -Hn)."""
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = max(soft, 1 << 20) if soft != resource.RLIM_INFINITY else soft
        if soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    except (ValueError, OSError):
        pass  # a platform that refuses: the limit stays as it was


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app; UserError and click's usage errors become one line and an exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    open_files_up_to_hard_limit()
    supervisor = os.environ.pop("MAILROOM_SUPERVISOR_PID", "")  # started by `mailroom run`
    if supervisor.isdigit():
        from mailroom.core.supervisor import supervised

        supervised(int(supervisor))  # dies with it; SIGQUIT writes the stacks (a stuck child, before SIGKILL)
    if args[:1] in (["--version"], ["-V"]):
        print(version_line())
        return
    if args[:1] and (args[0] in FAST_OPTIONS or " ".join(args[:2]) in FAST_OPTIONS):
        fast_options(app)  # the root group's own -h, before it parses
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
