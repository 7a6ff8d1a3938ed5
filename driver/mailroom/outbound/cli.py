"""`mailroom send` and `mailroom outbound …`: the typer commands of the outbound queue.

`send` runs the sender (mailroom.outbound.sender). Every `outbound` command is one call of a SQL
function or view (sql/35_outbound_admin.sql); nothing here decides what a state means. Output
never contains addresses, subjects or bodies; `show` prints error_log, which the database has
already scrubbed (mailroom.redact_pii).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Optional

import psycopg
import typer

from mailroom.core.durations import parse_seconds
from mailroom.core.errors import ConfigError, UserError, describe_db_error
from mailroom.db import sqlapi as db_sqlapi
from mailroom.db.config import DatabaseUrlOption, ListenUrlOption, hex_key, resolve_database_url, resolve_listen_url
from mailroom.db.connect import call_once, connect
from mailroom.db.contract import SqlFunction
from mailroom.outbound import sqlapi

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

outbound = typer.Typer(
    name="outbound",
    help="Operate the outbound queue: status, list, show, retry, purge, reap, sender, limits.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

def _call(database_url: str | None, fn: SqlFunction, **kwargs: Any) -> list[dict[str, Any]]:
    """One contract call on a short-lived connection: its rows as dicts (a value is the column `value`)."""
    rows = call_once(resolve_database_url(database_url), fn, application_name="mailroom-outbound", **kwargs)
    return [r._asdict() if fn.columns else {"value": r[0]} for r in rows]


def _value(database_url: str | None, fn: SqlFunction, **kwargs: Any) -> Any:
    rows = _call(database_url, fn, **kwargs)
    return rows[0]["value"] if rows else None


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.0f}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    cells = [[_fmt(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    typer.echo("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


@outbound.command("status")
def status(database_url: DatabaseUrlOption = None) -> None:
    """Counts per status, due now, retries waiting, oldest queued age (mailroom.outbound_stats), then
    every queue's health (mailroom.queue_health) and the workers' heartbeats (mailroom.worker_health)."""
    url = resolve_database_url(database_url)
    row = _call(url, sqlapi.outbound_stats)[0]
    labels = {
        "queued": "queued",
        "processing": "processing",
        "sent": "sent",
        "failed": "failed",
        "due_now": "due now",
        "retries_waiting": "retries waiting",
        "possibly_sent": "possibly sent (reaped)",
        "oldest_queued_age_seconds": "oldest queued age (s)",
        "stale_outcomes": "stale outcomes ignored",
        "reaped": "reaped",
    }
    width = max(len(v) for v in labels.values())
    for key, label in labels.items():
        typer.echo(f"{label.ljust(width)}  {_fmt(row[key])}")
    # Health next; a role or schema without it still gets the counts above (one line says why).
    for title, fn, columns in (
        ("queue health:", db_sqlapi.queue_health, list(QUEUE_HEALTH_COLUMNS)),
        ("worker heartbeats:", db_sqlapi.worker_health, list(WORKER_HEALTH_COLUMNS)),
    ):
        try:
            rows = _call(url, fn)
        except UserError as exc:
            typer.echo(f"{title} unavailable ({exc})")
            continue
        typer.echo(title)
        if rows:
            _table(rows, columns)
        else:
            typer.echo("  none reported a heartbeat")


QUEUE_HEALTH_COLUMNS = ("queue", "due", "oldest_due_age_seconds", "expired_leases")
WORKER_HEALTH_COLUMNS = ("worker", "kind", "listening", "heartbeat_age_seconds", "listener_age_seconds",
                         "last_claim_age_seconds", "claimed")


@outbound.command("list")
def list_messages(
    database_url: DatabaseUrlOption = None,
    status: Annotated[Optional[str], typer.Option(help="queued, processing, sent or failed.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
) -> None:
    """Newest messages (no addresses or subjects)."""
    rows = _call(database_url, sqlapi.list_outbound_messages, status=status, limit=limit)
    if not rows:
        typer.echo("no messages")
        return
    _table(
        rows,
        ["id", "sender", "status", "attempts", "recipients", "last_smtp_code", "last_enhanced_code",
         "possibly_sent", "next_retry_at", "created_at", "sent_at"],
    )


@outbound.command("show")
def show(message_id: Annotated[int, typer.Argument(metavar="ID")], database_url: DatabaseUrlOption = None) -> None:
    """One message: state, codes and its (scrubbed) error log."""
    row = _call(database_url, sqlapi.show_outbound_message, id=message_id)[0]
    log = row.pop("error_log")
    width = max(len(k) for k in row)
    for key, value in row.items():
        typer.echo(f"{key.ljust(width)}  {_fmt(value)}")
    typer.echo("error_log:")
    for line in (log or "-").splitlines():
        typer.echo(f"  {line}")


@outbound.command("retry")
def retry(
    message_id: Annotated[Optional[int], typer.Argument(metavar="[ID]")] = None,
    all_failed: Annotated[bool, typer.Option("--all-failed", help="Retry every failed message.")] = False,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Put a failed message (or all of them) back in the queue with a fresh attempt budget."""
    if (message_id is None) == (not all_failed):
        raise ConfigError("give either a message ID or --all-failed")
    if all_failed:
        count = _value(database_url, sqlapi.retry_failed_messages)
        typer.echo(f"{count} message(s) queued again")
    else:
        _call(database_url, sqlapi.retry_message, id=message_id)
        typer.echo(f"message {message_id} queued again")


