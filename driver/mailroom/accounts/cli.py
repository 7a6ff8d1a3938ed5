"""`mailroom collect`: the typer command of the token collector (mailroom.accounts.collector).

Configuration comes from flags or environment variables; a bad value is one line on stderr and
exit code 2.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from mailroom.db.config import (
    DatabaseUrlOption,
    DataDirOption,
    ListenUrlOption,
    hex_key,
    resolve_database_url,
    resolve_listen_url,
)

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def _opt(flag: str, env: str, help_text: str):  # noqa: ANN202 - typer metadata
    return typer.Option(flag, envvar=env, show_envvar=True, help=help_text)


@app.command("collect")
def collect(
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
    listen_url: ListenUrlOption = None,
    secret_key: Annotated[
        Optional[str],
        _opt("--secret-key", "MAILROOM_SECRET_KEY", "Token signing key, 64 hex characters (prefer the env var)."),
    ] = None,
    batch_limit: Annotated[
        str, _opt("--batch-limit", "MAILROOM_BATCH_LIMIT", "Most tokens per batch (1-100000).")
    ] = "10",
    batch_timeout: Annotated[
        str,
        _opt("--batch-timeout", "MAILROOM_BATCH_TIMEOUT", "Milliseconds to wait after the first notification."),
    ] = "5000",
    healthcheck_interval: Annotated[
        str,
        _opt(
            "--healthcheck-interval",
            "MAILROOM_HEALTHCHECK_INTERVAL",
            "Milliseconds between health checks and sweeps when idle (>= the batch timeout).",
        ),
    ] = "270000",
    poll_interval: Annotated[
        int,
        _opt("--poll-interval", "MAILROOM_POLL_INTERVAL", "Milliseconds between polls while no LISTEN connection hears."),
    ] = 1000,
    channel: Annotated[
        str, _opt("--channel", "MAILROOM_CHANNEL_NAME", "NOTIFY channel to LISTEN on.")
    ] = "token_insert",
    output: Annotated[
        str, typer.Option("--output", "-o", help="stdout format: csv (one line per batch) or jsonl.")
    ] = "csv",
    enqueue: Annotated[
        bool,
        typer.Option("--enqueue", help="Render emails in SQL and enqueue them for `mailroom send` instead of stdout."),
    ] = False,
) -> None:
    """Collect activation / recovery tokens as they are inserted and hand them off in batches."""
    from mailroom.accounts.collector import Collector, parse_config
    from mailroom.core.errors import ConfigError

    key = hex_key("MAILROOM_SECRET_KEY", secret_key)
    assert key is not None
    if not 10 <= poll_interval <= 3_600_000:
        raise ConfigError(f"--poll-interval must be between 10 and 3600000 ms, got {poll_interval}")
    cfg = parse_config(key, batch_limit, batch_timeout, healthcheck_interval, channel, output, enqueue, poll_interval)
    home = Path(data_dir) if data_dir else None
    url = resolve_database_url(database_url, home)
    cfg = replace(cfg, url=url, listen_url=resolve_listen_url(listen_url, url))
    raise typer.Exit(Collector(cfg).run())
