"""`mailroom inbox …` and `mailroom expire`: the typer commands of the expiring inboxes.

Each `inbox` command is one call of the SQL API (create_mailbox, list_messages, read_message,
extend_mailbox, delete_mailbox); `inbox serve` runs mailroom.inboxes.server.InboundServer and
`expire` runs mailroom.inboxes.expiry.ExpiryWorker.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Annotated, Any, Optional

import typer

from mailroom.core.durations import parse_optional_duration, parse_seconds
from mailroom.core.errors import ConfigError
from mailroom.db.config import DatabaseUrlOption, ListenUrlOption, resolve_database_url, resolve_listen_url
from mailroom.db.connect import call_once
from mailroom.db.contract import SqlFunction
from mailroom.inboxes import sqlapi

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

inbox_app = typer.Typer(
    name="inbox",
    help="Expiring inboxes: the inbound SMTP server and inbox management.",
    no_args_is_help=True,
    add_completion=False,
)

TokenOption = Annotated[
    Optional[str],
    typer.Option("--token", envvar="MAILROOM_SESSION_TOKEN", help="Session token of an anonymous inbox.",
                 show_envvar=True),
]
OwnerTypeOption = Annotated[
    Optional[str], typer.Option("--owner-type", help="Owner type for api/mcp inboxes (api or mcp).")
]
OwnerIdOption = Annotated[Optional[str], typer.Option("--owner-id", help="Owner id for api/mcp inboxes.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def _db_call(url: str, fn: SqlFunction, **kwargs: Any) -> list[Any]:
    return call_once(url, fn, application_name="mailroom-inbox", **kwargs)


def _print(obj: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(obj, default=str))
        return
    for key, value in obj.items():
        if value is not None:
            print(f"{key}: {value}")


@inbox_app.command("serve")
def serve_cmd(
    database_url: DatabaseUrlOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on (0: any free port).")] = 2525,
    max_recipients: Annotated[int, typer.Option(help="RCPT TO per message; more get 452.")] = 100,
    max_bad_recipients: Annotated[
        int, typer.Option(help="Unknown recipients a connection may send; its next RCPT gets 421 and a hang-up.")
    ] = 10,
    max_sessions: Annotated[
        int, typer.Option(help="Connections at once; more get 421 and are closed at once.")
    ] = 100,
    idle_timeout: Annotated[
        float, typer.Option(help="Seconds a client may stay silent (also bounds one DATA transfer).")
    ] = 300.0,
    max_line_length: Annotated[int, typer.Option(help="Longest line in octets, CRLF excluded.")] = 1000,
    max_message_size: Annotated[
        Optional[int], typer.Option(help="SIZE to advertise (default: the largest plan limit).")
    ] = None,
    pool_size: Annotated[int, typer.Option(help="Database connections (of each worker).")] = 4,
    workers: Annotated[
        int, typer.Option(help="Server processes on the one port (SO_REUSEPORT), each with its own pool.")
    ] = 1,
) -> None:
    """Run the inbound SMTP server that stores mail for open inboxes."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {port}")
    for name, value in (("--max-recipients", max_recipients), ("--max-bad-recipients", max_bad_recipients),
                        ("--max-sessions", max_sessions), ("--pool-size", pool_size), ("--workers", workers),
                        ("--max-line-length", max_line_length)):
        if value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}")
    if idle_timeout <= 0:
        raise ConfigError(f"--idle-timeout must be positive, got {idle_timeout}")
    if max_message_size is not None and max_message_size < 1:
        raise ConfigError(f"--max-message-size must be positive, got {max_message_size}")
    import asyncio

    from mailroom.inboxes.server import InboundServer

    url = resolve_database_url(database_url)
    import logging

    logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd logs addresses at INFO

    def run(bind_port: int, ready: Any = None, reuse_port: bool = False) -> None:
        server = InboundServer(
            url, host=host, port=bind_port, max_recipients=max_recipients, max_bad_recipients=max_bad_recipients,
            max_sessions=max_sessions, idle_timeout=idle_timeout, max_line_length=max_line_length,
            pool_size=pool_size, data_size_limit=max_message_size, reuse_port=reuse_port,
        )

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, server.stop)
            await server.run(ready)

        asyncio.run(main())

    if workers == 1:
        run(port)
        return
    from mailroom.inboxes.workers import supervise

    code = supervise(lambda bind_port, ready: run(bind_port, ready, reuse_port=True), workers, host, port)
    if code:
        raise typer.Exit(code)


