"""`mailroom db …`: the typer commands that start, stop, inspect and migrate the database."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Optional

import psycopg
import typer

from mailroom.core.errors import UserError, db_user_error
from mailroom.core.options import duration_option, new_app
from mailroom.db import cluster as embedded
from mailroom.db import migrate as runner
from mailroom.db.config import DatabaseUrlOption, DataDirOption, default_home
from mailroom.db.connect import connect

db_app = new_app("db", "The database: embedded cluster or MAILROOM_DATABASE_URL.")

PortOption = Annotated[
    Optional[int],
    typer.Option("--port", envvar="MAILROOM_PG_PORT", show_envvar=True, min=1, max=65535, metavar="PORT",
                 help="Port of the embedded server (socket name; TCP with --tcp)."),
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
    workers: Annotated[
        int, typer.Option("--workers", help="Start a Citus coordinator and this many workers (docs/scale.md); 0: one server.")
    ] = 0,
) -> None:
    """Create and start the embedded cluster (idempotent), then migrate. With a URL: only migrate."""
    started = time.monotonic()
    if workers and database_url:
        raise UserError("--workers starts an embedded Citus topology; it does not apply to MAILROOM_DATABASE_URL", exit_code=2)
    if workers:
        from mailroom.db import citus

        topology = citus.up(default_home(data_dir), workers, port=port, tcp=tcp)
        _say(f"Citus coordinator in {topology.coordinator.home} (port {topology.coordinator.port}), "
             f"{workers} workers (ports {', '.join(str(w.port) for w in topology.workers)})")
        url = topology.url()
    elif database_url:
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
    for line in result.step_lines():
        _say(line)
    _say(f"ready in {time.monotonic() - started:.2f}s")
    print(url)


@db_app.command("down")
def down(data_dir: DataDirOption = None) -> None:
    """Stop the embedded cluster, and its Citus workers if it has any (its data stays)."""
    from mailroom.db import citus

    home = default_home(data_dir)
    if citus.down(home):
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
    lock_timeout: Annotated[float, duration_option(
        "--lock-timeout", positive=True, maximum=600,
        help="How long to wait for one lock a running transaction holds before rolling back and retrying.")] = "5s",
) -> None:
    """Apply pending migrations and sql/ in one transaction (or print them as one psql bundle)."""
    if print_bundle:
        url = None if offline else _url(database_url, data_dir)
        sys.stdout.write(runner.bundle(url))
        return
    from mailroom.core.progress import Progress

    url = _url(database_url, data_dir)
    with Progress("migrating", ticker=True):  # (on a terminal only: a migration over many rows takes a while)
        result = runner.migrate(url, notices=_say, say=_say, lock_timeout=lock_timeout)
    for name in result.applied:
        _say(f"applied {name}")
    _say(f"migrations applied: {len(result.applied)}; sql files applied: {result.sql_files}; "
         f"locks held {result.held_seconds:.2f}s")
    for line in result.step_lines():  # MAILROOM_SECRET_KEY imported, one-time steps left (docs/upgrading.md)
        _say(line)


@db_app.command("import-seed")
def import_seed_cmd(
    source_url: Annotated[str, typer.Argument(
        metavar="SOURCE_URL", help="The original mailroom's database (schema public: accounts, tokens, jobs); read only.")],
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
    batch: Annotated[int, typer.Option("--batch", min=1, max=10000, help="Accounts per transaction.")] = 500,
) -> None:
    """Bring the original mailroom's accounts and usable tokens over (mailroom.import_seed_accounts; admin).
    Statuses and epoch timestamps come over; mailroom assigns its own ids; an email or login that exists is
    skipped and counted; tokens the seed already mailed (id <= jobs.last_seq) arrive dispatched, their links
    working once the seed's MAILROOM_SECRET_KEY is imported (`mailroom keys import`); the others are mailed
    by mailroom's collector. Running it again imports nothing. Prints counts, never an address."""
    from mailroom.db.import_seed import import_seed

    summary = import_seed(_url(database_url, data_dir), source_url, batch=batch)
    imported = summary.counts.get("accounts imported", 0)
    skipped = sum(n for item, n in summary.counts.items() if item.startswith("accounts skipped"))
    print(f"imported {imported} accounts, skipped {skipped} (seed cursor jobs.last_seq = {summary.dispatched_up_to}; "
          f"{summary.batches} batches)")
    for item, n in summary.counts.items():
        print(f"  {item}: {n}")
    if summary.counts.get("tokens imported dispatched", 0):
        _say("dispatched links verify only with the seed's key in the keyring: "
             "MAILROOM_SECRET_KEY=… mailroom keys import (once)")


