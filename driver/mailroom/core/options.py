"""The one grammar of mailroom's command line: every area builds its typer apps and options here.

- `-h` and `--help` everywhere; plain help (no boxes); usage errors are one line and exit 2
  (mailroom.cli.main prints them).
- A duration is an option of metavar DURATION parsed by mailroom.core.durations.Duration
  ('500ms', '5s', '10m', '7d').
- Every option of a long-running command (collect, send, inbox serve, expire, maintain, run) has
  an environment variable, shown in --help: MAILROOM_<COMMAND>_<OPTION>, except the shared ones
  (MAILROOM_DATABASE_URL, MAILROOM_LISTEN_URL, MAILROOM_DATA_DIR) and the collector's historic
  names (MAILROOM_BATCH_LIMIT, …). Children of `mailroom run` inherit them.
- Arguments are UPPERCASE words (ID, ADDRESS, PATTERN); an optional one is shown as [ID].
"""

from __future__ import annotations

from typing import Any

import typer

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


def new_app(name: str | None = None, help: str | None = None) -> typer.Typer:  # noqa: A002 - typer's word
    """A typer app (a group of commands, or the holder of single commands) in the house style."""
    return typer.Typer(
        name=name,
        help=help,
        no_args_is_help=name is not None,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings=CONTEXT_SETTINGS,
    )


def env_option(*flags: str, env: str, help: str, **kwargs: Any) -> Any:  # noqa: A002
    """An option read from a flag or its environment variable, both shown in --help."""
    return typer.Option(*flags, envvar=env, show_envvar=True, help=help, **kwargs)


def duration_option(*flags: str, help: str, env: str | None = None, never: bool = False, positive: bool = False,  # noqa: A002
                    minimum: float | None = None, maximum: float | None = None, bare_ms: bool = False) -> Any:
    """An option that takes a duration (the value is seconds, a float; None for 'never' when allowed);
    bare_ms: a number without a unit is milliseconds (the collector's variables, as the C collector read them)."""
    from mailroom.core.durations import Duration

    extra: dict[str, Any] = {"envvar": env, "show_envvar": True} if env else {}
    return typer.Option(*flags, parser=Duration(never=never, positive=positive, minimum=minimum, maximum=maximum,
                                                          bare_ms=bare_ms),
                        metavar="DURATION", help=help, **extra)


def port_option(*flags: str, env: str | None, help: str) -> Any:  # noqa: A002
    """A TCP port (0: any free port)."""
    extra: dict[str, Any] = {"envvar": env, "show_envvar": True} if env else {}
    return typer.Option(*flags, min=0, max=65535, metavar="PORT", help=help, **extra)


def _plain_argument_names() -> None:
    """Arguments as Unix usage lines write them: `ADDRESS`, `[ID]...`, not typer's `{ADDRESS}`, and no
    `<int>` type after a named argument in the help (typer internals: guarded; the help test checks)."""
    from typer import core

    argument = getattr(core, "TyperArgument", None)
    if argument is None:  # pragma: no cover - another typer
        return
    if hasattr(argument, "_usage_display_name"):
        def usage_name(self: Any) -> str:
            name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
            return name + ("..." if self.nargs != 1 else "")

        argument._usage_display_name = usage_name
    if hasattr(argument, "display_type_rich"):
        typed = argument.display_type_rich

        def display_type(self: Any, *args: Any, **kwargs: Any) -> str:
            return "" if self.metavar else typed(self, *args, **kwargs)

        argument.display_type_rich = display_type


_plain_argument_names()
