"""Where the database is: --database-url, MAILROOM_DATABASE_URL, or the embedded cluster; where to LISTEN."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from mailroom.core.errors import ConfigError, UserError

DatabaseUrlOption = Annotated[
    Optional[str],
    typer.Option(
        "--database-url",
        envvar="MAILROOM_DATABASE_URL",
        help="libpq conninfo or URL of an existing server (default: the embedded cluster).",
        show_envvar=True,
    ),
]

ListenUrlOption = Annotated[
    Optional[str],
    typer.Option(
        "--listen-url",
        envvar="MAILROOM_LISTEN_URL",
        help="Direct (not transaction-pooled) conninfo for LISTEN; default: the database URL; 'none': poll only.",
        show_envvar=True,
    ),
]

DataDirOption = Annotated[
    Optional[Path],
    typer.Option(
        "--data-dir",
        envvar="MAILROOM_DATA_DIR",
        help="Directory of the embedded cluster (default: ./.mailroom).",
        show_envvar=True,
    ),
]


def default_home(data_dir: Path | None = None) -> Path:
    """The embedded cluster's home directory (holds pgdata/, the socket and the log)."""
    if data_dir is None:
        env = os.environ.get("MAILROOM_DATA_DIR")
        data_dir = Path(env) if env else Path.cwd() / ".mailroom"
    return data_dir.expanduser().resolve()


def resolve_database_url(database_url: str | None, data_dir: Path | None = None) -> str:
    """The conninfo every command uses: the flag/env value, else the running embedded cluster."""
    if database_url is not None:
        if not database_url.strip():
            raise ConfigError("MAILROOM_DATABASE_URL is empty")
        return database_url
    from mailroom.db.cluster import Cluster

    cluster = Cluster(default_home(data_dir))
    if not cluster.is_running():
        raise UserError(
            f"no database: the embedded cluster in {cluster.home} is not running; "
            "run `mailroom db up` or set MAILROOM_DATABASE_URL"
        )
    return cluster.url()


def resolve_listen_url(listen_url: str | None, database_url: str) -> str | None:
    """The conninfo a worker LISTENs on: the flag/env value, 'none' for none, else the database URL.

    Through a transaction pooler the listener's self-test fails and the worker polls, so the
    default is safe; a separate direct URL gives NOTIFY wake-ups behind a pooler."""
    if listen_url is None:
        return database_url
    if listen_url.strip().lower() in ("none", "off", ""):
        return None
    return listen_url


def hex_key(name: str, value: str | None, *, required: bool = True) -> bytes | None:
    """Decode a 64-hex-character key from a flag or environment variable (exit 2 when bad)."""
    if value is None or value == "":
        if required:
            raise ConfigError(f"{name} is not set (64 hex characters, 32 bytes)")
        return None
    value = value.strip()
    if len(value) != 64:
        raise ConfigError(f"{name} must be 64 hex characters (32 bytes), got {len(value)} characters")
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise ConfigError(f"{name} must be hexadecimal (0-9, a-f)") from None
