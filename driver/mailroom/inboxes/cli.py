"""`mailroom inbox …` and `mailroom expire`: the typer commands of the expiring inboxes.

Each `inbox` command is one call of the SQL API (create_mailbox, list_messages, read_message,
extend_mailbox, delete_mailbox; `inbox tag`: mark_message, `inbox clear`: delete_inbox_messages;
`inbox fault set/clear/show`: set_inbox_fault, clear_inbox_fault, inbox_fault); `inbox serve` runs
mailroom.inboxes.server.InboundServer and
`expire` runs mailroom.inboxes.expiry.ExpiryWorker.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Annotated, Any, Optional

import typer

from mailroom.core import eventloop
from mailroom.core.durations import Duration
from mailroom.core.errors import ConfigError
from mailroom.core.options import duration_option, env_option, new_app, port_option
from mailroom.db.config import DatabaseUrlOption, ListenUrlOption, resolve_database_url, resolve_listen_url
from mailroom.db.connect import call_once
from mailroom.db.contract import SqlFunction
from mailroom.inboxes import sqlapi

app = new_app()

inbox_app = new_app("inbox", "Expiring inboxes: the inbound SMTP server and inbox management.")

TokenOption = Annotated[
    Optional[str],
    env_option("--token", env="MAILROOM_SESSION_TOKEN", metavar="TOKEN", help="Session token of an anonymous inbox."),
]
OwnerTypeOption = Annotated[
    Optional[str], typer.Option("--owner-type", metavar="TYPE", help="Owner type for api/mcp inboxes (api or mcp).")
]
OwnerIdOption = Annotated[Optional[str], typer.Option("--owner-id", metavar="ID", help="Owner id for api/mcp inboxes.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
AddressArgument = Annotated[str, typer.Argument(metavar="ADDRESS", help="Inbox address.")]


def _minutes(flag: str, seconds: float) -> int:
    """A duration the SQL API takes in whole minutes."""
    if seconds <= 0 or seconds % 60:
        raise ConfigError(f"{flag} must be a positive whole number of minutes (30m, 2h, 7d), got {seconds:g}s")
    return int(seconds // 60)


def _db_call(url: str, fn: SqlFunction, **kwargs: Any) -> list[Any]:
    return call_once(url, fn, application_name="mailroom-inbox", **kwargs)


def _print(obj: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(obj, default=str))
        return
    for key, value in obj.items():
        if value is not None:
            print(f"{key}: {value}")


def _serve_opt(flag: str, help: str, **kwargs: Any) -> Any:  # noqa: A002
    return env_option(flag, env="MAILROOM_INBOX_" + flag.lstrip("-").replace("-", "_").upper(), help=help, **kwargs)


def _host_port(value: str) -> tuple[str, int]:
    """HOST:PORT (an IPv6 HOST in brackets) of --submission."""
    host, sep, port = value.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"--submission must be HOST:PORT (port 0 to 65535), got {value!r}")
    return host, int(port)


@inbox_app.command("serve")
def serve_cmd(
    database_url: DatabaseUrlOption = None,
    host: Annotated[str, _serve_opt("--host", "Address to listen on.", metavar="HOST")] = "127.0.0.1",
    port: Annotated[int, port_option("--port", env="MAILROOM_INBOX_PORT",
                                     help="TCP port to listen on (0: any free port).")] = 2525,
    max_recipients: Annotated[int, _serve_opt("--max-recipients", "RCPT TO per message; more get 452.", min=1,
                                              metavar="N")] = 100,
    max_bad_recipients: Annotated[int, _serve_opt(
        "--max-bad-recipients", "Unknown recipients a connection may send; its next RCPT gets 421 and a hang-up.",
        min=1, metavar="N")] = 10,
    max_sessions: Annotated[int, _serve_opt(
        "--max-sessions", "Connections at once; more get 421 and are closed at once.", min=1, metavar="N")] = 100,
    max_sessions_per_client: Annotated[int, _serve_opt(
        "--max-sessions-per-client", "Connections at once from one client address (of each worker); more get 421.",
        min=1, metavar="N")] = 10,
    idle_timeout: Annotated[float, duration_option(
        "--idle-timeout", env="MAILROOM_INBOX_IDLE_TIMEOUT", positive=True,
        help="How long a client may stay silent (also bounds one DATA transfer).")] = "5m",
    db_timeout: Annotated[float, duration_option(
        "--db-timeout", env="MAILROOM_INBOX_DB_TIMEOUT", minimum=0.1, maximum=60,
        help="Longest a database call of an SMTP command may take (a free connection included); then 451.")] = "5s",
    max_line_length: Annotated[int, _serve_opt("--max-line-length", "Longest line in octets, CRLF excluded.", min=1,
                                               metavar="N")] = 1000,
    max_message_size: Annotated[Optional[int], _serve_opt(
        "--max-message-size", "SIZE to advertise, in bytes (default: the largest plan limit).", min=1,
        metavar="BYTES")] = None,
    pool_size: Annotated[int, _serve_opt("--pool-size", "Database connections (of each worker).", min=1,
                                         metavar="N")] = 4,
    workers: Annotated[int, _serve_opt(
        "--workers", "Server processes on the one port (SO_REUSEPORT), each with its own pool.", min=1, max=64,
        metavar="N")] = 1,
    metrics_port: Annotated[Optional[int], port_option(
        "--metrics-port", env="MAILROOM_INBOX_METRICS_PORT",
        help="Serve Prometheus metrics on this port (0: any free port; with --workers N, N ports from it).")] = None,
    metrics_host: Annotated[str, _serve_opt("--metrics-host", "Metrics bind address.", metavar="HOST")] = "127.0.0.1",
    tls_cert: Annotated[Optional[str], _serve_opt(
        "--tls-cert", "PEM certificate chain for STARTTLS (advertised in EHLO when given; with --tls-key).",
        metavar="FILE")] = None,
    tls_key: Annotated[Optional[str], _serve_opt("--tls-key", "PEM private key of --tls-cert.", metavar="FILE")] = None,
    require_tls: Annotated[bool, _serve_opt(
        "--require-tls", "Refuse MAIL, RCPT and DATA before STARTTLS (530 5.7.0).")] = False,
    submission: Annotated[Optional[str], _serve_opt(
        "--submission", "Also listen on HOST:PORT for apps' mail: SMTP AUTH required there (smtpcred create); "
        "a non-loopback HOST needs --tls-cert.", metavar="HOST:PORT")] = None,
    log_every: Annotated[float, duration_option(
        "--log-every", env="MAILROOM_INBOX_LOG_EVERY", minimum=0.1, maximum=86400,
        help="How often to log one summary line of what was stored and refused (none while idle).")] = "60s",
    log_messages: Annotated[bool, _serve_opt(
        "--log-messages", "Also log a line per message and per refused recipient (slower; for debugging).")] = False,
    event_loop: Annotated[str, _serve_opt("--event-loop", eventloop.HELP, metavar="LOOP")] = "auto",
    sink: Annotated[bool, _serve_opt(
        "--sink", "The sink for development and CI: accept every recipient at every domain, each an inbox made "
        "at RCPT (plan sink; docs/inboxes.md). Off by default.")] = False,
) -> None:
    """Run the inbound SMTP server that stores mail for open inboxes."""
    import logging

    from mailroom.inboxes.server import InboundServer

    new_loop = eventloop.factory(event_loop)  # a bad choice is one line and exit 2 before anything starts
    url = resolve_database_url(database_url)
    sub = _host_port(submission) if submission is not None else None
    if sub is not None and workers > 1 and sub[1] == 0:
        raise ConfigError("--submission with --workers needs a port (not 0): every worker listens on it")

    if tls_cert is not None or tls_key is not None or require_tls:
        from mailroom.inboxes.server import tls_context

        if tls_cert is None and tls_key is None:
            raise ConfigError("--require-tls needs --tls-cert and --tls-key")
        if tls_cert is None or tls_key is None:
            raise ConfigError("--tls-cert and --tls-key go together")
        tls_context(tls_cert, tls_key)  # a bad file is one line and exit 2 before anything starts
    logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd logs addresses at INFO
    if log_messages:
        from mailroom.core.log import get_logger

        get_logger("inbox").setLevel(logging.DEBUG)

    def run(bind_port: int, ready: Any = None, reuse_port: bool = False, worker_index: int = 0) -> None:
        server = InboundServer(
            url, host=host, port=bind_port, max_recipients=max_recipients, max_bad_recipients=max_bad_recipients,
            max_sessions=max_sessions, max_sessions_per_client=max_sessions_per_client,
            idle_timeout=idle_timeout, max_line_length=max_line_length,
            pool_size=pool_size, data_size_limit=max_message_size, reuse_port=reuse_port, db_timeout=db_timeout,
            metrics_port=None if metrics_port is None else (metrics_port + worker_index if metrics_port else 0),
            metrics_host=metrics_host, tls_cert=tls_cert, tls_key=tls_key, require_tls=require_tls,
            log_every=log_every, sink=sink, submission=sub,
        )

        async def main() -> None:
            server.astop_on_signals()
            await server.run(ready)

        eventloop.run(main(), new_loop)

    if workers == 1:
        run(port)
        return
    from mailroom.inboxes.workers import supervise

    code = supervise(lambda bind_port, ready, index: run(bind_port, ready, reuse_port=True, worker_index=index),
                     workers, host, port)
    if code:
        raise typer.Exit(code)


@inbox_app.command("create")
def create_cmd(
    database_url: DatabaseUrlOption = None,
    plan: Annotated[str, typer.Option(metavar="PLAN", help="A plan of `mailroom plans` (free, pro, enterprise).")] = "free",
    ttl: Annotated[Optional[float], duration_option(
        "--ttl", help="How long it lives, whole minutes (30m, 2h; default: the plan's; the plan's maximum at most).")
    ] = None,
    owner_type: Annotated[str, typer.Option("--owner-type", metavar="TYPE", help="anonymous, api or mcp.")] = "anonymous",
    owner_id: OwnerIdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create an inbox; prints its address, expires_at and (anonymous) session token."""
    url = resolve_database_url(database_url)
    minutes = _minutes("--ttl", ttl) if ttl is not None else None
    rows = _db_call(url, sqlapi.create_mailbox, ttl_minutes=minutes, plan=plan, owner_type=owner_type, owner_id=owner_id)
    mailbox_id, address, expires_at, token = rows[0]
    _print(
        {"mailbox_id": mailbox_id, "address": address, "expires_at": expires_at.isoformat(),
         "session_token": token},
        as_json,
    )


