"""`mailroom run`, `status`, `maintain`, `doctor` and `demo`: the typer commands of mailroom.ops."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from mailroom.core.errors import ConfigError, UserError
from mailroom.core.options import duration_option, env_option, new_app, port_option
from mailroom.db.config import (
    DatabaseUrlOption,
    DataDirOption,
    ListenUrlOption,
    check_conninfo,
    resolve_database_url,
    resolve_listen_url,
)

app = new_app()


def _run_opt(flag: str, help: str, **kwargs: Any) -> Any:  # noqa: A002
    env = "MAILROOM_RUN_" + flag.lstrip("-").split("/")[0].replace("-", "_").upper()
    return env_option(flag, env=env, help=help, **kwargs)


def _worker_url(name: str) -> Any:
    return env_option(f"--{name}-url", env=f"MAILROOM_RUN_{name.upper()}_URL", metavar="URL",
                      help=f"The database URL of `{name}` (a login granted its role; default: --database-url).")


@app.command("run")
def run(
    database_url: DatabaseUrlOption = None,
    listen_url: ListenUrlOption = None,
    inbox_url: Annotated[Optional[str], _worker_url("inbox")] = None,
    collect_url: Annotated[Optional[str], _worker_url("collect")] = None,
    send_url: Annotated[Optional[str], _worker_url("send")] = None,
    expire_url: Annotated[Optional[str], _worker_url("expire")] = None,
    maintain_url: Annotated[Optional[str], _worker_url("maintain")] = None,
    http_url: Annotated[Optional[str], _worker_url("http")] = None,
    inbox_host: Annotated[str, _run_opt("--inbox-host", "Inbound SMTP listen address.", metavar="HOST")] = "127.0.0.1",
    inbox_port: Annotated[int, port_option("--inbox-port", env="MAILROOM_RUN_INBOX_PORT",
                                           help="Inbound SMTP port.")] = 2525,
    inbox: Annotated[bool, _run_opt("--inbox/--no-inbox", "Run `mailroom inbox serve`.")] = True,
    collect: Annotated[bool, _run_opt("--collect/--no-collect", "Run `mailroom collect --enqueue`.")] = True,
    send: Annotated[bool, _run_opt("--send/--no-send", "Run `mailroom send`.")] = True,
    expire: Annotated[bool, _run_opt("--expire/--no-expire", "Run `mailroom expire`.")] = True,
    maintain: Annotated[bool, _run_opt("--maintain/--no-maintain",
                                       "Run `mailroom maintain --every 10m` (partitions).")] = True,
    metrics_port: Annotated[Optional[int], port_option(
        "--metrics-port", env="MAILROOM_RUN_METRICS_PORT",
        help="Prometheus metrics from this port on (127.0.0.1): send +0, collect +1, inbox +2, expire +3, "
             "maintain +4; off by default.")] = None,
    http_port: Annotated[Optional[int], port_option(
        "--http-port", env="MAILROOM_RUN_HTTP_PORT",
        help="Also run the HTTP face (`mailroom http serve`) on this port; off by default. Its inboxes expire "
             "by the expire worker.")] = None,
    http_host: Annotated[str, _run_opt("--http-host", "HTTP listen address.", metavar="HOST")] = "127.0.0.1",
    link_check: Annotated[bool, _run_opt("--link-check", "With --http-port: run the link check "
                                         "(`http serve --link-check`).")] = False,
    spamd: Annotated[Optional[str], _run_opt("--spamd", "With --http-port: the spam check's SpamAssassin spamd "
                                             "(`http serve --spamd`).", metavar="HOST:PORT")] = None,
) -> None:
    """Run inbound SMTP, the collector (--enqueue), the sender, the expiry worker and partition maintenance
    together; each worker's own options come from its environment variables (MAILROOM_SEND_…).

    The login: one URL for all needs mailroom_inbound, mailroom_collector and mailroom_sender granted to
    its login (and mailroom_http with --http-port); or give each worker a URL of its own (--inbox-url, …)
    whose login holds that worker's role."""
    from mailroom.db.connect import connect
    from mailroom.ops.run import RunPlan, run_all

    enabled = {"inbox": inbox, "collect": collect, "send": send, "expire": expire, "maintain": maintain,
               "http": http_port is not None}
    if not any(enabled.values()):
        raise ConfigError("nothing to run: every component is disabled")
    own = {"inbox": inbox_url, "collect": collect_url, "send": send_url, "expire": expire_url,
           "maintain": maintain_url, "http": http_url}
    default = None
    if not all(own[w] for w, on in enabled.items() if on):
        default = resolve_database_url(database_url)
    urls = {w: check_conninfo(f"--{w}-url", own[w]) if own[w] else default for w, on in enabled.items() if on}
    # the children's MAILROOM_LISTEN_URL: --listen-url as given ('none': they poll), else their own URL
    listen = None if listen_url is None else (resolve_listen_url(listen_url, "") or "none")
    checks = (("--link-check",) if link_check else ()) + (("--spamd", spamd) if spamd else ())
    if checks and http_port is None:
        raise ConfigError(f"{checks[0]} goes with --http-port (the checks are the HTTP face's)")
    plan = RunPlan(urls, listen, inbox_host, inbox_port, metrics_port, http_host, http_port,  # type: ignore[arg-type]
                   http_args=checks)
    raise typer.Exit(run_all(plan, check=lambda url: connect(url, application_name="mailroom-run")))


