"""`mailroom collect`: the token collector (LISTEN, batch, dequeue, hand off to stdout or the outbox).

The collector decides only *when* to call `mailroom.dequeue_tokens`; what is eligible, how a
token is signed and how an email is rendered all live in SQL. Configuration comes from flags or
the article's environment variables; a bad value is one line on stderr and exit code 2.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from mailroom.config import DatabaseUrlOption, DataDirOption, hex_key, resolve_database_url
from mailroom.errors import ConfigError

OUTPUTS = ("csv", "jsonl")
MAX_BATCH_LIMIT = 100_000
MAX_MS = 24 * 3600 * 1000
MAX_CHANNEL_BYTES = 63  # NAMEDATALEN - 1


@dataclass(frozen=True)
class CollectorConfig:
    """Validated settings of one collector process."""

    url: str
    key: bytes
    batch_limit: int = 10
    batch_timeout_ms: int = 5000
    healthcheck_ms: int = 270_000
    channel: str = "token_insert"
    output: str = "csv"
    enqueue: bool = False


def _int_setting(name: str, value: str, low: int, high: int) -> int:
    text = value.strip()
    if not text.isdigit() or not text.isascii():
        raise ConfigError(f"{name} must be a whole number between {low} and {high}, got {value!r}")
    number = int(text)
    if not low <= number <= high:
        raise ConfigError(f"{name} must be between {low} and {high}, got {number}")
    return number


def parse_config(
    url: str,
    secret_key: str | None,
    batch_limit: str,
    batch_timeout: str,
    healthcheck_interval: str,
    channel: str,
    output: str,
    enqueue: bool,
) -> CollectorConfig:
    """Validate every flag / environment value; raise ConfigError (exit 2) on the first bad one."""
    key = hex_key("MAILROOM_SECRET_KEY", secret_key)
    assert key is not None
    limit = _int_setting("MAILROOM_BATCH_LIMIT", batch_limit, 1, MAX_BATCH_LIMIT)
    timeout_ms = _int_setting("MAILROOM_BATCH_TIMEOUT", batch_timeout, 0, MAX_MS)
    health_ms = _int_setting("MAILROOM_HEALTHCHECK_INTERVAL", healthcheck_interval, 1, MAX_MS)
    if health_ms < timeout_ms:
        raise ConfigError(
            f"MAILROOM_HEALTHCHECK_INTERVAL ({health_ms} ms) must be at least "
            f"MAILROOM_BATCH_TIMEOUT ({timeout_ms} ms)"
        )
    channel = channel.strip()
    if not channel:
        raise ConfigError("MAILROOM_CHANNEL_NAME is empty")
    if len(channel.encode()) > MAX_CHANNEL_BYTES or not channel.isprintable():
        raise ConfigError(
            f"MAILROOM_CHANNEL_NAME must be printable and at most {MAX_CHANNEL_BYTES} bytes"
        )
    output = output.strip().lower()
    if output not in OUTPUTS:
        raise ConfigError(f"--output must be one of {', '.join(OUTPUTS)}, got {output!r}")
    return CollectorConfig(url, key, limit, timeout_ms, health_ms, channel, output, enqueue)


def _opt(flag: str, env: str, help_text: str):  # noqa: ANN202 - typer metadata
    return typer.Option(flag, envvar=env, show_envvar=True, help=help_text)


def collect(
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
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
            "Milliseconds between SELECT 1 checks when idle (>= the batch timeout).",
        ),
    ] = "270000",
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
    from mailroom.collector_loop import Collector

    cfg = parse_config(
        "", secret_key, batch_limit, batch_timeout, healthcheck_interval, channel, output, enqueue
    )
    url = resolve_database_url(database_url, Path(data_dir) if data_dir else None)
    raise typer.Exit(Collector(replace(cfg, url=url)).run())


def register(app: typer.Typer) -> None:
    """Add `mailroom collect` to the root CLI."""
    app.command("collect")(collect)
