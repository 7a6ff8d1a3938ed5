"""Helpers for the outbound tests: real aiosmtpd servers on 127.0.0.1 with scripted behaviour,
and small wrappers around the SQL API (senders, enqueue, status)."""

from __future__ import annotations

import asyncio
import re
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from pathlib import Path

import psycopg
from aiosmtpd.controller import Controller

KEY_HEX = "0123456789abcdef" * 4  # the previous release's MAILROOM_ENCRYPTION_KEY (convert-passwords tests)
KEY = bytes.fromhex(KEY_HEX)
_MESSAGE_ID = re.compile(rb"^Message-ID: (<[^>]+>)", re.MULTILINE | re.IGNORECASE)
SEND_FLAGS = ("--poll-interval", "0.2s", "--smtp-timeout", "2s", "--shutdown-grace", "1s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Received:
    mail_from: str
    rcpt_tos: list[str]
    content: bytes

    @property
    def message(self):
        return message_from_bytes(self.content, policy=policy.default)


@dataclass
class Handler:
    """An SMTP server's behaviour.

    mode: accept | reply_rcpt (answer RCPT with `reply`) | reply_data (answer end of DATA with
    `reply`) | drop_rcpt (close the connection at RCPT) | drop_data (close it at end of DATA) |
    stall_data (never answer the end of DATA). `refuse`: addresses answered with `reply` at RCPT
    in any mode (the others go on as the mode says); `refuse_with`: addresses answered with their
    own reply at RCPT."""

    mode: str = "accept"
    reply: str = "250 2.0.0 Ok"
    delay: float = 0.0
    received: list[Received] = field(default_factory=list)
    sessions: int = 0
    in_data: int = 0
    auth: tuple[str, str] | None = None
    refuse: tuple[str, ...] = ()
    refuse_with: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_EHLO(self, server, session, envelope, hostname, responses):  # noqa: N802
        with self.lock:
            self.sessions += 1
        session.host_name = hostname
        return responses

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802
        if address in self.refuse_with:
            return self.refuse_with[address]
        if self.mode == "reply_rcpt" or address in self.refuse:
            return self.reply
        if self.mode == "drop_rcpt":
            server.transport.close()
            return "421 4.4.2 closing"
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802
        with self.lock:
            self.in_data += 1
        if self.mode == "stall_data":
            await asyncio.sleep(3600)
        if self.mode == "drop_data":
            server.transport.close()
            return "421 4.4.2 closing"
        if self.mode == "reply_data":
            return self.reply
        if self.delay:
            await asyncio.sleep(self.delay)
        with self.lock:
            self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), envelope.original_content))
        return "250 2.0.0 Ok: queued"

    def message_ids(self) -> list[str]:
        with self.lock:
            return [_MESSAGE_ID.search(r.content).group(1).decode() for r in self.received]


class SmtpServer:
    def __init__(self, handler: Handler, **controller_kwargs):
        self.handler = handler
        self.port = free_port()
        self.controller = Controller(handler, hostname="127.0.0.1", port=self.port, **controller_kwargs)

    def start(self) -> SmtpServer:
        self.controller.start()
        return self

    def stop(self) -> None:
        try:
            self.controller.stop()
        except Exception:  # noqa: BLE001 - a stalled handler must not fail teardown
            pass


_SENDER_KEY: dict[str, object] = {}


def sender_key() -> tuple[bytes, Path]:
    """One sender keypair for the test process (RSA 2048: quicker to make than the 3072 default):
    its public half, and the file holding its private half (MAILROOM_SENDER_KEY_FILE)."""
    if not _SENDER_KEY:
        from mailroom.outbound.sealing import generate_keypair

        public, secret = generate_keypair(2048)
        path = Path(tempfile.mkdtemp(prefix="mailroom-sender-key-")) / "sender.key"
        path.write_text(secret)
        path.chmod(0o600)
        _SENDER_KEY.update(public=public, path=path)
    return _SENDER_KEY["public"], _SENDER_KEY["path"]  # type: ignore[return-value]


def sender_key_env() -> dict[str, str]:
    """The environment of a `mailroom send` that may open relay passwords."""
    return {"MAILROOM_SENDER_KEY_FILE": str(sender_key()[1])}


def add_sender(conn: psycopg.Connection, port: int, name: str = "main", **kw) -> int:
    """upsert_sender as an admin runs it from psql; a password is encrypted to the test sender key
    (set first); a login over security none is the loopback opt-in."""
    if kw.get("password") is not None:
        conn.execute("SELECT mailroom.set_sender_public_key(%s)", (sender_key()[0],))
    security = kw.get("security", "none")
    return conn.execute(
        "SELECT mailroom.upsert_sender(%s, %s, '127.0.0.1', %s, %s, %s, %s, p_allow_cleartext => %s)",
        (
            name,
            kw.get("from_address", "noreply@mailroom.test"),
            port,
            security,
            kw.get("username"),
            kw.get("password"),
            kw.get("allow_cleartext", security == "none" and kw.get("username") is not None),
        ),
    ).fetchone()[0]


def enqueue(conn: psycopg.Connection, n: int = 1, sender: str = "main", **kw) -> list[int]:
    return [
        conn.execute(
            "SELECT mailroom.enqueue_message(%s, %s, %s, %s, %s, %s, %s)",
            (
                sender,
                kw.get("to", [f"rcpt{i}@example.com"]),
                kw.get("subject", f"message {i}"),
                kw.get("text", f"text body {i}"),
                kw.get("html", f"<p>html body {i}</p>"),
                kw.get("cc", []),
                kw.get("bcc", []),
            ),
        ).fetchone()[0]
        for i in range(n)
    ]


def enqueue_many(conn: psycopg.Connection, n: int, sender: str = "main") -> None:
    """n messages in one statement (for the larger tests)."""
    conn.execute(
        "SELECT count(mailroom.enqueue_message(%s, ARRAY['rcpt' || g || '@example.com'], 'bulk ' || g, 'body ' || g))"
        " FROM generate_series(1, %s) AS g",
        (sender, n),
    )


def row(conn: psycopg.Connection, message_id: int) -> dict:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    return cur.execute("SELECT * FROM mailroom.outbound_messages WHERE id = %s", (message_id,)).fetchone()


def counts(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT status::text, count(*) FROM mailroom.outbound_messages GROUP BY 1").fetchall())


def wait_for(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def dkim_record(stdout: str) -> tuple[str, str]:
    """The name and value of the TXT record `outbound dkim keygen` printed (a zone line of quoted strings)."""
    line = next(x for x in stdout.splitlines() if " IN TXT " in x)
    name = line.split(" IN TXT ")[0].rstrip(".")
    value = "".join(re.findall(r'"([^"]*)"', line))
    return name, value
