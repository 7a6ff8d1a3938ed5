"""`mailroom collect`: the typer command of the token collector (mailroom.accounts.collector).

Every option comes from its flag or its environment variable (the collector keeps the original C
collector's names: MAILROOM_BATCH_LIMIT, MAILROOM_BATCH_TIMEOUT, …); a bad value is one line on
stderr and exit code 2.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from mailroom.core.options import duration_option, env_option, new_app, port_option
from mailroom.db.config import (
    DatabaseUrlOption,
    DataDirOption,
    ListenUrlOption,
    hex_key,
    resolve_database_url,
    resolve_listen_url,
)

app = new_app()


@app.command("collect")
def collect(
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
    listen_url: ListenUrlOption = None,
    secret_key: Annotated[Optional[str], env_option(
        "--secret-key", env="MAILROOM_SECRET_KEY", metavar="HEX",
        help="Token signing key, 64 hex characters (prefer the environment variable).")] = None,
    batch_limit: Annotated[int, env_option(
        "--batch-limit", env="MAILROOM_BATCH_LIMIT", min=1, max=100_000, metavar="N",
        help="Most tokens per batch.")] = 10,
    batch_timeout: Annotated[float, duration_option(
        "--batch-timeout", env="MAILROOM_BATCH_TIMEOUT", maximum=86400,
        help="How long to wait after the first notification before taking a batch that is not full.")] = "5s",
    healthcheck_interval: Annotated[float, duration_option(
        "--healthcheck-interval", env="MAILROOM_HEALTHCHECK_INTERVAL", minimum=0.001, maximum=86400,
        help="Between health checks and sweeps when idle (at least the batch timeout).")] = "270s",
    poll_interval: Annotated[float, duration_option(
        "--poll-interval", env="MAILROOM_POLL_INTERVAL", minimum=0.01, maximum=3600,
        help="Between polls while no LISTEN connection hears.")] = "1s",
    channel: Annotated[str, env_option(
        "--channel", env="MAILROOM_CHANNEL_NAME", metavar="NAME", help="NOTIFY channel to LISTEN on.")] = "token_insert",
    output: Annotated[str, env_option(
        "--output", "-o", env="MAILROOM_COLLECT_OUTPUT", metavar="FORMAT",
        help="stdout format: csv (one line per batch) or jsonl.")] = "csv",
    enqueue: Annotated[bool, env_option(
        "--enqueue", env="MAILROOM_COLLECT_ENQUEUE",
        help="Render emails in SQL and enqueue them for `mailroom send` instead of stdout.")] = False,
    metrics_port: Annotated[Optional[int], port_option(
        "--metrics-port", env="MAILROOM_COLLECT_METRICS_PORT",
        help="Serve Prometheus metrics on this port (0: any free port).")] = None,
    metrics_host: Annotated[str, env_option(
        "--metrics-host", env="MAILROOM_COLLECT_METRICS_HOST", metavar="HOST", help="Metrics bind address.")] = "127.0.0.1",
) -> None:
    """Collect activation / recovery tokens as they are inserted and hand them off in batches."""
    from mailroom.accounts.collector import Collector, parse_config

    key = hex_key("MAILROOM_SECRET_KEY", secret_key)
    assert key is not None
    cfg = parse_config(key, batch_limit, batch_timeout, healthcheck_interval, channel, output, enqueue, poll_interval)
    home = Path(data_dir) if data_dir else None
    url = resolve_database_url(database_url, home)
    cfg = replace(cfg, url=url, listen_url=resolve_listen_url(listen_url, url), metrics_port=metrics_port,
                  metrics_host=metrics_host)
    raise typer.Exit(Collector(cfg).run())
