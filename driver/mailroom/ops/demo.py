"""The story behind `mailroom demo`: real processes and real protocols on 127.0.0.1.

inbox → account → activation token collected → email queued → claimed and sent over SMTP
→ delivered into the temporary inbox → link read back and consumed → account active →
inbox expired by the clock → RCPT refused; plus a relay answering 4xx and its retry.
"""

from __future__ import annotations

import os
import re
import secrets
import smtplib
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from aiosmtpd.controller import Controller

from mailroom.core.errors import UserError, describe_db_error
from mailroom.core.supervisor import Supervisor
from mailroom.db import cluster as embedded
from mailroom.db.config import default_home
from mailroom.db.connect import connect
from mailroom.db.migrate import migrate
from mailroom.ops.run import plan

DEMO_SENDER = "mailroom-demo"
FLAKY_SENDER = "mailroom-demo-flaky"
LINK_BASE = "https://mailroom.test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TempFailHandler:
    """An SMTP relay that answers every recipient with a transient 451 (the failure path)."""

    def __init__(self) -> None:
        self.attempts = 0

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802 (aiosmtpd API)
        self.attempts += 1
        return "451 4.3.0 Mailbox temporarily unavailable, try again later"


class Story:
    """Prints numbered steps with their elapsed time and waits for conditions with a deadline."""

    def __init__(self, pace: float) -> None:
        self.pace = pace
        self.t0 = time.monotonic()
        self.n = 0

    def step(self, text: str) -> None:
        self.n += 1
        print(f"[{time.monotonic() - self.t0:6.2f}s] {self.n:2d}. {text}", flush=True)
        if self.pace:
            time.sleep(self.pace)

    def detail(self, text: str) -> None:
        print(f"{'':13}{text}", flush=True)

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            value = probe()
            if value:
                return value
            time.sleep(0.05)
        raise UserError(f"demo: timed out after {timeout:.0f}s waiting for {what}")


