"""`mailroom send` and `mailroom outbound …`: the typer commands of the outbound queue.

`send` runs the sender (mailroom.outbound.sender). Every `outbound` command is one call of a SQL
function (sql/35_outbound_admin.sql, sql/37_outbound_queue.sql); nothing here decides what a state
means. The verbs that change queued mail (hold, release, cancel, delete, run-now, retry) name their
messages one way, IDs, --domain or --all, take --dry-run, and the destructive ones (cancel, delete,
retry, purge) want --yes when they would touch more than one message. Output never contains
addresses, subjects or bodies; `show` prints error_log, which the database has already scrubbed
(mailroom.redact_pii).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Annotated, Any, Optional

import psycopg
import typer

from mailroom.core import eventloop
from mailroom.core.durations import format_age
from mailroom.core.errors import ConfigError, UserError, describe_db_error
from mailroom.core.options import duration_option, env_option, new_app, port_option
from mailroom.core.table import fields, fmt, table
from mailroom.db import sqlapi as db_sqlapi
from mailroom.db.config import DatabaseUrlOption, ListenUrlOption, hex_key, resolve_database_url, resolve_listen_url
from mailroom.db.connect import call_once, connect, print_notice
from mailroom.db.contract import SqlFunction
from mailroom.outbound import sqlapi

app = new_app()

outbound = new_app(
    "outbound",
    "Operate the outbound queue: status, queue, list, show; hold, release, cancel, delete, run-now, retry; "
    "purge, reap, senders, limits.",
)


def _call(database_url: str | None, fn: SqlFunction, **kwargs: Any) -> list[dict[str, Any]]:
    """One contract call on a short-lived connection: its rows as dicts (a value is the column `value`)."""
    rows = call_once(resolve_database_url(database_url), fn, application_name="mailroom-outbound", **kwargs)
    return [r._asdict() if fn.columns else {"value": r[0]} for r in rows]


def _value(database_url: str | None, fn: SqlFunction, **kwargs: Any) -> Any:
    rows = _call(database_url, fn, **kwargs)
    return rows[0]["value"] if rows else None


@outbound.command("status")
def status(database_url: DatabaseUrlOption = None) -> None:
    """The queue's numbers (mailroom.outbound_stats): per status, due now (what a claim would take),
    held back by domain limits, retries waiting, scheduled; then every queue's health
    (mailroom.queue_health) and the workers (mailroom.worker_health)."""
    url = resolve_database_url(database_url)
    row = _call(url, sqlapi.outbound_stats)[0]
    labels = {
        "queued": "queued",
        "due_now": "due now",
        "held_back": "held back by limits",
        "retries_waiting": "retries waiting",
        "scheduled": "scheduled (send_after)",
        "held": "held",
        "processing": "processing",
        "sent": "sent",
        "failed": "failed",
        "cancelled": "cancelled",
        "possibly_sent": "possibly sent (reaped)",
        "oldest_queued_age_seconds": "oldest queued age (s)",
        "stale_outcomes": "stale outcomes ignored",
        "reaped": "reaped",
        "webhook_possible_duplicates": "webhooks possibly delivered twice",
    }
    width = max(len(v) for v in labels.values())
    for key, label in labels.items():
        typer.echo(f"{label.ljust(width)}  {fmt(row[key])}")
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
        table(rows, columns, empty="  none reported a heartbeat")


QUEUE_HEALTH_COLUMNS = ("queue", "due", "oldest_due_age_seconds", "expired_leases")
WORKER_HEALTH_COLUMNS = ("worker", "kind", "state", "listening", "heartbeat_age_seconds", "listener_age_seconds",
                         "last_claim_age_seconds", "claimed")


@outbound.command("queue")
def queue(
    database_url: DatabaseUrlOption = None,
    limit: Annotated[int, typer.Option(min=1, max=10000, metavar="N", help="At most this many domains, most first.")] = 20,
) -> None:
    """The mail waiting, like mailq: totals by status, then by recipient domain (due now, held back by a
    limit or backoff, deferred, scheduled, held, in flight, oldest) (mailroom.outbound_queue)."""
    url = resolve_database_url(database_url)
    s = _call(url, sqlapi.outbound_stats)[0]
    typer.echo(
        f"queued {s['queued']} (due now {s['due_now']}, held back by limits {s['held_back']}, deferred "
        f"{s['retries_waiting']}, scheduled {s['scheduled']}); held {s['held']}; processing {s['processing']}; "
        f"failed {s['failed']}; cancelled {s['cancelled']}; sent {s['sent']}"
    )
    typer.echo(f"oldest queued: {format_age(s['oldest_queued_age_seconds']) if s['queued'] else '-'}")
    rows = _call(url, sqlapi.outbound_queue, limit=limit)
    for r in rows:
        r["oldest"] = format_age(r["oldest_age_seconds"])
        r["domain"] = r["domain"] or "(none)"
    table(rows, ["domain", "queued", "due", "held_back", "deferred", "scheduled", "held", "processing", "oldest",
                 "backoff_until"], empty="no mail waiting")


StatusOption = Annotated[
    Optional[str],
    typer.Option("--status", metavar="STATUS", help="Only messages of this status: queued, held, processing, sent, "
                 "failed or cancelled."),
]
DomainOption = Annotated[
    Optional[str], typer.Option("--domain", metavar="DOMAIN", help="Only messages to this recipient domain.")
]


@outbound.command("list")
def list_messages(
    database_url: DatabaseUrlOption = None,
    status: StatusOption = None,
    domain: DomainOption = None,
    limit: Annotated[int, typer.Option(min=1, max=10000, metavar="N", help="At most this many, newest first.")] = 50,
) -> None:
    """Newest messages (no addresses or subjects)."""
    rows = _call(database_url, sqlapi.list_outbound_messages, status=status, limit=limit, domain=domain)
    table(rows, ["id", "sender", "status", "priority", "attempts", "recipients", "last_smtp_code",
                 "last_enhanced_code", "possibly_sent", "next_retry_at", "created_at", "sent_at"],
          empty="no messages")


@outbound.command("show")
def show(message_id: Annotated[int, typer.Argument(metavar="ID", help="A message id.")],
         database_url: DatabaseUrlOption = None) -> None:
    """One message: state, priority, recipient domain, codes and its (scrubbed) error log."""
    row = _call(database_url, sqlapi.show_outbound_message, id=message_id)[0]
    log = row.pop("error_log")
    fields(row)
    typer.echo("error_log:")
    for line in (log or "-").splitlines():
        typer.echo(f"  {line}")


# -- the verbs ------------------------------------------------------------------------------------

IdsArgument = Annotated[Optional[list[int]], typer.Argument(metavar="ID", help="Message ids.", show_default=False)]
AllOption = Annotated[bool, typer.Option("--all", help="Every message the verb applies to.")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Say what would change; change nothing.")]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do it when it touches more than one message.")]

# the verbs are rows of mailroom.queue_verbs, declared once for the CLI in sqlapi.QUEUE_VERBS (checked
# against the rows): a command each, by the generic shape below unless it has options of its own (retry)
VERBS = {v.command: v for v in sqlapi.QUEUE_VERBS}
DESTRUCTIVE = tuple(v.command for v in sqlapi.QUEUE_VERBS if v.destructive)


def _ids(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)


def _selection(ids: Optional[list[int]], domain: Optional[str], all_: bool) -> dict[str, Any]:
    named = sum((bool(ids), domain is not None, all_))
    if named != 1:
        raise ConfigError("name the messages one way: message IDs, --domain DOMAIN or --all")
    return {"ids": list(ids) if ids else None, "domain": domain, "all": all_}


def confirm(what: str, count: int, yes: bool, dry_run: bool) -> None:
    """A destructive change of more than one message wants --yes (or a yes on a terminal)."""
    if yes or dry_run or count <= 1:
        return
    if sys.stdin.isatty() and sys.stderr.isatty():
        if typer.confirm(f"{what} {count} messages?", default=False, err=True):
            return
        raise UserError("nothing done", exit_code=1)
    raise ConfigError(f"this would {what} {count} messages: add --yes to do it (--dry-run lists them)")


def run_verb(verb: str, database_url: str | None, ids: Optional[list[int]], domain: Optional[str], all_: bool,
             status: Optional[str], dry_run: bool, yes: bool, **extra: Any) -> None:
    """One verb: its dry run first when it may need --yes, then the change; the outcome in a few lines."""
    declared = VERBS[verb]
    fn, done, applies = declared.function, declared.past_tense, ", ".join(declared.from_statuses)
    url = resolve_database_url(database_url)
    selection = _selection(ids, domain, all_)
    args = {**selection, "status": status, **extra}
    if verb in DESTRUCTIVE and not yes and not dry_run and not (ids and len(ids) == 1):
        preview = _call(url, fn, **args, dry_run=True)[0]
        confirm(verb, preview["changed"], yes, dry_run)
    result = _call(url, fn, **args, dry_run=dry_run)[0]
    changed, sample = result["changed"], result["sample_ids"]
    more = f" (ids {_ids(sample)}{', …' if changed > len(sample) else ''})" if sample else ""
    if dry_run:
        typer.echo(f"dry run: would leave {changed} message(s) {done}{more}; nothing changed")
    else:
        typer.echo(f"{changed} message(s) {done}{more}")
    if changed == 0 and not result["in_flight"] and not result["suppressed"]:
        typer.echo(f"  ({verb} applies to {applies} messages)", err=True)
    if result["in_flight"]:
        typer.echo(f"{result['in_flight']} message(s) being delivered were left alone", err=True)
    if result["suppressed"]:
        listed = _ids(result["suppressed_ids"]) + (", …" if result["suppressed"] > len(result["suppressed_ids"]) else "")
        if extra.get("include_suppressed"):
            typer.echo(f"mailroom: warning: {result['suppressed']} message(s) have a recipient on the suppression list "
                       f"now and were queued anyway (ids {listed})", err=True)
        else:
            typer.echo(f"mailroom: warning: {result['suppressed']} message(s) have a recipient on the suppression list "
                       f"now and were not retried (ids {listed}); --include-suppressed sends them anyway", err=True)


def _verb_command(verb: sqlapi.QueueVerb) -> None:
    """`mailroom outbound COMMAND` for a verb without options of its own: IDs | --domain | --all,
    --status, --dry-run, and --yes when it is destructive; its help is the verb's description."""
    if verb.destructive:
        def command(ids: IdsArgument = None, domain: DomainOption = None, all_: AllOption = False,
                    status: StatusOption = None, dry_run: DryRunOption = False, yes: YesOption = False,
                    database_url: DatabaseUrlOption = None) -> None:
            run_verb(verb.command, database_url, ids, domain, all_, status, dry_run, yes)
    else:
        def command(ids: IdsArgument = None, domain: DomainOption = None, all_: AllOption = False,  # type: ignore[misc]
                    status: StatusOption = None, dry_run: DryRunOption = False,
                    database_url: DatabaseUrlOption = None) -> None:
            run_verb(verb.command, database_url, ids, domain, all_, status, dry_run, True)
    command.__name__ = verb.command.replace("-", "_")
    outbound.command(verb.command, help=verb.description)(command)