@inbox_app.command("create")
def create_cmd(
    database_url: DatabaseUrlOption = None,
    plan: Annotated[str, typer.Option(help="Plan: free, pro, enterprise.")] = "free",
    ttl: Annotated[Optional[int], typer.Option(help="TTL in minutes (default: the plan's; capped).")] = None,
    owner_type: Annotated[str, typer.Option("--owner-type", help="anonymous, api or mcp.")] = "anonymous",
    owner_id: OwnerIdOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create an inbox; prints its address, expires_at and (anonymous) session token."""
    url = resolve_database_url(database_url)
    rows = _db_call(url, sqlapi.create_mailbox, ttl_minutes=ttl, plan=plan, owner_type=owner_type, owner_id=owner_id)
    mailbox_id, address, expires_at, token = rows[0]
    _print(
        {"mailbox_id": mailbox_id, "address": address, "expires_at": expires_at.isoformat(),
         "session_token": token},
        as_json,
    )


@inbox_app.command("list")
def list_cmd(
    address: Annotated[str, typer.Argument(help="Inbox address.")],
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
    limit: Annotated[int, typer.Option(help="At most this many messages.")] = 100,
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
    address: Annotated[str, typer.Argument(help="Inbox address.")],
    query: Annotated[str, typer.Argument(help='Words, "a phrase", -excluded, or: as a web search.')],
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
    limit: Annotated[int, typer.Option(help="At most this many messages.")] = 50,
    as_json: JsonOption = False,
) -> None:
    """Full-text search of an inbox's messages (subject, from, text), best match first."""
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
    address: Annotated[str, typer.Argument(help="Inbox address.")],
    message_id: Annotated[int, typer.Argument(help="Message id from `inbox list`.")],
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
    address: Annotated[str, typer.Argument(help="Inbox address.")],
    minutes: Annotated[int, typer.Argument(help="Minutes to add (capped by the plan).")],
    database_url: DatabaseUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
) -> None:
    """Push an inbox's expiry later, within its plan's cap; prints the new expires_at."""
    url = resolve_database_url(database_url)
    rows = _db_call(url, sqlapi.extend_mailbox, address=address, session_token=token, minutes=minutes,
                    owner_type=owner_type, owner_id=owner_id)
    print(f"expires_at: {rows[0][0].isoformat()}")


@inbox_app.command("delete")
def delete_cmd(
    address: Annotated[str, typer.Argument(help="Inbox address.")],
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


@app.command("expire")
def expire_cmd(
    database_url: DatabaseUrlOption = None,
    listen_url: ListenUrlOption = None,
    interval: Annotated[str, typer.Option(help="Time between cycles (60s, 5m, ...).")] = "60s",
    purge_after: Annotated[
        str, typer.Option(help="Hard-delete inboxes inactive for longer than this (7d; 'never' to keep).")
    ] = "7d",
    batch: Annotated[
        Optional[int], typer.Option(help="Mailboxes expired per transaction (default: setting inbox.expire_batch).")
    ] = None,
    purge_batch: Annotated[
        Optional[int], typer.Option(help="Mailboxes purged per transaction (default: setting inbox.purge_batch).")
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Run one cycle, print counts, exit.")] = False,
    wake_on_due: Annotated[
        bool, typer.Option("--wake-on-due/--no-wake-on-due",
                           help="Wake when the next inbox is due if that is sooner than --interval.")
    ] = True,
) -> None:
    """Expire due inboxes and purge old inactive ones, every --interval (safe with many workers)."""
    from mailroom.inboxes.expiry import ExpiryWorker

    every = parse_seconds("--interval", interval)
    if every <= 0:
        raise ConfigError("--interval must be positive")
    retention = parse_optional_duration("--purge-after", purge_after)
    for name, value in (("--batch", batch), ("--purge-batch", purge_batch)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}")
    url = resolve_database_url(database_url)
    worker = ExpiryWorker(url, interval=every, purge_after=retention, batch=batch, purge_batch=purge_batch,
                          wake_on_due=wake_on_due, listen_url=resolve_listen_url(listen_url, url))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: worker.stop())
    worker.run(once=once)
    if once:
        print(f"expired={worker.total_expired} purged={worker.total_purged}")


@inbox_app.command("watch")
def watch_cmd(
    address: Annotated[str, typer.Argument(help="Inbox address.")],
    database_url: DatabaseUrlOption = None,
    listen_url: ListenUrlOption = None,
    token: TokenOption = None,
    owner_type: OwnerTypeOption = None,
    owner_id: OwnerIdOption = None,
    poll_interval: Annotated[
        str, typer.Option("--poll-interval", help="How often to look while LISTEN is unavailable (2s, 500ms, ...).")
    ] = "2s",
    existing: Annotated[bool, typer.Option("--existing", help="Print the messages already there first.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Print each new message's summary (id, received_at, from, subject) as it arrives; SIGTERM/SIGINT end it."""
    from mailroom.inboxes.watch import InboxWatcher

    every = parse_seconds("--poll-interval", poll_interval)
    if every <= 0:
        raise ConfigError("--poll-interval must be positive")
    url = resolve_database_url(database_url)
    watcher = InboxWatcher(url, address, token=token, owner_type=owner_type, owner_id=owner_id,
                           listen_url=resolve_listen_url(listen_url, url), poll_interval=every,
                           existing=existing, as_json=as_json)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: watcher.stop())
    watcher.run()
