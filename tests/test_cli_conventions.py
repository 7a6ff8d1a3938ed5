"""One grammar for the whole command line (issue 23, item 4), checked on every command there is.

The test walks the command tree of `mailroom` (every group and command, loaded as `mailroom --help`
loads them) and checks, for each: `-h` works like `--help`; arguments are UPPERCASE words in the
usage line (never typer's `{address}` or `[[ID]]`); every option that takes a time is a DURATION;
every option of a long-running command has its environment variable, shown in --help. Then it feeds
bad values (a duration without a unit, a number out of range, an unknown option, an empty or
malformed MAILROOM_DATABASE_URL) and expects one `mailroom: error:` line and exit 2 each time.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from mailroom import cli

LONG_RUNNING = {"collect", "send", "inbox serve", "expire", "maintain", "run"}
TIME_WORDS = re.compile(r"(interval|timeout|after|every|grace|lease|ttl|older-than|sent-before|pace|^--for$)")
SHARED_ENV = {"MAILROOM_DATABASE_URL", "MAILROOM_LISTEN_URL", "MAILROOM_DATA_DIR", "MAILROOM_SECRET_KEY",
              "MAILROOM_SMTP_CA_FILE"}


def _walk() -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []

    def visit(path: str, command: object) -> None:
        found.append((path, command))
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            visit(f"{path} {name}".strip(), sub)

    for name in cli.COMMANDS:
        visit(name, cli.load_command(name))
    return found


COMMANDS = _walk()
LEAVES = [(path, command) for path, command in COMMANDS if not getattr(command, "commands", None)]


def run_main(*args: str, capsys: pytest.CaptureFixture, env: dict[str, str] | None = None,
             monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[int, str, str]:
    """`mailroom ARGS` in this process (fast: no database is reached before the options are parsed)."""
    if monkeypatch is not None:
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(list(args))
    out, err = capsys.readouterr()
    code = exit_info.value.code
    return (code if isinstance(code, int) else 0), out, err


def test_the_walk_finds_every_command():
    paths = {p for p, _ in COMMANDS}
    assert {"outbound hold", "outbound run-now", "outbound queue", "settings set", "status", "plans",
            "inbox serve", "outbound limits set", "run"} <= paths
    assert len(LEAVES) > 40


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[p for p, _ in COMMANDS])
def test_help_conventions(path, command, capsys):
    code, out, err = run_main(*path.split(), "-h", capsys=capsys)
    assert code == 0 and err == "", err
    code_long, out_long, _ = run_main(*path.split(), "--help", capsys=capsys)
    assert code_long == 0 and out_long == out, "-h and --help differ"
    usage = out.splitlines()[0]
    assert usage.startswith(f"Usage: mailroom {path}"), usage
    assert "{" not in usage and "[[" not in usage, f"argument names in the usage line: {usage}"
    for param in command.params:
        if param.param_type_name == "argument":
            assert re.fullmatch(r"[A-Z][A-Z_]*", param.metavar or ""), f"{path}: argument {param.name} is {param.metavar!r}"
            continue
        flags = [o for o in param.opts if o.startswith("--")]
        if not flags or flags[0] == "--help":
            continue
        if TIME_WORDS.search(flags[0]) and not param.is_flag:
            assert param.metavar == "DURATION", f"{path} {flags[0]} takes a time but is not a DURATION"
        if path in LONG_RUNNING:
            envvar = param.envvar
            assert envvar and param.show_envvar, f"{path} {flags[0]} has no environment variable"
            assert envvar.startswith("MAILROOM_"), envvar
            assert f"[env var: {envvar}" in " ".join(out.split()), f"{path}: {envvar} is not shown in --help"
            words = path.replace("inbox serve", "inbox").upper().split()
            if envvar not in SHARED_ENV and path != "collect":  # the collector keeps the C collector's names
                assert envvar.startswith(f"MAILROOM_{words[0]}_"), f"{path} {flags[0]}: {envvar}"


DURATIONS = [(path, [o for o in p.opts if o.startswith("--")][0])
             for path, command in LEAVES if path in LONG_RUNNING
             for p in command.params if getattr(p, "metavar", None) == "DURATION"]


@pytest.mark.parametrize(("path", "flag"), DURATIONS, ids=[f"{p} {f}" for p, f in DURATIONS])
def test_a_duration_without_a_unit_is_one_line_exit_2(path, flag, capsys):
    if path == "collect" and flag in ("--batch-timeout", "--healthcheck-interval", "--poll-interval"):
        pytest.skip("the C collector's variables: a number without a unit is milliseconds (test_bare_collector_ms)")
    code, out, err = run_main(*path.split(), flag, "5", capsys=capsys)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith(f"mailroom: error: mailroom {path}: Invalid value for '{flag}'"), err
    assert "'5' is not a duration like 500ms, 5s, 10m, 2h or 7d" in err


def test_bare_collector_ms(capsys):
    """The collector's durations keep the C collector's unit for a bare number: milliseconds."""
    from mailroom.core.durations import Duration

    assert Duration(bare_ms=True)("5000") == 5.0 and Duration(bare_ms=True)("250ms") == 0.25
    code, out, err = run_main("collect", "--poll-interval", "5", capsys=capsys)  # 5 ms: under its 10 ms minimum
    assert code == 2 and "'5' is shorter than 10ms" in err, err


@pytest.mark.parametrize("args", [
    ("send", "--concurrency", "0"),
    ("inbox", "serve", "--port", "70000"),
    ("collect", "--batch-limit", "ten"),
    ("outbound", "list", "--limit", "0"),
    ("outbound", "retry", "--bogus"),
    ("outbound", "show"),
    ("nonsense",),
    ("outbound", "purge", "--sent-before", "a week"),
], ids=" ".join)
def test_usage_errors_are_one_line_exit_2(args, capsys):
    code, out, err = run_main(*args, capsys=capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("mailroom: error: "), err
    assert "╭" not in err and "Usage:" not in err  # never click's boxed panel


def test_environment_values_are_checked_like_flags(capsys, monkeypatch):
    code, _, err = run_main("send", capsys=capsys, monkeypatch=monkeypatch, env={"MAILROOM_SEND_POLL_INTERVAL": "1000"})
    assert code == 2 and "(env var: 'MAILROOM_SEND_POLL_INTERVAL'): '1000' is not a duration" in err, err


@pytest.mark.parametrize(("value", "message"), [
    ("", "MAILROOM_DATABASE_URL is set but empty: give a conninfo, or unset it to use the embedded cluster"),
    ("host=db password=hunter2 x", "MAILROOM_DATABASE_URL is not a conninfo or a postgresql:// URL"),
    ("postgresql://u:hunter2@db:notaport/mail", "MAILROOM_DATABASE_URL has a port that is not a number"),
])
def test_empty_or_malformed_configuration_is_exit_2(value, message):
    proc = subprocess.run([sys.executable, "-m", "mailroom", "outbound", "status"], capture_output=True, text=True,
                          env={"MAILROOM_DATABASE_URL": value, "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"mailroom: error: {message}") and proc.stderr.count("\n") == 1, proc.stderr
    assert "hunter2" not in proc.stderr  # a password is never echoed


def test_version_and_short_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["-h"])
    assert capsys.readouterr().out.startswith("Usage: mailroom ")
    cli.main(["--version"])
    assert re.fullmatch(r"mailroom \d+\.\d+\S* \(schema \d+\)\n", capsys.readouterr().out)
