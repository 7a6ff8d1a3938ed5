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
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from aiosmtpd.controller import Controller

from mailroom.accounts import sqlapi as accounts
from mailroom.core.errors import UserError, describe_db_error
from mailroom.core.supervisor import Supervisor
from mailroom.db import cluster as embedded
from mailroom.db import sqlapi as db_sqlapi
from mailroom.db.config import default_home
from mailroom.db.connect import connect
from mailroom.db.migrate import migrate
from mailroom.inboxes import sqlapi as inboxes
from mailroom.ops.run import plan
from mailroom.outbound import sqlapi as outbound

DEMO_SENDER = "mailroom-demo"
FLAKY_SENDER = "mailroom-demo-flaky"
DEMO_SETTINGS = ("collector.sender", "collector.link_base_url")  # what the story sets, restored after it
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
    with connect(url) as conn:
        settings_before = {name: db_sqlapi.setting.value(conn, name=name) for name in DEMO_SETTINGS}
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
        _tidy(story, url, settings_before)
        if started_cluster is not None:
            embedded.down(started_cluster.home)
            story.step("stopped the embedded cluster the demo started")
    story.step("done: every process the demo started has stopped")


def _tidy(story: Story, url: str, settings_before: dict[str, str]) -> None:
    """Leave nothing that points at the demo's throwaway ports (issue 44, item 5): the settings it changed
    back as they were, and the mail still queued through its senders cancelled (kept as cancelled until
    retention; `mailroom outbound retry` brings it back). Its senders' rows stay: nothing uses them."""
    try:
        with connect(url) as conn:
            for name, value in settings_before.items():
                db_sqlapi.set_setting.call(conn, name=name, value=value)
            ids = [m.id for m in outbound.list_outbound_messages.rows(conn, status="queued", limit=1000)
                   if m.sender in (DEMO_SENDER, FLAKY_SENDER)]
            if ids:
                outbound.cancel_messages.call(conn, ids=ids)
    except psycopg.Error as exc:
        story.step(f"could not tidy up: {describe_db_error(exc)}")
        return
    story.step(f"restored {', '.join(sorted(settings_before))}; cancelled {len(ids)} message(s) still queued "
               "through the demo's senders")