@app.command("status")
def status(database_url: DatabaseUrlOption = None, data_dir: DataDirOption = None) -> None:
    """The whole installation on one screen: queues, workers (running, lost, stopped), inboxes, tokens,
    partitions and the last maintenance, read now (a login granted mailroom_monitor sees it all)."""
    import psycopg

    from mailroom.core.errors import db_user_error
    from mailroom.ops.status import show

    try:
        show(resolve_database_url(database_url, Path(data_dir) if data_dir else None))
    except psycopg.Error as exc:
        raise db_user_error(exc) from None


@app.command("demo")
def demo(
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
    pace: Annotated[float, duration_option("--pace", help="Pause after each step (0 for none).")] = "400ms",
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
    every: Annotated[Optional[float], duration_option(
        "--every", env="MAILROOM_MAINTAIN_EVERY", positive=True,
        help="Run as a worker: now, then this often (e.g. 10m), until SIGTERM/SIGINT.")] = None,
    metrics_port: Annotated[Optional[int], port_option(
        "--metrics-port", env="MAILROOM_MAINTAIN_METRICS_PORT",
        help="With --every: serve Prometheus metrics on this port (0: any free port).")] = None,
    metrics_host: Annotated[str, env_option(
        "--metrics-host", env="MAILROOM_MAINTAIN_METRICS_HOST", metavar="HOST", help="Metrics bind address.")
    ] = "127.0.0.1",
) -> None:
    """Run partition maintenance once (create partitions ahead, drop those past retention; print the report),
    or as a worker with --every."""
    from mailroom.db.connect import call_once
    from mailroom.ops import sqlapi

    if every is not None:
        from mailroom.ops.maintain import MaintenanceWorker

        worker = MaintenanceWorker(resolve_database_url(database_url), every, metrics_port=metrics_port,
                                   metrics_host=metrics_host)
        worker.stop_on_signals()
        worker.run()
        return
    if metrics_port is not None:
        raise UserError("--metrics-port is for the worker (--every)", exit_code=2)
    from mailroom.core.progress import Progress

    with Progress("maintaining partitions", ticker=True):
        rows = call_once(resolve_database_url(database_url), sqlapi.maintain_partitions,
                         application_name="mailroom-maintain")
    if not rows:
        typer.echo("nothing to do")
    for action, table, partition, count in rows:
        typer.echo(f"{action}\t{table or '-'}\t{partition or '-'}\t{count}")