@outbound.command("purge")
def purge(
    sent_before: Annotated[str, typer.Option(help="Age of sent messages to delete, e.g. 7d, 12h.")],
    batch: Annotated[int, typer.Option(help="Rows deleted per transaction.")] = 5000,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Delete sent messages older than --sent-before, in batches (short transactions)."""
    age = parse_seconds("--sent-before", sent_before)
    if not 1 <= batch <= 100000:
        raise ConfigError(f"--batch must be between 1 and 100000, got {batch}")
    url = resolve_database_url(database_url)
    total = 0
    with connect(url, application_name="mailroom-outbound") as conn:
        try:
            cutoff = db_sqlapi.clock.value(conn) - timedelta(seconds=age)  # the database's clock, not this machine's
            while True:
                n = sqlapi.purge_sent_messages.value(conn, before=cutoff, batch=batch)
                total += n
                if n < batch:
                    break
        except psycopg.Error as exc:
            raise UserError(f"purge stopped after {total} row(s): {describe_db_error(exc)}") from None
    typer.echo(f"purged {total} sent message(s) sent before {_fmt(cutoff)}")


@outbound.command("reap")
def reap(
    older_than: Annotated[
        Optional[str], typer.Option(help="Also reap rows claimed longer ago than this (default: expired leases only).")
    ] = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Return messages stuck in processing (dead worker) to the queue, flagged possibly sent."""
    seconds = parse_seconds("--older-than", older_than) if older_than is not None else None
    count = _value(database_url, sqlapi.reap_stuck_messages,
                   older_than=timedelta(seconds=seconds) if seconds is not None else None)
    typer.echo(f"reaped {count} message(s)")


@outbound.command("sender")
def sender(
    name: Annotated[str, typer.Argument(help="Sender name used by enqueue_message.")],
    from_address: Annotated[str, typer.Option("--from", help="From address.")],
    host: Annotated[str, typer.Option(help="SMTP relay host.")],
    port: Annotated[int, typer.Option(help="SMTP relay port.")],
    security: Annotated[str, typer.Option(help="none, starttls or tls.")] = "none",
    username: Annotated[Optional[str], typer.Option(help="SMTP login (password: env MAILROOM_SMTP_PASSWORD).")] = None,
    allow_cleartext_login: Annotated[
        bool, typer.Option("--allow-cleartext-login", help="Log in with security none: a relay on this machine only.")
    ] = False,
    bounce_domain: Annotated[
        Optional[str],
        typer.Option(help="Domain of this sender's VERP return paths ('': use the setting outbound.bounce_domain)."),
    ] = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Create or update a sending identity (mailroom.upsert_sender, set_sender_bounce_domain).

    The password is encrypted here to the sender key the database holds (its public half), so it
    never reaches the server; only `mailroom send`, with the private half, can open it."""
    from mailroom.outbound.sealing import seal

    password = os.environ.get("MAILROOM_SMTP_PASSWORD") or None
    sealed = None
    if password is not None:
        keys = _call(database_url, sqlapi.sender_public_key)
        if not keys:
            raise ConfigError("no sender key yet: run `mailroom outbound sender-key init` first")
        sealed = seal(bytes(keys[0]["public_key"]), password)
    sender_id = _value(database_url, sqlapi.upsert_sender, name=name, from_address=from_address, host=host, port=port,
                       security=security, username=username, sealed_password=sealed,
                       allow_cleartext=allow_cleartext_login)
    if bounce_domain is not None:
        _call(database_url, sqlapi.set_sender_bounce_domain, sender=name, domain=bounce_domain or None)
    typer.echo(f"sender {name} saved (id {sender_id})")


sender_key_app = typer.Typer(
    name="sender-key",
    help="The sender keypair that relay passwords are encrypted to: init.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
outbound.add_typer(sender_key_app)


@sender_key_app.command("init")
def sender_key_init(
    out: Annotated[str, typer.Option("--out", help="Where to write the private key (MAILROOM_SENDER_KEY_FILE).")],
    bits: Annotated[int, typer.Option(help="RSA key size: 2048, 3072 or 4096.")] = 3072,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Make a sender keypair: the private half goes to --out (mode 0600; give it to `mailroom send` as
    MAILROOM_SENDER_KEY_FILE), the public half to the database. Relay passwords sealed for an
    earlier key must be set again (or that key kept in MAILROOM_SENDER_KEY_FILE)."""
    from pathlib import Path

    from mailroom.outbound.sealing import generate_keypair

    path = Path(out).expanduser()
    public_key, secret_key = generate_keypair(bits)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise UserError(f"cannot create {path}: {exc.strerror} (it is never overwritten)") from None
    with os.fdopen(fd, "w") as f:
        f.write(secret_key)
    try:
        key_id = _value(database_url, sqlapi.set_sender_public_key, public_key=public_key)
    except UserError:
        path.unlink()
        raise
    typer.echo(f"sender key {key_id}: private half in {path} (MAILROOM_SENDER_KEY_FILE for `mailroom send`), "
               "public half in the database")


@outbound.command("convert-passwords")
def convert_passwords(database_url: DatabaseUrlOption = None) -> None:
    """Once, after upgrading: re-encrypt the relay passwords stored under MAILROOM_ENCRYPTION_KEY to the
    sender key (the one call that sends that key to the server), then forget that key."""
    key = hex_key("MAILROOM_ENCRYPTION_KEY", os.environ.get("MAILROOM_ENCRYPTION_KEY"))
    count = _value(database_url, sqlapi.convert_sender_passwords, old_key=key)
    typer.echo(f"{count} relay password(s) now sealed for the sender key; unset MAILROOM_ENCRYPTION_KEY")


limits_app = typer.Typer(
    name="limits",
    help="Per recipient domain limits (docs/limits.md): set, list, remove, status.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
outbound.add_typer(limits_app)


def _limit(value: Optional[int]) -> str:
    return "no limit" if value is None else str(value)


@limits_app.command("set")
def limits_set(
    pattern: Annotated[str, typer.Argument(metavar="PATTERN", help="*, example.com or *.example.com.")],
    max_in_flight: Annotated[
        Optional[int], typer.Option(help="Messages of one domain in flight at once (default: no limit).")
    ] = None,
    max_per_minute: Annotated[
        Optional[int], typer.Option(help="Messages of one domain claimed per minute (default: no limit).")
    ] = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Create or change the limit of a domain pattern (mailroom.set_domain_limit)."""
    saved = _value(database_url, sqlapi.set_domain_limit, pattern=pattern, max_in_flight=max_in_flight,
                   max_per_minute=max_per_minute)
    typer.echo(
        f"{saved}: max in flight {_limit(max_in_flight)}, max per minute {_limit(max_per_minute)}"
    )


@limits_app.command("list")
def limits_list(database_url: DatabaseUrlOption = None) -> None:
    """Every limit row, the default * last ('-': no limit)."""
    rows = _call(database_url, sqlapi.list_domain_limits)
    _table(rows, ["pattern", "max_in_flight", "max_per_minute", "updated_at"])


@limits_app.command("remove")
def limits_remove(
    pattern: Annotated[str, typer.Argument(metavar="PATTERN")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Remove a pattern's limit (its domains fall back to the next matching pattern; * stays)."""
    removed = _value(database_url, sqlapi.delete_domain_limit, pattern=pattern)
    typer.echo(f"{removed}: removed")


@limits_app.command("status")
def limits_status(
    limit: Annotated[int, typer.Option(help="At most this many domains, busiest first.")] = 100,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Domains with messages in flight, claims this minute or a backoff (mailroom.domain_status)."""
    rows = _call(database_url, sqlapi.domain_status, limit=limit)
    if not rows:
        typer.echo("no domain in flight, counted or backed off")
        return
    _table(rows, ["domain", "pattern", "in_flight", "max_in_flight", "claimed_this_minute", "max_per_minute",
                  "backoff_until", "backoff_level"])


@app.command("send")
def send_command(
    database_url: DatabaseUrlOption = None,
    listen_url: ListenUrlOption = None,
    concurrency: Annotated[int, typer.Option(help="Parallel slots (DB connection + SMTP connections each).")] = 4,
    batch_size: Annotated[int, typer.Option(help="Messages claimed per slot per round trip.")] = 50,
    connections: Annotated[
        int, typer.Option(help="SMTP connections per slot and relay: a claimed batch is sent over them in parallel.")
    ] = 1,
    poll_interval: Annotated[
        str, typer.Option(help="Poll for due messages this often (the only wake-up while LISTEN cannot hear).")
    ] = "1s",
    reap_after: Annotated[
        str, typer.Option(help="Reap rows claimed longer ago than this (and expired leases); 0 disables.")
    ] = "5m",
    lease: Annotated[Optional[str], typer.Option(help="Claim lease (default: setting outbound.lease).")] = None,
    smtp_timeout: Annotated[str, typer.Option(help="Timeout of each SMTP command.")] = "30s",
    shutdown_grace: Annotated[str, typer.Option(help="On SIGTERM, time allowed to finish in-flight SMTP.")] = "5s",
    worker: Annotated[Optional[str], typer.Option(help="Worker name recorded on claims (default host:pid).")] = None,
    metrics_port: Annotated[
        Optional[int], typer.Option(help="Serve Prometheus metrics on this port (0: any free port).")
    ] = None,
    metrics_host: Annotated[str, typer.Option(help="Metrics bind address.")] = "127.0.0.1",
    tls_ca_file: Annotated[
        Optional[str], typer.Option(envvar="MAILROOM_SMTP_CA_FILE", help="CA bundle to verify relay certificates.")
    ] = None,
    until_idle: Annotated[bool, typer.Option(help="Exit once nothing is due (batch jobs, tests).")] = False,
) -> None:
    """Deliver queued outbound messages (env MAILROOM_SENDER_KEY_FILE opens the relay passwords)."""
    if not 1 <= concurrency <= 64:
        raise ConfigError(f"--concurrency must be between 1 and 64, got {concurrency}")
    if not 1 <= batch_size <= 10000:
        raise ConfigError(f"--batch-size must be between 1 and 10000, got {batch_size}")
    if not 1 <= connections <= 64:
        raise ConfigError(f"--connections must be between 1 and 64, got {connections}")
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        raise ConfigError(f"--metrics-port must be between 0 and 65535, got {metrics_port}")
    from mailroom.core.log import get_logger
    from mailroom.outbound.sealing import Unsealer
    from mailroom.outbound.sender import Sender, SenderOptions

    if os.environ.get("MAILROOM_ENCRYPTION_KEY"):
        get_logger("send").warning(
            "WARN: MAILROOM_ENCRYPTION_KEY is set but no longer used: relay passwords are sealed for the sender key "
            "(MAILROOM_SENDER_KEY_FILE); convert them once with `mailroom outbound convert-passwords`, then unset it"
        )
    url = resolve_database_url(database_url)
    opts = SenderOptions(
        url=url,
        listen_url=resolve_listen_url(listen_url, url),
        unsealer=Unsealer.from_env(),
        concurrency=concurrency,
        batch_size=batch_size,
        connections=connections,
        poll_interval=max(0.05, parse_seconds("--poll-interval", poll_interval)),
        reap_after=parse_seconds("--reap-after", reap_after),
        lease=parse_seconds("--lease", lease) if lease else None,
        smtp_timeout=max(0.1, parse_seconds("--smtp-timeout", smtp_timeout)),
        shutdown_grace=parse_seconds("--shutdown-grace", shutdown_grace),
        worker=worker or "",
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        tls_ca_file=tls_ca_file,
        until_idle=until_idle,
    )
    if opts.lease is not None and opts.lease <= 0:
        raise ConfigError("--lease must be positive")
    import asyncio

    asyncio.run(Sender(opts).run())


suppress_app = typer.Typer(
    name="suppress",
    help="The suppression list (admin): add, remove, list, check. Addresses are PII.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

SUPPRESSION_REASONS = ("manual", "complaint", "hard_bounce")


@suppress_app.command("add")
def suppress_add(
    address: Annotated[str, typer.Argument(metavar="ADDRESS")],
    reason: Annotated[str, typer.Option(help="manual, complaint or hard_bounce.")] = "manual",
    expires_in: Annotated[Optional[str], typer.Option(
        "--for", help="Suppress for this long (e.g. 30d, 12h); default: until removed.")] = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Put an address on the suppression list (mailroom.suppress)."""
    if reason not in SUPPRESSION_REASONS:
        raise ConfigError(f"--reason must be one of {', '.join(SUPPRESSION_REASONS)}, got {reason!r}")
    seconds = parse_seconds("--for", expires_in) if expires_in is not None else None
    if seconds is not None and seconds <= 0:
        raise ConfigError("--for must be positive")
    url = resolve_database_url(database_url)
    expires_at = None
    if seconds is not None:  # from mailroom.clock(), never from this machine's clock
        expires_at = _value(url, db_sqlapi.clock) + timedelta(seconds=seconds)
    entry = _value(url, sqlapi.suppress, address=address, reason=reason, expires_at=expires_at)
    typer.echo(f"suppressed (entry {entry})")


@suppress_app.command("remove")
def suppress_remove(
    address: Annotated[str, typer.Argument(metavar="ADDRESS")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Take an address off the suppression list (exit 1 if it was not on it)."""
    if not _value(database_url, sqlapi.unsuppress, address=address):
        raise UserError("the address is not on the suppression list")
    typer.echo("removed")


@suppress_app.command("list")
def suppress_list(
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 100,
    database_url: DatabaseUrlOption = None,
) -> None:
    """The suppression list, newest first (expired entries show active = no until removed)."""
    rows = _call(database_url, sqlapi.list_suppressions, limit=limit)
    if not rows:
        typer.echo("no suppressions")
        return
    _table(rows, ["address", "reason", "active", "source_message", "created_at", "expires_at"])


@suppress_app.command("check")
def suppress_check(
    address: Annotated[str, typer.Argument(metavar="ADDRESS")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Whether enqueue treats the address as suppressed now: prints it, exit 0 if suppressed, 1 if not."""
    if _value(database_url, sqlapi.is_suppressed, address=address):
        typer.echo("suppressed")
        return
    typer.echo("not suppressed")
    raise typer.Exit(1)