@db_app.command("verify")
def verify_cmd(
    files: Annotated[Optional[list[str]], typer.Argument(
        metavar="FILE", help="Only these files of the suite (e.g. 33_outbound_claim); default: all.")] = None,
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print every TAP line, not only the failures.")] = False,
) -> None:
    """Run the shipped pgTAP suite against the database, every file in a transaction that rolls back (exit 0 or 1).

    Needs the pgtap extension in the database (a superuser runs CREATE EXTENSION pgtap once). Safe on a
    live installation: docs/operations.md, "Verifying an installation"."""
    from mailroom.db.verify import verify

    url = _url(database_url, data_dir)
    try:
        rc = verify(url, files or (), verbose=verbose)
    except psycopg.Error as exc:
        raise db_user_error(exc) from None
    raise typer.Exit(rc)


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


settings_app = new_app(
    "settings",
    "The settings (mailroom.settings): list them, read one, change one (admin). Values are checked "
    "against each setting's kind and bounds.",
)


@settings_app.command("list")
def settings_list(
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per setting.")] = False,
) -> None:
    """Every setting: value, kind and bounds, description (mailroom.list_settings)."""
    import json

    from mailroom.core.table import table
    from mailroom.db import sqlapi
    from mailroom.db.connect import call_once

    rows = call_once(_url(database_url, data_dir), sqlapi.list_settings, application_name="mailroom-settings")
    if as_json:
        for r in rows:
            print(json.dumps(r._asdict()))
        return
    table(
        [{"name": r.name, "value": r.value, "kind": r.kind or "-",
          "range": "-" if r.min_value is None and r.max_value is None else f"{r.min_value or ''}..{r.max_value or ''}",
          "description": r.description} for r in rows],
        ["name", "value", "kind", "range", "description"],
    )


@settings_app.command("get")
def settings_get(
    name: Annotated[str, typer.Argument(metavar="NAME", help="A setting, e.g. outbound.max_attempts.")],
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Print one setting's value (mailroom.setting)."""
    from mailroom.db import sqlapi
    from mailroom.db.connect import call_once

    rows = call_once(_url(database_url, data_dir), sqlapi.setting, application_name="mailroom-settings", name=name)
    print(rows[0][0])


@settings_app.command("set")
def settings_set(
    name: Annotated[str, typer.Argument(metavar="NAME", help="A setting, e.g. outbound.max_attempts.")],
    value: Annotated[str, typer.Argument(metavar="VALUE", help="Its new value, checked against its kind and bounds.")],
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Change a setting (mailroom.set_setting; admin)."""
    from mailroom.db import sqlapi
    from mailroom.db.connect import call_once

    call_once(_url(database_url, data_dir), sqlapi.set_setting, application_name="mailroom-settings", name=name,
              value=value)
    print(f"{name} = {value}")


erase_app = new_app("erase", "Erase one person's address from every table (mailroom.erase_address; admin).")


@erase_app.command("erase")
def erase_cmd(
    address: Annotated[str, typer.Argument(metavar="ADDRESS", help="The email address to erase.")],
    yes: Annotated[bool, typer.Option("--yes", help="Erase (without it: a dry run that only counts).")] = False,
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Erase an address from every table in one transaction (mailroom.erase_address; admin): accounts,
    tokens, outbound mail, bounces, inboxes and their messages, recovery requests, workers' tables. Only its
    keyed hash stays, on the suppression list, so mail to it stays refused. Without --yes: a dry run that
    prints what would change. The address is never printed."""
    from mailroom.db import sqlapi
    from mailroom.db.connect import call_once

    rows = call_once(_url(database_url, data_dir), sqlapi.erase_address, application_name="mailroom-erase",
                     address=address, dry_run=not yes)
    counts = ", ".join(f"{r.item} {r.affected}" for r in rows)
    if yes:
        print(f"erased: {counts}")
    else:
        print(f"dry run, nothing changed; would erase: {counts} (run again with --yes to erase)")