def one(conn: psycopg.Connection, query: str, params: tuple = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def run_demo(database_url: str | None, data_dir: Path | None, pace: float) -> None:
    """Run the end-to-end story on the embedded cluster (or MAILROOM_DATABASE_URL) and stop everything."""
    story = Story(pace)
    started_cluster: embedded.Cluster | None = None
    if database_url:
        url = database_url
        story.step("database: MAILROOM_DATABASE_URL")
    else:
        home = default_home(data_dir)
        was_running = embedded.Cluster(home).is_running()
        cluster = embedded.up(home)
        started_cluster = None if was_running else cluster
        url = cluster.url()
        story.step(f"database: embedded cluster in {home} ({'reused' if was_running else 'started'})")
    result = migrate(url)
    story.detail(f"migrations applied now: {len(result.applied)}, sql files: {result.sql_files}")

    relay = Controller(TempFailHandler(), hostname="127.0.0.1", port=free_port())
    started: list[Supervisor] = []  # filled as soon as the workers start, so a failure stops them too
    try:
        relay.start()
        _run_story(story, url, relay, started)
    except psycopg.Error as exc:
        raise UserError(f"demo: step {story.n + 1} failed: {describe_db_error(exc)}") from None
    finally:
        for supervisor in started:
            if not supervisor.stopping:
                supervisor.stop()
        relay.stop()
        if started_cluster is not None:
            embedded.down(started_cluster.home)
            story.step("stopped the embedded cluster the demo started")
    story.step("done: every process the demo started has stopped")


def _run_story(story: Story, url: str, relay: Controller, started: list[Supervisor]) -> None:
    secret_key = secrets.token_hex(32)
    encryption_key = secrets.token_hex(32)
    inbox_port = free_port()
    with connect(url) as conn:
        domain = one(conn, "SELECT mailroom.setting('inbox.domain')")
        conn.execute(
            "SELECT mailroom.upsert_sender(%s, %s, '127.0.0.1', %s)", (DEMO_SENDER, f"noreply@{domain}", inbox_port)
        )
        conn.execute(
            "SELECT mailroom.upsert_sender(%s, %s, '127.0.0.1', %s)", (FLAKY_SENDER, f"noreply@{domain}", relay.port)
        )
        conn.execute("SELECT mailroom.set_setting('collector.sender', %s)", (DEMO_SENDER,))
        conn.execute("SELECT mailroom.set_setting('collector.link_base_url', %s)", (LINK_BASE,))
    story.step(
        f"configured senders: {DEMO_SENDER} relays to the inbound server on 127.0.0.1:{inbox_port}, "
        f"{FLAKY_SENDER} to a relay answering 451 on 127.0.0.1:{relay.port}; fresh keys in the environment only"
    )

    env = dict(
        os.environ,
        MAILROOM_DATABASE_URL=url,
        MAILROOM_SECRET_KEY=secret_key,
        MAILROOM_ENCRYPTION_KEY=encryption_key,
        MAILROOM_BATCH_LIMIT="10",
        MAILROOM_BATCH_TIMEOUT="100",
        MAILROOM_HEALTHCHECK_INTERVAL="5000",
    )
    children = plan("127.0.0.1", inbox_port, inbox=True, collect=True, send=True, expire=False)
    supervisor = Supervisor(children, env=env)
    started.append(supervisor)
    supervisor.start()
    with connect(url) as conn:
        story.wait("the collector and the sender to connect", lambda: one(
            conn, "SELECT bool_or(application_name = 'mailroom-collect')"
            " AND bool_or(application_name LIKE 'mailroom-send%%') FROM pg_stat_activity"
            " WHERE datname = current_database()"))
    story.step("started: " + ", ".join(f"`mailroom {' '.join(c.args)}` (pid {c.pid})" for c in children))

    with connect(url) as conn:
        mailbox_id, address, expires_at, session_token = conn.execute(
            "SELECT mailbox_id, address, expires_at, session_token FROM mailroom.create_mailbox(NULL, 'free')"
        ).fetchone()
        story.step(f"created a free-plan inbox {address}, expires at {expires_at:%H:%M:%S} (mailbox {mailbox_id})")

        login = f"demo-{secrets.token_hex(4)}"
        account_id = one(conn, "SELECT mailroom.create_account(%s, %s)", (address, login))
        story.step(f"created account {account_id} ({login}) with that inbox as its email; status provisioned")

        story.wait("the activation token to be collected", lambda: one(
            conn, "SELECT dispatched_at IS NOT NULL FROM mailroom.tokens WHERE account = %s AND action = 'activation'",
            (account_id,)))
        outbound_id = story.wait("the activation email to be queued", lambda: one(
            conn, "SELECT id FROM mailroom.outbound_messages WHERE %s = ANY (to_addrs)", (address,)))
        story.step(f"collector dequeued the token and queued activation email {outbound_id}")

        story.wait("the activation email to be sent", lambda: one(
            conn, "SELECT status = 'sent' FROM mailroom.outbound_messages WHERE id = %s", (outbound_id,)))
        story.step(f"sender claimed it and delivered it over SMTP to 127.0.0.1:{inbox_port}")

        message_id = story.wait("the email to land in the inbox", lambda: one(
            conn, "SELECT message_id FROM mailroom.list_messages(%s, %s)", (address, session_token)))
        subject, text_body = conn.execute(
            "SELECT subject, text_body FROM mailroom.read_message(%s, %s, %s)", (address, session_token, message_id)
        ).fetchone()
        story.step(f"inbox received message {message_id}: {subject!r}")
        collected, sent, landed = conn.execute(
            "SELECT t.dispatched_at - a.created_at, o.sent_at - a.created_at, m.received_at - a.created_at"
            " FROM mailroom.accounts a"
            " JOIN mailroom.tokens t ON t.account = a.id AND t.action = 'activation'"
            " JOIN mailroom.outbound_messages o ON o.id = %s"
            " JOIN mailroom.messages m ON m.id = %s WHERE a.id = %s",
            (outbound_id, message_id, account_id),
        ).fetchone()
        story.detail(f"after the account was created (database timestamps): token collected and email queued "
                     f"+{collected.total_seconds() * 1000:.0f} ms, sent and finalized +{sent.total_seconds() * 1000:.0f} ms, "
                     f"in the inbox +{landed.total_seconds() * 1000:.0f} ms")

        match = re.search(r"token=([A-Za-z0-9_-]{40,})", text_body or "")
        if not match:
            raise UserError("demo: the activation email carries no signed link")
        signed = match.group(1)
        story.detail(f"link: {LINK_BASE}/activate?token={signed[:10]}… ({len(signed)} characters)")
        consumed = one(conn, "SELECT account FROM mailroom.consume_token(%s, %s)", (signed, bytes.fromhex(secret_key)))
        status = one(conn, "SELECT status FROM mailroom.accounts WHERE id = %s", (account_id,))
        story.step(f"consumed the signed link for account {consumed}: status is now {status}")
        if status != "active":
            raise UserError(f"demo: account {account_id} is {status}, expected active")

        with conn.transaction():
            conn.execute("SELECT mailroom.pin_clock(%s::timestamptz + interval '1 second')", (expires_at,))
            expired = one(conn, "SELECT mailroom.expire_mailboxes()")
        story.step(f"clock pinned to 1 s past expires_at: expire_mailboxes() expired {expired} inbox(es)")
        code, reply = _try_rcpt(inbox_port, address)
        story.step(f"a further delivery is refused at RCPT: {code} {reply}")
        if code != 550:
            raise UserError(f"demo: RCPT to the expired inbox answered {code}, expected 550")

        flaky_id = one(
            conn, "SELECT mailroom.enqueue_message(%s, ARRAY['someone@example.net'], 'retry demo', 'hello')",
            (FLAKY_SENDER,))
        attempts, next_retry, code_seen = story.wait("the 451 to be recorded", lambda: conn.execute(
            "SELECT attempts, next_retry_at - updated_at, last_smtp_code FROM mailroom.outbound_messages "
            "WHERE id = %s AND attempts > 0", (flaky_id,)).fetchone())
        story.step(f"message {flaky_id} via the flaky relay got {code_seen}: attempt {attempts}, "
                   f"back to queued, next try in {next_retry} (policy: attempts² minutes, 10 attempts)")

    status_out = subprocess.run([sys.executable, "-m", "mailroom", "outbound", "status"], env=env,
                                capture_output=True, text=True, timeout=30)
    story.step("`mailroom outbound status`:")
    for line in (status_out.stdout or status_out.stderr).rstrip().splitlines():
        story.detail(line)
    supervisor.stop()
    story.step("stopped inbound SMTP, collector and sender (SIGTERM)")
    for child in children:
        if child.returncode != 0:
            raise UserError(f"demo: {child.name} exited with code {child.returncode}")


def _try_rcpt(port: int, address: str) -> tuple[int, str]:
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.ehlo("demo.localhost")
        smtp.mail("someone@example.net")
        code, reply = smtp.rcpt(address)
        return code, reply.decode(errors="replace")

