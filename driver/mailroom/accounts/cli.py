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
    batch_limit: Annotated[int, env_option(
        "--batch-limit", env="MAILROOM_BATCH_LIMIT", min=1, max=100_000, metavar="N",
        help="Most tokens per batch.")] = 10,
    batch_timeout: Annotated[float, duration_option(
        "--batch-timeout", env="MAILROOM_BATCH_TIMEOUT", bare_ms=True, maximum=86400,
        help="How long to wait after the first notification before taking a batch that is not full.")] = "5s",
    healthcheck_interval: Annotated[float, duration_option(
        "--healthcheck-interval", env="MAILROOM_HEALTHCHECK_INTERVAL", bare_ms=True, minimum=0.001, maximum=86400,
        help="Between health checks and sweeps when idle (at least the batch timeout).")] = "270s",
    poll_interval: Annotated[float, duration_option(
        "--poll-interval", env="MAILROOM_POLL_INTERVAL", bare_ms=True, minimum=0.01, maximum=3600,
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
    from mailroom.db.keyring import check_at_start, env_fingerprint

    # MAILROOM_SECRET_KEY set: it must be the keyring's active key (checked once connected, exit 2 if not)
    fingerprint = env_fingerprint()
    cfg = parse_config(batch_limit, batch_timeout, healthcheck_interval, channel, output, enqueue, poll_interval)
    home = Path(data_dir) if data_dir else None
    url = resolve_database_url(database_url, home)
    check_at_start(url, "collect", fingerprint)
    cfg = replace(cfg, url=url, listen_url=resolve_listen_url(listen_url, url), metrics_port=metrics_port,
                  metrics_host=metrics_host, key_fingerprint=fingerprint)
    raise typer.Exit(Collector(cfg).run())


keys_app = new_app("keys", help="The token signing keyring in the database (admin): list, rotate, retire, export, import.")


def _keys_call(database_url: Optional[str], fn_name: str, **kwargs):  # noqa: ANN202 - rows
    from mailroom.db import sqlapi
    from mailroom.db.connect import call_once

    return call_once(resolve_database_url(database_url), getattr(sqlapi, fn_name),
                     application_name="mailroom-keys", **kwargs)


@keys_app.command("list")
def keys_list(database_url: DatabaseUrlOption = None) -> None:
    """Every key of the keyring: id, state, origin, fingerprint (no key bytes)."""
    rows = _keys_call(database_url, "list_signing_keys")
    typer.echo(f"{'ID':>4}  {'STATE':<11}  {'ORIGIN':<9}  {'FINGERPRINT':<16}  CREATED")
    for r in rows:
        typer.echo(f"{r.id:>4}  {r.state:<11}  {r.origin:<9}  {r.fingerprint or '-':<16}  "
                   f"{r.created_at.isoformat(timespec='seconds')}")


@keys_app.command("rotate")
def keys_rotate(database_url: DatabaseUrlOption = None) -> None:
    """Make a new active signing key; the previous one becomes verify-only (its links keep working)."""
    rows = _keys_call(database_url, "rotate_signing_key")
    typer.echo(f"key {rows[0][0]} is the active signing key; the previous one verifies until retired")


@keys_app.command("retire")
def keys_retire(key_id: Annotated[int, typer.Argument(metavar="ID")], database_url: DatabaseUrlOption = None) -> None:
    """Retire a verify-only key: links it signed stop working and its bytes are wiped."""
    _keys_call(database_url, "retire_signing_key", id=key_id)
    typer.echo(f"key {key_id} retired")


@keys_app.command("export")
def keys_export(
    key_id: Annotated[Optional[int], typer.Argument(metavar="ID", help="Default: the active key.")] = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Print a key (64 hex characters) for a verifier outside the database; the export is recorded."""
    rows = _keys_call(database_url, "export_signing_key", **({} if key_id is None else {"id": key_id}))
    typer.echo(bytes(rows[0][0]).hex())


@keys_app.command("import")
def keys_import(
    active: Annotated[bool, typer.Option("--active", help="Make it the active key (verifiers outside the "
                                         "database still hold it); default: verify-only.")] = False,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Add MAILROOM_SECRET_KEY (the previous release's signing key) to the keyring, once, so links it signed keep working."""
    import os

    key = hex_key("MAILROOM_SECRET_KEY", os.environ.get("MAILROOM_SECRET_KEY"))
    rows = _keys_call(database_url, "import_signing_key", key=key, active=active)
    state = "the active key" if active else "verify-only"
    typer.echo(f"MAILROOM_SECRET_KEY is key {rows[0][0]} ({state}); unset it everywhere: nothing needs it now")


account_app = new_app(
    "account",
    "Accounts and their tokens, one SQL call each: create, show, list (admin: addresses are PII), suspend, "
    "unsuspend, consume a link, request a password recovery (the application's calls, mailroom_app).",
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (one object per line) instead of text.")]
AccountArgument = Annotated[int, typer.Argument(metavar="ID", help="The account id.")]
ACCOUNT_STATUSES = ("provisioned", "active", "suspended")


def _account_call(database_url: Optional[str], fn_name: str, **kwargs):  # noqa: ANN202 - rows
    from mailroom.accounts import sqlapi
    from mailroom.db.connect import call_once

    return call_once(resolve_database_url(database_url), getattr(sqlapi, fn_name),
                     application_name="mailroom-account", **kwargs)


def _emit(record: dict, as_json: bool) -> None:
    import json

    from mailroom.core.table import fields

    if as_json:
        typer.echo(json.dumps({k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in record.items()}))
    else:
        fields(record)


@account_app.command("create")
def account_create(
    email: Annotated[str, typer.Argument(metavar="EMAIL", help="The account's address (its activation mail goes there).")],
    login: Annotated[str, typer.Argument(metavar="LOGIN", help="The account's login (unique).")],
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a provisioned account; its activation token is issued at once (collect or send mails it)."""
    rows = _account_call(database_url, "create_account", email=email, login=login)
    _emit({"account": rows[0][0], "status": "provisioned"}, as_json)


@account_app.command("show")
def account_show(
    account: Annotated[str, typer.Argument(metavar="ACCOUNT", help="The account id, or its address.")],
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """One account: id, address, login, status and its times (admin)."""
    from mailroom.core.errors import UserError

    by = {"account": int(account)} if account.isdigit() else {"email": account}
    rows = _account_call(database_url, "list_accounts", limit=1, **by)
    if not rows:
        raise UserError(f"unknown account {account if account.isdigit() else '(no account has that address)'}")
    _emit(rows[0]._asdict(), as_json)


@account_app.command("list")
def account_list(
    status: Annotated[Optional[str], typer.Option(metavar="STATUS", help="Only provisioned, active or suspended.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10000, metavar="N", help="At most this many.")] = 100,
    from_id: Annotated[Optional[int], typer.Option(
        "--from-id", metavar="ID", help="Those with a greater id (the next page: the last id shown).")] = None,
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Accounts in id order, a page at a time (admin: addresses are PII)."""
    import json

    from mailroom.core.errors import ConfigError
    from mailroom.core.table import table

    if status is not None and status not in ACCOUNT_STATUSES:
        raise ConfigError(f"--status must be one of {', '.join(ACCOUNT_STATUSES)}, got {status!r}")
    rows = _account_call(database_url, "list_accounts", status=status, limit=limit, after=from_id)
    if as_json:
        for r in rows:
            typer.echo(json.dumps({k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in r._asdict().items()}))
        return
    table([r._asdict() for r in rows], ["id", "email", "login", "status", "created_at", "activated_at"],
          headers=["id", "email", "login", "status", "created", "activated"], empty="no accounts")


@account_app.command("suspend")
def account_suspend(account: AccountArgument, database_url: DatabaseUrlOption = None, as_json: JsonOption = False) -> None:
    """Suspend an account: its links stop working until it is unsuspended."""
    rows = _account_call(database_url, "suspend_account", account=account)
    _emit({"account": account, "status": rows[0][0]}, as_json)


@account_app.command("unsuspend")
def account_unsuspend(account: AccountArgument, database_url: DatabaseUrlOption = None,
                      as_json: JsonOption = False) -> None:
    """Lift a suspension: back to active, or provisioned if it was never activated."""
    rows = _account_call(database_url, "unsuspend_account", account=account)
    _emit({"account": account, "status": rows[0][0]}, as_json)


@account_app.command("consume")
def account_consume(
    link: Annotated[str, typer.Argument(metavar="SIGNED", help="The signed value of the link (its last path part).")],
    code: Annotated[Optional[str], typer.Option(metavar="CODE", help="The recovery code sent with a recovery link.")] = None,
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Consume an activation or recovery link, as the application does when it is followed."""
    rows = _account_call(database_url, "consume_token", signed=link, **({} if code is None else {"code": code}))
    r = rows[0]
    if r.outcome == "wrong_code":  # the attempt counted (committed): a refusal, one line
        from mailroom.core.errors import UserError

        raise UserError(f"wrong recovery code; {r.attempts_left} attempt(s) left", exit_code=2)
    _emit({"account": r.account, "outcome": r.outcome}, as_json)


@account_app.command("recover")
def account_recover(
    email: Annotated[str, typer.Argument(metavar="EMAIL", help="The address recovery is requested for.")],
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Request a password recovery: a recovery token is issued if the address is an active account and the
    recovery policy allows (the answer is the same for any address)."""
    _account_call(database_url, "request_password_recovery", email=email)
    _emit({"requested": True}, as_json)
