"""`mailroom mcp`: mailroom's own MCP server, on stdio (one agent) or streamable HTTP (remote agents).

The MCP SDK, uvicorn and the server (mailroom.mcp.server) are imported by this command only.
"""

from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from mailroom.core.errors import ConfigError
from mailroom.core.options import duration_option, new_app
from mailroom.db.config import DatabaseUrlOption, ListenUrlOption, resolve_database_url, resolve_listen_url

app = new_app()

API_KEY_ENV = "MAILROOM_MCP_API_KEY"  # stdio's API key (HTTP requests carry their own)


@app.command("mcp")
def mcp_cmd(
    database_url: DatabaseUrlOption = None,
    listen_url: ListenUrlOption = None,
    http_port: Annotated[Optional[int], typer.Option(
        envvar="MAILROOM_MCP_HTTP_PORT",
        help="Serve streamable HTTP on this port (0: any free port, logged) at /mcp, each request with "
             "`Authorization: Bearer mrk_…`; without it: stdio, with the key of MAILROOM_MCP_API_KEY.")] = None,
    http_host: Annotated[str, typer.Option(envvar="MAILROOM_MCP_HTTP_HOST", help="Address --http-port listens on.")]
    = "127.0.0.1",
    pool_size: Annotated[int, typer.Option(envvar="MAILROOM_MCP_POOL_SIZE",
                                           help="Database connections (waits hold none while they wait).")] = 4,
    poll_interval: Annotated[float, duration_option(
        "--poll-interval", positive=True, maximum=3600, env="MAILROOM_MCP_POLL_INTERVAL",
        help="Between looks of a waiting wait_for_message while LISTEN is down.")] = "2s",
    statement_timeout: Annotated[float, duration_option(
        "--statement-timeout", positive=True, maximum=600, env="MAILROOM_MCP_STATEMENT_TIMEOUT",
        help="SET LOCAL statement_timeout of every call.")] = "5s",
) -> None:
    """Serve mailroom's inboxes to AI agents over MCP: create an inbox, wait for its mail, read it, extract
    the link or code, delete it (docs/mcp.md)."""
    if pool_size < 1:
        raise ConfigError(f"--pool-size must be at least 1, got {pool_size}")
    if http_port is not None and not 0 <= http_port <= 65535:
        raise ConfigError(f"--http-port must be between 0 and 65535, got {http_port}")
    api_key = os.environ.get(API_KEY_ENV, "").strip()
    if http_port is None and not api_key:
        raise ConfigError(f"{API_KEY_ENV} is not set: stdio needs an API key (`mailroom apikey create OWNER`), "
                          "or serve HTTP with --http-port")
    from mailroom.mcp.server import McpConfig, run_http, run_stdio

    url = resolve_database_url(database_url)
    config = McpConfig(database_url=url, listen_url=resolve_listen_url(listen_url, url), pool_size=pool_size,
                       poll_interval=poll_interval, statement_timeout=statement_timeout)
    if http_port is None:
        run_stdio(config, api_key, API_KEY_ENV)
    else:
        run_http(config, host=http_host, port=http_port)
