"""`mailroom db …`: the typer commands that start, stop, inspect and migrate the database."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Optional

import psycopg
import typer

from mailroom.core.errors import UserError, db_user_error
from mailroom.db import cluster as embedded
from mailroom.db import migrate as runner
from mailroom.db.config import DatabaseUrlOption, DataDirOption, default_home
from mailroom.db.connect import connect

db_app = typer.Typer(help="The database: embedded cluster or MAILROOM_DATABASE_URL.", no_args_is_help=True)

PortOption = Annotated[
    Optional[int],
    typer.Option("--port", envvar="MAILROOM_PG_PORT", help="Port of the embedded server (socket name; TCP with --tcp)."),
]
TcpOption = Annotated[
    Optional[bool],
    typer.Option("--tcp/--no-tcp", help="Also listen on 127.0.0.1 (default: unix socket only)."),
]


def _say(message: str) -> None:
    print(message, file=sys.stderr)


@db_app.command("up")
def up(
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
    port: PortOption = None,
    tcp: TcpOption = None,
) -> None:
    """Create and start the embedded cluster (idempotent), then migrate. With a URL: only migrate."""
    started = time.monotonic()
    if database_url:
        url = database_url
        _say("using MAILROOM_DATABASE_URL; migrating only")
    else:
        home = default_home(data_dir)
        current = embedded.Cluster(home)  # as it was last started (port, TCP)
        was_running = current.is_running()
        if was_running and port is not None and port != current.port:
            raise UserError(f"the cluster in {home} already runs on port {current.port}; `mailroom db down` first")
        if was_running and tcp and not current.tcp:
            raise UserError(f"the cluster in {home} runs without TCP; `mailroom db down`, then `mailroom db up --tcp`")
        cluster = embedded.up(home, port=port, tcp=tcp)
        _say(f"{'reusing running' if was_running else 'started'} cluster in {cluster.home} (port {cluster.port})")
        url = cluster.url()
    result = runner.migrate(url, notices=_say, say=_say)
    _say(f"migrations applied: {len(result.applied)}; sql files applied: {result.sql_files}")
    _say(f"ready in {time.monotonic() - started:.2f}s")
    print(url)


@db_app.command("down")
def down(data_dir: DataDirOption = None) -> None:
    """Stop the embedded cluster (its data stays)."""
    home = default_home(data_dir)
    if embedded.down(home):
        _say(f"stopped cluster in {home}")
    else:
        _say(f"no running cluster in {home}")


@db_app.command("status")
def status(database_url: DatabaseUrlOption = None, data_dir: DataDirOption = None) -> None:
    """Show whether the database is up and which migrations are applied (exit 1 when down)."""
    if database_url:
        url = database_url
        print("database: MAILROOM_DATABASE_URL")
    else:
        cluster = embedded.Cluster(default_home(data_dir))
        print(f"cluster:  {cluster.home}")
        if not cluster.exists():
            print("state:    not created (run `mailroom db up`)")
            raise typer.Exit(1)
        pid = cluster.pid()
        if pid is None or not cluster.is_running():
            print("state:    stopped")
            raise typer.Exit(1)
        print(f"state:    running (pid {pid}, port {cluster.port}{', tcp 127.0.0.1' if cluster.tcp else ''})")
        url = cluster.url()
    _print_schema(url)
    print(f"url:      {url}")


def _print_schema(url: str) -> None:
    """What the database has next to what this driver brings; one line each."""
    from mailroom import __version__
    from mailroom.db.files import schema_version

    expected = schema_version()
    try:
        with connect(url, application_name="mailroom db status") as conn:
            server = conn.execute("SHOW server_version").fetchone()[0]
            print(f"server:   PostgreSQL {server}")
            have = runner.database_schema(conn)
    except psycopg.Error as exc:
        raise db_user_error(exc, "cannot read the schema: ") from None
    print(f"driver:   mailroom {__version__}, schema {expected}")
    if not have.installed:
        print("schema:   not installed (run `mailroom db migrate`)")
        return
    if have.applied is None:
        print(f"schema:   unknown: {have.reason}")
        return
    applied = have.applied
    last = max(applied, default=None)
    print(f"schema:   {have.version} ({len(applied)} migrations applied"
          f"{f', last {applied[last][0]}' if last is not None else ''})")
    pending = [m.name for m in runner.load_migrations() if m.version not in applied]
    unknown = sorted(v for v in applied if v > expected)
    print(f"pending:  {', '.join(pending) + ' (run `mailroom db migrate`)' if pending else 'none'}")
    if unknown:
        print(f"newer:    the database has migrations this driver does not know ({', '.join(applied[v][0] for v in unknown)}):"
              " upgrade the mailroom package")


@db_app.command("migrate")
def migrate_cmd(
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
    print_bundle: Annotated[bool, typer.Option("--print", help="Print the SQL bundle for psql instead of applying.")] = False,
    offline: Annotated[bool, typer.Option("--offline", help="With --print: every migration, no database needed.")] = False,
    lock_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for one lock a running transaction holds before rolling back and retrying.")
    ] = runner.LOCK_TIMEOUT,
) -> None:
    """Apply pending migrations and sql/ in one transaction (or print them as one psql bundle)."""
    if print_bundle:
        url = None if offline else _url(database_url, data_dir)
        sys.stdout.write(runner.bundle(url))
        return
    if not 0 < lock_timeout <= 600:
        raise UserError("--lock-timeout must be between 0 and 600 seconds", exit_code=2)
    result = runner.migrate(_url(database_url, data_dir), notices=_say, say=_say, lock_timeout=lock_timeout)
    for name in result.applied:
        _say(f"applied {name}")
    _say(f"migrations applied: {len(result.applied)}; sql files applied: {result.sql_files}; "
         f"locks held {result.held_seconds:.2f}s")


@db_app.command("url")
def url_cmd(
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
    tcp: Annotated[bool, typer.Option("--tcp", help="The TCP conninfo (password via a passfile).")] = False,
) -> None:
    """Print a conninfo usable as psql "$(mailroom db url)"."""
    if database_url:
        print(database_url)
        return
    cluster = embedded.Cluster(default_home(data_dir))
    if tcp and not cluster.tcp:
        raise UserError("the cluster does not listen on TCP; `mailroom db down` and `mailroom db up --tcp`")
    print(cluster.tcp_url() if tcp else cluster.url())


def _url(database_url: str | None, data_dir) -> str:
    from mailroom.db.config import resolve_database_url

    return resolve_database_url(database_url, data_dir)
