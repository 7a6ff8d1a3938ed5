"""`mailroom collect` parses its options without pydantic (mailroom.cli.fast_options), with typer's results.

The plain-value path must give, for every option of the command and of the root group, the value
typer's own coercion gives, and leave every other value (and so every error message) to typer.
Each case runs both paths on the same click parameter, in process: no database, no subprocess.
"""

from __future__ import annotations

import typer
import typer._coercion as typer_coercion  # the typer internals fast_options relies on: failing here, not skipping

from mailroom import cli
from mailroom.core import fastpaths

click = cli.click_impl


def _command():
    command = cli.load_command("collect")
    assert "collect" in cli.FAST_OPTIONS
    if not fastpaths.enabled():  # MAILROOM_FAST_PATHS=off: load_command left typer's own; the fast path itself is tested
        cli.fast_options(command)
    return command


def test_the_fast_path_is_taken_exactly_when_switched_on():
    """A typer whose internals fast_options does not fit would leave every option to typer's pydantic
    path without a failing comparison (the comparisons need FastParam): this test fails instead."""
    assert cli._fast_param_factory() is not None, f"typer {typer.__version__}: fast_options does not fit its internals"
    command = cli.load_command("collect")
    kinds = {type(p.get_runtime_param()).__name__ for p in command.params if hasattr(p, "type_descriptor")}
    assert ("FastParam" in kinds) is fastpaths.enabled(), kinds


VALUES = [
    None, "", "0", "1", "7", "007", "+5", "-1", " 12", "12 ", "1_000", "100000", "100001", "99999999999999999999",
    "1.5", "abc", "5s", "50ms", "5", "0s", "-5s", "never", "10m", "86401s", "270s", "csv", "token_insert",
    "127.0.0.1", "65535", "65536", "true", "false", "1e3", "\u0661", True, False, 3, 0,
]


def _outcome(runtime, param, ctx, value):
    try:
        return ("value", runtime.coerce(value, param=param, ctx=ctx))
    except click.exceptions.BadParameter as exc:
        return ("error", exc.format_message())


def test_every_option_coerces_as_typer_does():
    command = _command()
    ctx = click.Context(command, info_name="collect")
    params = [*command.params, command.get_help_option(ctx)]
    fast_seen = 0
    for param in params:
        if not hasattr(param, "type_descriptor") or param.type_descriptor.file_annotation is not None:
            continue
        fast = param.get_runtime_param()
        assert type(fast).__name__ == "FastParam", param.name  # fast_options really took this option
        slow = typer_coercion.build_runtime_param(param.type_descriptor)
        for value in VALUES:
            plain, _ = fast._plain(value)
            fast_seen += plain
            assert _outcome(fast, param, ctx, value) == _outcome(slow, param, ctx, value), (param.name, value)
    assert fast_seen > 20  # the plain path is taken, not only the fallback


def test_started_collector_values_take_the_plain_path():
    """The values a collector starts with (defaults and the bench's settings) never need pydantic."""
    command = _command()
    ctx = click.Context(command, info_name="collect")
    by_name = {p.name: p for p in command.params}
    for name, value in [("batch_limit", "1000"), ("batch_limit", 10), ("batch_timeout", "50ms"),
                        ("batch_timeout", "5s"), ("healthcheck_interval", "60000ms"), ("poll_interval", "1s"),
                        ("channel", "token_insert"), ("output", "csv"), ("enqueue", False),
                        ("metrics_host", "127.0.0.1"), ("metrics_port", "9187"), ("database_url", "postgresql:///x")]:
        assert by_name[name].get_runtime_param()._plain(value)[0], (name, value)
    assert command.get_help_option(ctx).get_runtime_param()._plain(False)[0]