for _verb in sqlapi.QUEUE_VERBS:
    if _verb.command != "retry":  # its own command below (--all-failed, --include-suppressed)
        _verb_command(_verb)


@outbound.command("retry", help=VERBS["retry"].description)
def retry(
    ids: IdsArgument = None,
    domain: DomainOption = None,
    all_: AllOption = False,
    all_failed: Annotated[bool, typer.Option("--all-failed", help="Every failed message (--all --status failed).")] = False,
    status: StatusOption = None,
    include_suppressed: Annotated[
        bool, typer.Option("--include-suppressed", help="Also messages with a recipient on the suppression list now.")
    ] = False,
    dry_run: DryRunOption = False,
    yes: YesOption = False,
    database_url: DatabaseUrlOption = None,
) -> None:
    if all_failed:
        if all_ or ids or domain is not None or status not in (None, "failed"):
            raise ConfigError("--all-failed is --all --status failed: give no IDs, --domain, --all or other --status")
        all_, status = True, "failed"
    run_verb("retry", database_url, ids, domain, all_, status, dry_run, yes, include_suppressed=include_suppressed)


@outbound.command("purge")
def purge(
    sent_before: Annotated[float, duration_option("--sent-before", help="Delete sent messages sent longer ago than this "
                                                  "(e.g. 7d, 12h; 0: every sent message).")],
    batch: Annotated[int, typer.Option(min=1, max=100000, metavar="N", help="Rows deleted per transaction.")] = 5000,
    dry_run: DryRunOption = False,
    yes: YesOption = False,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Delete sent messages older than --sent-before, in batches (short transactions), with progress on a terminal."""
    from mailroom.core.progress import Progress

    url = resolve_database_url(database_url)
    total = 0
    with connect(url, application_name="mailroom-outbound") as conn:
        conn.add_notice_handler(print_notice)
        try:
            cutoff = db_sqlapi.clock.value(conn) - timedelta(seconds=sent_before)  # the database's clock
            count = sqlapi.purge_sent_messages.value(conn, before=cutoff, batch=batch, dry_run=True)
            if dry_run:
                typer.echo(f"dry run: would purge {count} sent message(s) sent before {fmt(cutoff)}; nothing changed")
                return
            confirm("purge", count, yes, dry_run)
            with Progress("purging sent messages", total=count) as progress:
                while True:
                    n = sqlapi.purge_sent_messages.value(conn, before=cutoff, batch=batch)
                    total += n
                    progress.update(total)
                    if n < batch:
                        break
        except psycopg.Error as exc:
            raise UserError(f"purge stopped after {total} row(s): {describe_db_error(exc)}") from None
    typer.echo(f"purged {total} sent message(s) sent before {fmt(cutoff)}")


@outbound.command("reap")
def reap(
    older_than: Annotated[Optional[float], duration_option(
        "--older-than", help="Also reap rows claimed longer ago than this (default: expired leases only).")] = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Return messages stuck in processing (dead worker) to the queue, flagged possibly sent."""
    count = _value(database_url, sqlapi.reap_stuck_messages,
                   older_than=timedelta(seconds=older_than) if older_than is not None else None)
    typer.echo(f"reaped {count} message(s)")


@outbound.command("sender")
def sender(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Sender name used by enqueue_message.")],
    from_address: Annotated[str, typer.Option("--from", metavar="ADDRESS", help="From address.")],
    host: Annotated[str, typer.Option(metavar="HOST", help="SMTP relay host.")],
    port: Annotated[int, port_option("--port", env=None, help="SMTP relay port.")],
    security: Annotated[str, typer.Option(metavar="MODE", help="none, starttls or tls.")] = "none",
    username: Annotated[Optional[str], typer.Option(
        metavar="USER", help="SMTP login (password: env MAILROOM_SMTP_PASSWORD).")] = None,
    allow_cleartext_login: Annotated[
        bool, typer.Option("--allow-cleartext-login", help="Log in with security none: a relay on this machine only.")
    ] = False,
    bounce_domain: Annotated[
        Optional[str],
        typer.Option(metavar="DOMAIN",
                     help="Domain of this sender's VERP return paths ('': use the setting outbound.bounce_domain)."),
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


sender_key_app = new_app("sender-key", "The sender keypair that relay passwords are encrypted to: init.")
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


dkim_app = new_app("dkim", "DKIM signing per From domain (docs/deliverability.md): keygen, list, remove.")
outbound.add_typer(dkim_app)


def _txt_record(name: str, value: str) -> str:
    """A zone file line: the value in quoted strings of at most 255 characters (RFC 7208 3.3 style)."""
    chunks = " ".join(f'"{value[i:i + 255]}"' for i in range(0, len(value), 255))
    return f"{name}. IN TXT ( {chunks} )"


@dkim_app.command("keygen")
def dkim_keygen(
    sender: Annotated[str, typer.Argument(metavar="SENDER", help="The sender whose From domain signs.")],
    selector: Annotated[str, typer.Option("--selector", metavar="S", help="The DKIM selector (s=), e.g. mr2030.")],
    key_file: Annotated[Optional[str], env_option(
        "--key-file", env="MAILROOM_DKIM_KEY_FILE",
        help="The senders' DKIM key file: the private key is appended (created 0600).", metavar="FILE")] = None,
    bits: Annotated[int, typer.Option(help="RSA key size: 1024, 2048, 3072 or 4096.")] = 2048,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Make a DKIM key for SENDER's From domain: the private half is appended to --key-file (give it to
    `mailroom send` as MAILROOM_DKIM_KEY_FILE), the selector and public half go to the database
    (mailroom.set_dkim_key), and the DNS TXT record to publish is printed. Publish it before the
    senders restart with the new file: mail is signed from the next claim on."""
    from pathlib import Path

    from mailroom.outbound.dkim import append_key, generate_key, public_record_key

    if not key_file:
        raise ConfigError("--key-file (or MAILROOM_DKIM_KEY_FILE) is required: where the senders read their DKIM keys")
    path = Path(key_file).expanduser()
    private = generate_key(bits)
    rows = _call(database_url, sqlapi.set_dkim_key, sender=sender, selector=selector,
                 public_key=public_record_key(private), algorithm="rsa-sha256")
    try:
        append_key(path, private)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror} (the database already has the new public key: "
                        "run keygen again)") from None
    row = rows[0]
    typer.echo(f"; DKIM key of {row['domain']}, selector {row['selector']}: private half appended to {path}")
    typer.echo(_txt_record(row["dns_name"], row["dns_value"]))


@dkim_app.command("list")
def dkim_list(database_url: DatabaseUrlOption = None) -> None:
    """The DKIM keys by domain and the TXT record each needs (mailroom.list_dkim_keys)."""
    rows = _call(database_url, db_sqlapi.list_dkim_keys)
    for row in rows:
        typer.echo(f"{row['domain']}\t{row['selector']}\t{row['algorithm']}\t{row['created_at']:%Y-%m-%d}")
        typer.echo("  " + _txt_record(row["dns_name"], row["dns_value"]))
    if not rows:
        typer.echo("no DKIM key: make one with `mailroom outbound dkim keygen SENDER --selector S`")


@dkim_app.command("remove")
def dkim_remove(
    domain: Annotated[str, typer.Argument(metavar="DOMAIN", help="The From domain.")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Stop signing DOMAIN's mail (mailroom.delete_dkim_key); the private key stays in the file."""
    _call(database_url, sqlapi.delete_dkim_key, domain=domain)
    typer.echo("removed")


@outbound.command("convert-passwords")
def convert_passwords(database_url: DatabaseUrlOption = None) -> None:
    """Once, after upgrading: re-encrypt the relay passwords stored under MAILROOM_ENCRYPTION_KEY to the
    sender key (the one call that sends that key to the server), then forget that key."""
    key = hex_key("MAILROOM_ENCRYPTION_KEY", os.environ.get("MAILROOM_ENCRYPTION_KEY"))
    count = _value(database_url, sqlapi.convert_sender_passwords, old_key=key)
    typer.echo(f"{count} relay password(s) now sealed for the sender key; unset MAILROOM_ENCRYPTION_KEY")


@outbound.command("senders")
def senders(database_url: DatabaseUrlOption = None) -> None:
    """Every sending identity: relay, security, username, whether a password is stored (never the password),
    bounce domain, messages waiting (mailroom.list_senders)."""
    rows = _call(database_url, sqlapi.list_senders)
    table(rows, ["name", "from_address", "smtp_host", "smtp_port", "smtp_security", "smtp_username", "password_set",
                 "bounce_domain", "queued"], headers=["name", "from", "host", "port", "security", "username",
                                                       "password", "bounce_domain", "queued"],
          empty="no sender: create one with `mailroom outbound sender NAME --from … --host … --port …`")


limits_app = new_app("limits", "Per recipient domain limits (docs/limits.md): set, list, remove, status.")
outbound.add_typer(limits_app)


def _limit(value: Optional[int]) -> str:
    return "no limit" if value is None else str(value)


@limits_app.command("set")
def limits_set(
    pattern: Annotated[str, typer.Argument(metavar="PATTERN", help="*, example.com or *.example.com.")],
    max_in_flight: Annotated[
        Optional[int], typer.Option(min=1, metavar="N", help="Messages of one domain in flight at once (default: no limit).")
    ] = None,
    max_per_minute: Annotated[
        Optional[int], typer.Option(min=1, metavar="N", help="Messages of one domain claimed per minute (default: no limit).")
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
    table(rows, ["pattern", "max_in_flight", "max_per_minute", "updated_at"])


@limits_app.command("remove")
def limits_remove(
    pattern: Annotated[str, typer.Argument(metavar="PATTERN", help="A pattern of `outbound limits list`.")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Remove a pattern's limit (its domains fall back to the next matching pattern; * stays)."""
    removed = _value(database_url, sqlapi.delete_domain_limit, pattern=pattern)
    typer.echo(f"{removed}: removed")


@limits_app.command("status")
def limits_status(
    limit: Annotated[int, typer.Option(min=1, max=10000, metavar="N", help="At most this many domains, busiest first.")] = 100,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Domains with messages in flight, claims this minute or a backoff (mailroom.domain_status)."""
    rows = _call(database_url, sqlapi.domain_status, limit=limit)
    table(rows, ["domain", "pattern", "in_flight", "max_in_flight", "claimed_this_minute", "max_per_minute",
                 "backoff_until", "backoff_level"], empty="no domain in flight, counted or backed off")


def _send_opt(flag: str, help: str, **kwargs: Any) -> Any:  # noqa: A002
    return env_option(flag, env="MAILROOM_SEND_" + flag.lstrip("-").replace("-", "_").upper(), help=help, **kwargs)


def _send_duration(flag: str, help: str, **kwargs: Any) -> Any:  # noqa: A002
    return duration_option(flag, env="MAILROOM_SEND_" + flag.lstrip("-").replace("-", "_").upper(), help=help, **kwargs)


@app.command("send")
def send_command(
    database_url: DatabaseUrlOption = None,
    listen_url: ListenUrlOption = None,
    concurrency: Annotated[int, _send_opt("--concurrency", "Parallel slots (DB connection + SMTP connections each).",
                                          min=1, max=64, metavar="N")] = 4,
    batch_size: Annotated[int, _send_opt("--batch-size", "Messages claimed per slot per round trip.",
                                         min=1, max=10000, metavar="N")] = 50,
    connections: Annotated[int, _send_opt(
        "--connections", "SMTP connections per slot and relay: a claimed batch is sent over them in parallel.",
        min=1, max=64, metavar="N")] = 1,
    poll_interval: Annotated[float, _send_duration(
        "--poll-interval", "Poll for due messages this often (the only wake-up while LISTEN cannot hear).",
        minimum=0.05)] = "1s",
    reap_after: Annotated[float, _send_duration(
        "--reap-after", "Reap rows claimed longer ago than this (and expired leases); 0 disables.")] = "5m",
    lease: Annotated[Optional[float], _send_duration(
        "--lease", "Claim lease (default: setting outbound.lease).", positive=True)] = None,
    smtp_timeout: Annotated[float, _send_duration("--smtp-timeout", "Timeout of each SMTP command.",
                                                  minimum=0.1)] = "30s",
    shutdown_grace: Annotated[float, _send_duration(
        "--shutdown-grace", "On SIGTERM, time allowed to finish in-flight SMTP.")] = "5s",
    worker: Annotated[Optional[str], _send_opt(
        "--worker", "Worker name recorded on claims and heartbeats (default host:pid).", metavar="NAME")] = None,
    metrics_port: Annotated[Optional[int], port_option(
        "--metrics-port", env="MAILROOM_SEND_METRICS_PORT",
        help="Serve Prometheus metrics on this port (0: any free port).")] = None,
    metrics_host: Annotated[str, _send_opt("--metrics-host", "Metrics bind address.", metavar="HOST")] = "127.0.0.1",
    tls_ca_file: Annotated[Optional[str], env_option(
        "--tls-ca-file", env="MAILROOM_SMTP_CA_FILE", help="CA bundle to verify relay certificates.",
        metavar="FILE")] = None,
    until_idle: Annotated[bool, _send_opt("--until-idle", "Exit once nothing is due (batch jobs, tests).")] = False,
    pipelining: Annotated[bool, env_option(
        "--pipelining/--no-pipelining", env="MAILROOM_SEND_PIPELINING",
        help="Send MAIL FROM, RCPT TO and DATA in one write where the relay offers PIPELINING (RFC 2920).")] = True,
    webhook_allow: Annotated[Optional[list[str]], _send_opt(
        "--webhook-allow", "A network webhook endpoints may be on past the SSRF guard (CIDR, e.g. 127.0.0.1/32; "
        "repeatable; default: public addresses only).", metavar="CIDR")] = None,
    webhook_timeout: Annotated[float, _send_duration(
        "--webhook-timeout", "Time allowed to one webhook request, answer included.", minimum=0.1)] = "10s",
    workers: Annotated[int, _send_opt(
        "--workers", "Sender processes, forked from this one and sharing its imports and keys: one a core "
        "(each has --concurrency slots; --worker NAME gets -1, -2, ...; metrics on consecutive ports).",
        min=1, max=64, metavar="N")] = 1,
    event_loop: Annotated[str, _send_opt("--event-loop", eventloop.HELP, metavar="LOOP")] = "auto",
) -> None:
    """Deliver queued outbound messages (env MAILROOM_SENDER_KEY_FILE opens the relay passwords,
    MAILROOM_DKIM_KEY_FILE holds the DKIM private keys)."""
    from mailroom.core.log import get_logger
    from mailroom.outbound.dkim import Signer
    from mailroom.outbound.sealing import Unsealer
    from mailroom.outbound.sender import Sender, SenderOptions

    if os.environ.get("MAILROOM_ENCRYPTION_KEY"):
        get_logger("send").warning(
            "WARN: MAILROOM_ENCRYPTION_KEY is set but no longer used: relay passwords are sealed for the sender key "
            "(MAILROOM_SENDER_KEY_FILE); convert them once with `mailroom outbound convert-passwords`, then unset it"
        )
    from mailroom.db.keyring import check_at_start, env_fingerprint

    new_loop = eventloop.factory(event_loop)  # a bad choice is one line and exit 2 before anything starts
    fingerprint = env_fingerprint()  # MAILROOM_SECRET_KEY set: it must be the active signing key (exit 2 if not)
    url = resolve_database_url(database_url)
    check_at_start(url, "send", fingerprint)
    opts = SenderOptions(
        url=url,
        key_fingerprint=fingerprint,
        listen_url=resolve_listen_url(listen_url, url),
        unsealer=Unsealer.from_env(),
        dkim=Signer.from_env(),
        concurrency=concurrency,
        batch_size=batch_size,
        connections=connections,
        poll_interval=poll_interval,
        reap_after=reap_after,
        lease=lease,
        smtp_timeout=smtp_timeout,
        shutdown_grace=shutdown_grace,
        worker=worker or "",
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        tls_ca_file=tls_ca_file,
        until_idle=until_idle,
        pipelining=pipelining,
        webhooks=_webhook_policy(webhook_allow or [], webhook_timeout),
    )
    if workers > 1:
        from mailroom.outbound.workers import supervise

        code = supervise(opts, workers, new_loop)
        if code:
            raise typer.Exit(code)
        return
    eventloop.run(Sender(opts).run(), new_loop)


def _webhook_policy(networks: list[str], timeout: float) -> Any:
    from mailroom.outbound.webhooks import WebhookPolicy

    try:
        return WebhookPolicy.from_flags([n for value in networks for n in value.split(",") if n.strip()], timeout)
    except ValueError as exc:
        raise ConfigError(f"--webhook-allow: {exc}") from None


webhook_app = new_app(
    "webhook", "Webhook endpoints (docs/webhooks.md): add, list, remove; a delivery's attempts, replay.",
)

WEBHOOK_EVENTS = "message.received, inbox.expired (an API key's); message.sent, message.failed, message.bounced (a sender's)"


@webhook_app.command("add")
def webhook_add(
    url: Annotated[str, typer.Argument(metavar="URL", help="The endpoint: an http or https URL.")],
    events: Annotated[list[str], typer.Option("--event", metavar="EVENT", help=f"Repeatable: {WEBHOOK_EVENTS}.")],
    key_id: Annotated[Optional[int], typer.Option("--key-id", metavar="ID",
                                                  help="The API key (`mailroom apikey list`) whose owner's inboxes.")] = None,
    sender: Annotated[Optional[str], typer.Option("--sender", metavar="NAME", help="The sender whose mail.")] = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Register an endpoint (mailroom.add_webhook); its whsec_ secret is printed once, never stored in the clear."""
    row = _call(database_url, sqlapi.add_webhook, url=url, events=[e for v in events for e in v.split(",") if e.strip()],
                key_id=key_id, sender=sender)[0]
    typer.echo(f"webhook endpoint {row['id']}")
    typer.echo(f"secret: {row['secret']}")
    typer.echo("(shown once: the endpoint verifies webhook-signature with it; mailroom keeps it sealed for the sender key)",
               err=True)


@webhook_app.command("list")
def webhook_list(
    key_id: Annotated[Optional[int], typer.Option("--key-id", metavar="ID", help="Only this API key's.")] = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """The endpoints (never their secrets), with their deliveries queued."""
    rows = _call(database_url, sqlapi.list_webhooks, key_id=key_id)
    for r in rows:
        r["events"] = ",".join(r["events"])
    table(rows, ["id", "key_id", "owner_id", "sender", "url", "events", "queued", "created_at"],
          empty="no webhook endpoint: add one with `mailroom webhook add URL --event … --key-id ID`")


@webhook_app.command("remove")
def webhook_remove(
    endpoint: Annotated[int, typer.Argument(metavar="ID", help="An endpoint of `webhook list`.")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Remove an endpoint and its secret (its queued deliveries fail at their next claim)."""
    _call(database_url, sqlapi.remove_webhook, id=endpoint)
    typer.echo(f"webhook endpoint {endpoint} removed")


@webhook_app.command("attempts")
def webhook_attempts(
    endpoint: Annotated[int, typer.Argument(metavar="ID", help="An endpoint of `webhook list`.")],
    limit: Annotated[int, typer.Option(min=1, max=1000, metavar="N", help="At most this many, newest first.")] = 20,
    database_url: DatabaseUrlOption = None,
) -> None:
    """An endpoint's deliveries, newest first, each with its attempts (the log SQL keeps, redacted)."""
    rows = _call(database_url, sqlapi.webhook_deliveries, endpoint_id=endpoint, limit=limit)
    table(rows, ["id", "event", "webhook_id", "status", "attempts", "possibly_sent", "last_status", "next_retry_at",
                 "created_at"], empty="no delivery yet")
    for r in rows:
        if r["attempt_log"]:
            typer.echo(f"\n{r['id']} ({r['webhook_id']}):")
            typer.echo("  " + r["attempt_log"].replace("\n", "\n  "))


@webhook_app.command("replay")
def webhook_replay(
    delivery: Annotated[int, typer.Argument(metavar="DELIVERY", help="A delivery id of `webhook attempts`.")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Send a delivery again: queued, due now, attempts from 0, the same webhook-id."""
    _value(database_url, sqlapi.replay_webhook, delivery_id=delivery)
    typer.echo(f"webhook delivery {delivery} queued again")


suppress_app = new_app("suppress", "The suppression list (admin): add, remove, list, check. Addresses are PII.")

SUPPRESSION_REASONS = ("manual", "complaint", "hard_bounce")  # an operator's; unsubscribe comes from the recipient
AddressArgument = Annotated[str, typer.Argument(metavar="ADDRESS", help="An email address.")]


@suppress_app.command("add")
def suppress_add(
    address: AddressArgument,
    reason: Annotated[str, typer.Option(metavar="REASON", help="manual, complaint or hard_bounce.")] = "manual",
    expires_in: Annotated[Optional[float], duration_option(
        "--for", help="Suppress for this long (e.g. 30d, 12h); default: until removed.", positive=True)] = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Put an address on the suppression list (mailroom.suppress)."""
    if reason not in SUPPRESSION_REASONS:
        raise ConfigError(f"--reason must be one of {', '.join(SUPPRESSION_REASONS)}, got {reason!r}")
    url = resolve_database_url(database_url)
    expires_at = None
    if expires_in is not None:  # from mailroom.clock(), never from this machine's clock
        expires_at = _value(url, db_sqlapi.clock) + timedelta(seconds=expires_in)
    entry = _value(url, sqlapi.suppress, address=address, reason=reason, expires_at=expires_at)
    typer.echo(f"suppressed (entry {entry})")


@suppress_app.command("remove")
def suppress_remove(address: AddressArgument, database_url: DatabaseUrlOption = None) -> None:
    """Take an address off the suppression list (exit 1 if it was not on it)."""
    if not _value(database_url, sqlapi.unsuppress, address=address):
        raise UserError("the address is not on the suppression list")
    typer.echo("removed")


@suppress_app.command("list")
def suppress_list(
    limit: Annotated[int, typer.Option(min=1, max=10000, metavar="N", help="At most this many, newest first.")] = 100,
    database_url: DatabaseUrlOption = None,
) -> None:
    """The suppression list, newest first (expired entries show active = no until removed)."""
    rows = _call(database_url, sqlapi.list_suppressions, limit=limit)
    table(rows, ["address", "reason", "active", "source_message", "created_at", "expires_at"], empty="no suppressions")


@suppress_app.command("check")
def suppress_check(address: AddressArgument, database_url: DatabaseUrlOption = None) -> None:
    """Whether enqueue treats the address as suppressed now: prints it, exit 0 if suppressed, 1 if not."""
    if _value(database_url, sqlapi.is_suppressed, address=address):
        typer.echo("suppressed")
        return
    typer.echo("not suppressed")
    raise typer.Exit(1)