def _run_story(story: Story, url: str, relay: Controller, started: list[Supervisor]) -> None:
    inbox_port = free_port()
    with connect(url) as conn:
        domain = db_sqlapi.setting.value(conn, name="inbox.domain")
        for name, port in ((DEMO_SENDER, inbox_port), (FLAKY_SENDER, relay.port)):
            outbound.upsert_sender.call(conn, name=name, from_address=f"noreply@{domain}", host="127.0.0.1", port=port)
        db_sqlapi.set_setting.call(conn, name="collector.sender", value=DEMO_SENDER)
        db_sqlapi.set_setting.call(conn, name="collector.link_base_url", value=LINK_BASE)
    story.step(
        f"configured senders: {DEMO_SENDER} relays to the inbound server on 127.0.0.1:{inbox_port}, "
        f"{FLAKY_SENDER} to a relay answering 451 on 127.0.0.1:{relay.port}; no key in any environment "
        "(the signing keyring stays in the database)"
    )

    env = dict(
        os.environ,
        MAILROOM_DATABASE_URL=url,
        MAILROOM_BATCH_LIMIT="10",
        MAILROOM_BATCH_TIMEOUT="100ms",
        MAILROOM_HEALTHCHECK_INTERVAL="5s",
    )
    children = plan("127.0.0.1", inbox_port, inbox=True, collect=True, send=True, expire=False)
    supervisor = Supervisor(children, env=env)
    started.append(supervisor)
    supervisor.start()
    host = socket.gethostname()
    workers = {f"{host}:{c.pid}" for c in children if c.name in ("collect", "send")}  # heartbeat names
    with connect(url) as conn:
        story.wait("the collector and the sender to report in", lambda: workers <= {
            w.worker for w in db_sqlapi.worker_health.rows(conn)})
        # tokens pending before the demo (a database in use) are the collector's first drain, each
        # queuing an email: waited out, so the first email queued after the account below is its own
        story.wait("the collector to take the tokens pending before the demo", lambda: all(
            q.due == 0 for q in db_sqlapi.queue_health.rows(conn) if q.queue == "tokens"))
    story.step("started: " + ", ".join(f"`mailroom {' '.join(c.args)}` (pid {c.pid})" for c in children))

    with connect(url) as conn:
        mailbox_id, address, expires_at, session_token = inboxes.create_mailbox.row(conn, plan="free")
        story.step(f"created a free-plan inbox {address}, expires at {expires_at:%H:%M:%S} (mailbox {mailbox_id})")

        login = f"demo-{secrets.token_hex(4)}"
        queued_before = max((m.id for m in outbound.list_outbound_messages.rows(conn, limit=1)), default=0)
        created_at = db_sqlapi.clock.value(conn)
        account_id = accounts.create_account.value(conn, email=address, login=login)
        story.step(f"created account {account_id} ({login}) with that inbox as its email; status provisioned")

        outbound_id = story.wait("the activation email to be queued", lambda: next((
            m.id for m in outbound.list_outbound_messages.rows(conn, limit=10)
            if m.id > queued_before and m.sender == DEMO_SENDER), None))
        story.step(f"collector dequeued the token and queued activation email {outbound_id}")

        email = story.wait("the activation email to be sent", lambda: next((
            m for m in outbound.show_outbound_message.rows(conn, id=outbound_id) if m.status == "sent"), None))
        story.step(f"sender claimed it and delivered it over SMTP to 127.0.0.1:{inbox_port}")

        # returns as soon as the message is committed (MR212 after the timeout)
        landed = inboxes.wait_for_message.row(conn, address=address, session_token=session_token,
                                              timeout=timedelta(seconds=30))
        message = inboxes.read_message.row(conn, address=address, session_token=session_token,
                                           message_id=landed.message_id)
        subject, text_body = message.subject, message.text_body
        story.step(f"inbox received message {landed.message_id}: {subject!r}")

        def after(at: datetime) -> str:
            return f"+{(at - created_at).total_seconds() * 1000:.0f} ms"

        story.detail(f"after the account was created (database timestamps): token collected and email queued "
                     f"{after(email.created_at)}, sent and finalized {after(email.sent_at)}, "
                     f"in the inbox {after(landed.received_at)}")

        match = re.search(r"token=([A-Za-z0-9_-]{40,})", text_body or "")
        if not match:
            raise UserError("demo: the activation email carries no signed link")
        signed = match.group(1)
        story.detail(f"link: {LINK_BASE}/activate?token={signed[:10]}… ({len(signed)} characters)")
        consumed = accounts.consume_token.row(conn, signed=signed).account
        status = accounts.account_status.value(conn, account=account_id)
        story.step(f"consumed the signed link for account {consumed}: status is now {status}")
        if status != "active":
            raise UserError(f"demo: account {account_id} is {status}, expected active")

        with conn.transaction():
            db_sqlapi.pin_clock.call(conn, at=expires_at + timedelta(seconds=1))
            expired = inboxes.expire_mailboxes.value(conn)
        story.step(f"clock pinned to 1 s past expires_at: expire_mailboxes() expired {expired} inbox(es)")
        code, reply = _try_rcpt(inbox_port, address)
        story.step(f"a further delivery is refused at RCPT: {code} {reply}")
        if code != 550:
            raise UserError(f"demo: RCPT to the expired inbox answered {code}, expected 550")

        flaky_id = outbound.enqueue_message.value(conn, sender=FLAKY_SENDER, to=["someone@example.net"],
                                                  subject="retry demo", text_body="hello")
        flaky = story.wait("the 451 to be recorded", lambda: next((
            m for m in outbound.show_outbound_message.rows(conn, id=flaky_id) if m.attempts > 0), None))
        # the attempt's time is the first word of its (scrubbed) error_log line, to the second
        attempted_at = datetime.fromisoformat(flaky.error_log.splitlines()[-1].split(" ", 1)[0])
        next_retry = timedelta(seconds=int((flaky.next_retry_at - attempted_at).total_seconds()))
        attempts = int(db_sqlapi.setting.value(conn, name="outbound.max_attempts"))
        story.step(f"message {flaky_id} via the flaky relay got {flaky.last_smtp_code}: attempt {flaky.attempts}, "
                   f"back to queued, next try in {next_retry} (policy: attempts² minutes, {attempts} attempts: "
                   f"the first and up to {attempts - 1} retries)")

        # the sender reports its claims within a second (mailroom.db.heartbeat): the screen below is current
        sender = next(c for c in children if c.name == "send")
        story.wait("the sender's heartbeat to count its two claims", lambda: any(
            w.worker == f"{host}:{sender.pid}" and w.claimed >= 2 for w in db_sqlapi.worker_health.rows(conn)))

    status_out = subprocess.run([sys.executable, "-m", "mailroom", "status"], env=env,
                                capture_output=True, text=True, timeout=30)
    story.step("`mailroom status`:")
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

