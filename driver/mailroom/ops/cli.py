"""`mailroom run` and `mailroom demo`: the typer commands of mailroom.ops."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from mailroom.core.errors import UserError
from mailroom.db.config import DatabaseUrlOption, DataDirOption, ListenUrlOption, resolve_database_url, resolve_listen_url

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command("run")
def run(
    database_url: DatabaseUrlOption = None,
    inbox_host: Annotated[str, typer.Option(help="Inbound SMTP listen address.")] = "127.0.0.1",
    inbox_port: Annotated[int, typer.Option(help="Inbound SMTP port.")] = 2525,
    inbox: Annotated[bool, typer.Option("--inbox/--no-inbox", help="Run `mailroom inbox serve`.")] = True,
    collect: Annotated[bool, typer.Option("--collect/--no-collect", help="Run `mailroom collect --enqueue`.")] = True,
    send: Annotated[bool, typer.Option("--send/--no-send", help="Run `mailroom send`.")] = True,
    expire: Annotated[bool, typer.Option("--expire/--no-expire", help="Run `mailroom expire`.")] = True,
    maintain: Annotated[
        bool, typer.Option("--maintain/--no-maintain", help="Run `mailroom maintain --every 10m` (partitions).")
    ] = True,
    metrics_port: Annotated[
        Optional[int], typer.Option(help="Prometheus metrics port of the sender (127.0.0.1); off by default.")
    ] = None,
) -> None:
    """Run inbound SMTP, the collector (--enqueue), the sender, the expiry worker and partition maintenance together."""
    from mailroom.ops.run import run_all

    if not (inbox or collect or send or expire or maintain):
        raise UserError("nothing to run: every component is disabled", exit_code=2)
    url = resolve_database_url(database_url)
    raise typer.Exit(run_all(url, inbox_host=inbox_host, inbox_port=inbox_port, inbox=inbox, collect=collect,
                             send=send, expire=expire, maintain=maintain, metrics_port=metrics_port))


@app.command("demo")
def demo(
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
    pace: Annotated[float, typer.Option(help="Seconds to pause after each step (0 for none).")] = 0.4,
) -> None:
    """Run the end-to-end story on the embedded cluster (or MAILROOM_DATABASE_URL) and stop everything."""
    from mailroom.ops.demo import run_demo

    run_demo(database_url, Path(data_dir) if data_dir else None, pace)


@app.command("doctor")
def doctor(database_url: DatabaseUrlOption = None, listen_url: ListenUrlOption = None) -> None:
    """Check a deployment: one OK/WARN/FAIL line per check; exit 1 when any check fails."""
    from mailroom.ops.doctor import run_checks

    url = resolve_database_url(database_url)
    checks = run_checks(url, resolve_listen_url(listen_url, url))
    for check in checks:
        typer.echo(check.line())
    raise typer.Exit(1 if any(c.status == "FAIL" for c in checks) else 0)


@app.command("maintain")
def maintain(
    database_url: DatabaseUrlOption = None,
    every: Annotated[
        Optional[str], typer.Option(help="Run as a worker: now, then this often (e.g. 10m), until SIGTERM/SIGINT.")
    ] = None,
) -> None:
    """Run partition maintenance once (create partitions ahead, drop those past retention; print the report),
    or as a worker with --every."""
    from mailroom.db.connect import call_once
    from mailroom.ops import sqlapi

    if every is not None:
        import signal

        from mailroom.core.durations import parse_seconds
        from mailroom.ops.maintain import MaintenanceWorker

        seconds = parse_seconds("--every", every)
        if seconds <= 0:
            raise UserError("--every must be positive", exit_code=2)
        worker = MaintenanceWorker(resolve_database_url(database_url), seconds)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.stop())
        worker.run()
        return
    rows = call_once(resolve_database_url(database_url), sqlapi.maintain_partitions, application_name="mailroom-maintain")
    if not rows:
        typer.echo("nothing to do")
    for action, table, partition, count in rows:
        typer.echo(f"{action}\t{table or '-'}\t{partition or '-'}\t{count}")