@inbox_app.command("list")
def list_cmd(
    address: AddressArgument,
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
    limit: Annotated[int, typer.Option(min=1, metavar="N", help="At most this many messages.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """List an inbox's messages (id, received_at, sender, subject)."""
    url = resolve_database_url(database_url)
    rows = _db_call(url, sqlapi.list_messages, address=address, session_token=token, owner_type=owner_type,
                    owner_id=owner_id, limit=limit)
    if as_json:
        for r in rows:
            print(json.dumps({"message_id": r.message_id, "received_at": r.received_at.isoformat(),
                              "envelope_from": r.envelope_from, "subject": r.subject, "is_read": r.is_read,
                              "size_bytes": r.size_bytes}))
        return
    for r in rows:
        print(f"{r.message_id}\t{r.received_at.isoformat()}\t{r.envelope_from}\t{'read' if r.is_read else 'unread'}"
              f"\t{r.subject or ''}")


@inbox_app.command("search")
def search_cmd(
    address: Annotated[str, typer.Argument(metavar="ADDRESS", help="Inbox address.")],
    query: Annotated[str, typer.Argument(
        metavar="QUERY",
        help='Words (prefixes; 3+ characters: inside words), "a phrase", -excluded, or, from: to: subject: is:unread '
             'is:read has:attachment tag: before:/after:YYYY-MM-DD (docs/inboxes.md#search); after -- when it starts with -.',
    )],
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
    limit: Annotated[int, typer.Option(help="At most this many messages.")] = 50,
    as_json: JsonOption = False,
) -> None:
    """Search an inbox's messages (subject, from, text, qualifiers): every match up to --limit, best first."""
    from mailroom.db.connect import call_once
    from mailroom.inboxes import sqlapi

    rows = call_once(resolve_database_url(database_url), sqlapi.search_messages, application_name="mailroom-inbox",
                     address=address, session_token=token, query=query, owner_type=owner_type, owner_id=owner_id,
                     limit=limit)
    for r in rows:
        if as_json:
            print(json.dumps({"message_id": r.message_id, "received_at": r.received_at.isoformat(),
                              "from": r.from_header, "subject": r.subject, "rank": r.rank}))
        else:
            print(f"{r.message_id}\t{r.received_at.isoformat()}\t{r.from_header or ''}\t{r.subject or ''}")


@inbox_app.command("read")
def read_cmd(
    address: AddressArgument,
    message_id: Annotated[int, typer.Argument(metavar="ID", help="Message id from `inbox list`.")],
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
    raw: Annotated[bool, typer.Option("--raw", help="Write the raw RFC 5322 bytes to stdout.")] = False,
) -> None:
    """Show one message (marks it read)."""
    url = resolve_database_url(database_url)
    rows = _db_call(url, sqlapi.read_message, address=address, session_token=token, message_id=message_id,
                    owner_type=owner_type, owner_id=owner_id)
    envelope_from, from_header, subject, text_body, html_body, attachments, raw_bytes = rows[0]
    if raw:
        sys.stdout.buffer.write(bytes(raw_bytes))
        sys.stdout.flush()
        return
    print(f"envelope-from: {envelope_from}")
    print(f"from: {from_header or ''}")
    print(f"subject: {subject or ''}")
    for a in attachments:
        print(f"attachment: {a.get('filename') or '(unnamed)'} {a.get('content_type')} {a.get('size')} bytes")
    print()
    print(text_body if text_body is not None else (html_body or ""))


@inbox_app.command("extend")
def extend_cmd(
    address: AddressArgument,
    duration: Annotated[float, typer.Argument(
        metavar="DURATION", parser=Duration(positive=True), help="Time to add, whole minutes (30m, 1h; capped by the plan).")],
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
) -> None:
    """Push an inbox's expiry later, within its plan's cap; prints the new expires_at."""
    url = resolve_database_url(database_url)
    rows = _db_call(url, sqlapi.extend_mailbox, address=address, session_token=token,
                    minutes=_minutes("DURATION", duration),
                    owner_type=owner_type, owner_id=owner_id)
    print(f"expires_at: {rows[0][0].isoformat()}")


@inbox_app.command("delete")
def delete_cmd(
    address: AddressArgument,
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
) -> None:
    """Soft-delete an inbox: it stops accepting mail now; purge removes it later."""
    url = resolve_database_url(database_url)
    rows = _db_call(url, sqlapi.delete_mailbox, address=address, session_token=token, owner_type=owner_type,
                    owner_id=owner_id)
    print("deleted" if rows[0][0] else "already deleted")


@inbox_app.command("tag")
def tag_cmd(
    address: AddressArgument,
    message_id: Annotated[int, typer.Argument(metavar="ID", help="Message id from `inbox list`.")],
    tags: Annotated[Optional[list[str]], typer.Argument(
        metavar="TAG", help="The message's new tag set (none given: unchanged); a-z 0-9 . _ -, at most 20.")]
    = None,
    no_tags: Annotated[bool, typer.Option("--no-tags", help="Remove every tag.")] = False,
    read: Annotated[Optional[bool], typer.Option("--read/--unread", help="Also mark it read or unread.")] = None,
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Set a message's tags (replacing them) and, with --read/--unread, its read mark."""
    if tags and no_tags:
        raise ConfigError("give TAGs or --no-tags, not both")
    url = resolve_database_url(database_url)
    rows = _db_call(url, sqlapi.mark_message, address=address, session_token=token, message_id=message_id,
                    is_read=read, tags=[] if no_tags else (list(tags) if tags else None), owner_type=owner_type,
                    owner_id=owner_id)
    _, is_read, stored = rows[0]
    _print({"id": message_id, "is_read": is_read, "tags": stored if as_json else " ".join(stored)}, as_json)


@inbox_app.command("clear")
def clear_cmd(
    address: AddressArgument,
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
) -> None:
    """Delete every message of an inbox (the inbox stays open); prints how many."""
    url = resolve_database_url(database_url)
    rows = _db_call(url, sqlapi.delete_inbox_messages, address=address, session_token=token, message_ids=None,
                    owner_type=owner_type, owner_id=owner_id)
    print(f"deleted: {rows[0][0]}")


fault_app = new_app(
    "fault", "Fault injection: make an inbox answer an SMTP error at RCPT, DATA or after DATA (docs/inboxes.md)."
)
inbox_app.add_typer(fault_app)


def _print_fault(fault: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(fault))
    elif fault is None:
        print("no fault")
    else:
        _print(fault, as_json=False)


@fault_app.command("set")
def fault_set_cmd(
    address: AddressArgument,
    at: Annotated[str, typer.Option("--at", metavar="STAGE", help=(
        "rcpt (RCPT is answered the reply), data (the end of DATA is, nothing stored) or after-data "
        "(stored, then answered the reply)."))],
    reply: Annotated[str, typer.Option("--reply", metavar="REPLY", help=(
        "The SMTP reply: 421, 450-452 or 550-554, an enhanced status of the same class and text, "
        "e.g. '451 4.7.1 Try again later'."))],
    share: Annotated[float, typer.Option("--share", min=0, max=100, metavar="PERCENT", help=(
        "Answer this share of the messages (drawn at random for each).")
    )] = 100,
    count: Annotated[Optional[int], typer.Option("--count", min=1, metavar="N", help=(
        "Answer only the next N (default: until cleared)."))] = None,
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make an inbox answer an SMTP error (replaces its fault); prints the fault (mailroom.set_inbox_fault)."""
    from decimal import Decimal

    rows = _db_call(resolve_database_url(database_url), sqlapi.set_inbox_fault, address=address,
                    session_token=token, stage=at, reply=reply, share=Decimal(str(share)), count=count,
                    owner_type=owner_type, owner_id=owner_id)
    _print_fault(rows[0][0], as_json)


@fault_app.command("clear")
def fault_clear_cmd(
    address: AddressArgument,
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
) -> None:
    """Remove an inbox's own fault (mailroom.clear_inbox_fault)."""
    rows = _db_call(resolve_database_url(database_url), sqlapi.clear_inbox_fault, address=address,
                    session_token=token, owner_type=owner_type, owner_id=owner_id)
    print("cleared" if rows[0][0] else "no fault")


@fault_app.command("show")
def fault_show_cmd(
    address: AddressArgument,
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
    as_json: JsonOption = False,
) -> None:
    """The fault in force for an inbox, its own or its catch-all domain's (mailroom.inbox_fault)."""
    rows = _db_call(resolve_database_url(database_url), sqlapi.inbox_fault, address=address,
                    session_token=token, owner_type=owner_type, owner_id=owner_id)
    _print_fault(rows[0][0], as_json)


def _expire_opt(flag: str, help: str, **kwargs: Any) -> Any:  # noqa: A002
    return env_option(flag, env="MAILROOM_EXPIRE_" + flag.lstrip("-").split("/")[0].replace("-", "_").upper(),
                      help=help, **kwargs)


@app.command("expire")
def expire_cmd(
    database_url: DatabaseUrlOption = None,
    listen_url: ListenUrlOption = None,
    interval: Annotated[float, duration_option(
        "--interval", env="MAILROOM_EXPIRE_INTERVAL", positive=True, help="Time between cycles.")] = "60s",
    purge_after: Annotated[Optional[float], duration_option(
        "--purge-after", env="MAILROOM_EXPIRE_PURGE_AFTER", never=True,
        help="Hard-delete inboxes inactive for longer than this ('never' to keep them).")] = "7d",
    batch: Annotated[Optional[int], _expire_opt(
        "--batch", "Mailboxes expired per transaction (default: setting inbox.expire_batch).", min=1,
        metavar="N")] = None,
    purge_batch: Annotated[Optional[int], _expire_opt(
        "--purge-batch", "Mailboxes purged per transaction (default: setting inbox.purge_batch).", min=1,
        metavar="N")] = None,
    once: Annotated[bool, _expire_opt("--once", "Run one cycle, print counts, exit.")] = False,
    wake_on_due: Annotated[bool, _expire_opt(
        "--wake-on-due/--no-wake-on-due", "Wake when the next inbox is due if that is sooner than --interval.")] = True,
    metrics_port: Annotated[Optional[int], port_option(
        "--metrics-port", env="MAILROOM_EXPIRE_METRICS_PORT",
        help="Serve Prometheus metrics on this port (0: any free port).")] = None,
    metrics_host: Annotated[str, _expire_opt("--metrics-host", "Metrics bind address.", metavar="HOST")] = "127.0.0.1",
) -> None:
    """Expire due inboxes and purge old inactive ones, every --interval (safe with many workers)."""
    from datetime import timedelta

    from mailroom.inboxes.expiry import ExpiryWorker

    url = resolve_database_url(database_url)
    retention = timedelta(seconds=purge_after) if purge_after is not None else None
    worker = ExpiryWorker(url, interval=interval, purge_after=retention, batch=batch, purge_batch=purge_batch,
                          wake_on_due=wake_on_due, listen_url=resolve_listen_url(listen_url, url),
                          metrics_port=metrics_port, metrics_host=metrics_host)
    worker.stop_on_signals()
    worker.run(once=once)
    if once:
        print(f"expired={worker.total_expired} purged={worker.total_purged}")


@inbox_app.command("watch")
def watch_cmd(
    address: AddressArgument,
    database_url: DatabaseUrlOption = None,
    listen_url: ListenUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
    poll_interval: Annotated[float, duration_option(
        "--poll-interval", positive=True, help="How often to look while LISTEN is unavailable.")] = "2s",
    existing: Annotated[bool, typer.Option("--existing", help="Print the messages already there first.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Print each new message's summary (id, received_at, from, subject) as it arrives; SIGTERM/SIGINT end it."""
    from mailroom.inboxes.watch import InboxWatcher

    url = resolve_database_url(database_url)
    watcher = InboxWatcher(url, address, token=token, owner_type=owner_type, owner_id=owner_id,
                           listen_url=resolve_listen_url(listen_url, url), poll_interval=poll_interval,
                           existing=existing, as_json=as_json)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: watcher.stop())
    watcher.run()


@app.command("plans")
def plans_cmd(database_url: DatabaseUrlOption = None, as_json: JsonOption = False) -> None:
    """The inbox plans create_mailbox accepts: TTL default and maximum, largest message, messages kept, and
    what a full inbox does: refuse (552) or drop_oldest (mailroom.list_plans)."""
    from mailroom.core.durations import format_seconds
    from mailroom.core.table import table

    rows = _db_call(resolve_database_url(database_url), sqlapi.list_plans)
    if as_json:
        for r in rows:
            print(json.dumps(r._asdict()))
        return
    table([{"plan": r.name, "default_ttl": format_seconds(r.default_ttl_minutes * 60),
            "max_ttl": format_seconds(r.max_ttl_minutes * 60), "max_message_bytes": r.max_message_bytes,
            "max_messages": r.max_messages, "when_full": r.when_full} for r in rows],
          ["plan", "default_ttl", "max_ttl", "max_message_bytes", "max_messages", "when_full"])
