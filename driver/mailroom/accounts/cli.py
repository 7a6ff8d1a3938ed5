"""`mailroom collect`: the typer command of the token collector (mailroom.accounts.collector).

Configuration comes from flags or environment variables; a bad value is one line on stderr and
exit code 2.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from mailroom.db.config import (
    DatabaseUrlOption,
    DataDirOption,
    ListenUrlOption,
    hex_key,
    resolve_database_url,
    resolve_listen_url,
)

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


def _opt(flag: str, env: str, help_text: str):  # noqa: ANN202 - typer metadata
    return typer.Option(flag, envvar=env, show_envvar=True, help=help_text)


@app.command("collect")
def collect(
    database_url: DatabaseUrlOption = None,
    data_dir: DataDirOption = None,
    listen_url: ListenUrlOption = None,
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
            "Milliseconds between health checks and sweeps when idle (>= the batch timeout).",
        ),
    ] = "270000",
    poll_interval: Annotated[
        int,
        _opt("--poll-interval", "MAILROOM_POLL_INTERVAL", "Milliseconds between polls while no LISTEN connection hears."),
    ] = 1000,
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
    import os

    from mailroom.accounts.collector import Collector, parse_config
    from mailroom.core.errors import ConfigError
    from mailroom.core.log import get_logger

    if os.environ.get("MAILROOM_SECRET_KEY"):
        # the keyring signs now; the old key only has to be imported once (links already sent)
        get_logger("collect").warning(
            "WARN: MAILROOM_SECRET_KEY is set but no longer used: the keyring in the database signs the links; "
            "import it once with `mailroom keys import` so links it signed keep working, then unset it"
        )
    if not 10 <= poll_interval <= 3_600_000:
        raise ConfigError(f"--poll-interval must be between 10 and 3600000 ms, got {poll_interval}")
    cfg = parse_config(batch_limit, batch_timeout, healthcheck_interval, channel, output, enqueue, poll_interval)
    home = Path(data_dir) if data_dir else None
    url = resolve_database_url(database_url, home)
    cfg = replace(cfg, url=url, listen_url=resolve_listen_url(listen_url, url))
    raise typer.Exit(Collector(cfg).run())


keys_app = typer.Typer(
    name="keys",
    help="The token signing keyring in the database (admin): list, rotate, retire, export, import.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _keys_call(database_url: Optional[str], fn_name: str, **kwargs):  # noqa: ANN202 - rows
    from mailroom.accounts import sqlapi
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
    key_id: Annotated[Optional[int], typer.Argument(metavar="[ID]", help="Default: the active key.")] = None,
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
