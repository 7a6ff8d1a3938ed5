"""Where the database is: --database-url, MAILROOM_DATABASE_URL, or the embedded cluster; where to LISTEN."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Optional

import psycopg
import typer
from psycopg.conninfo import conninfo_to_dict

from mailroom.core.errors import ConfigError, UserError

DatabaseUrlOption = Annotated[
    Optional[str],
    typer.Option(
        "--database-url",
        metavar="URL",
        envvar="MAILROOM_DATABASE_URL",
        help="libpq conninfo or URL of an existing server (default: the embedded cluster).",
        show_envvar=True,
    ),
]

ListenUrlOption = Annotated[
    Optional[str],
    typer.Option(
        "--listen-url",
        metavar="URL",
        envvar="MAILROOM_LISTEN_URL",
        help="Direct (not transaction-pooled) conninfo for LISTEN; default: the database URL; 'none': poll only.",
        show_envvar=True,
    ),
]

DataDirOption = Annotated[
    Optional[Path],
    typer.Option(
        "--data-dir",
        metavar="DIR",
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


_PORT_OK = re.compile(r"^\d{1,5}(,\d{1,5})*$")
_QUOTED = re.compile(r'"[^"]*"')


def check_conninfo(name: str, url: str) -> str:
    """`url` when libpq can read it as a conninfo or a postgresql:// URL, else ConfigError (exit 2).

    The message never repeats the value (it may hold a password)."""
    if not url.strip():
        raise ConfigError(f"{name} is empty: give a conninfo or a postgresql:// URL")
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        reason = _QUOTED.sub("…", str(exc).strip().splitlines()[0])
        raise ConfigError(f"{name} is not a conninfo or a postgresql:// URL ({reason})") from None
    port = params.get("port")
    if port is not None and not _PORT_OK.match(str(port)):
        raise ConfigError(f"{name} has a port that is not a number")
    return url


def resolve_database_url(database_url: str | None, data_dir: Path | None = None) -> str:
    """The conninfo every command uses: the flag/env value, else the running embedded cluster.

    An empty MAILROOM_DATABASE_URL is an error, not a silent fall-back to the embedded cluster."""
    if database_url is None and os.environ.get("MAILROOM_DATABASE_URL") == "":
        raise ConfigError("MAILROOM_DATABASE_URL is set but empty: give a conninfo, or unset it to use the "
                          "embedded cluster")
    if database_url is not None:
        return check_conninfo("--database-url" if "MAILROOM_DATABASE_URL" not in os.environ
                              else "MAILROOM_DATABASE_URL", database_url)
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
    return check_conninfo("MAILROOM_LISTEN_URL", listen_url)


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
