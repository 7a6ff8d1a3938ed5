"""Webhooks out (docs/webhooks.md) through the real sender: a real HTTP receiver on 127.0.0.1, the
signatures checked with the Standard Webhooks spec's own verifier (the `standardwebhooks` package),
retries and the outage driven by a pinned mailroom.clock(), never by sleeping."""

from __future__ import annotations

import contextlib
import hashlib
import re
import signal
import smtplib
import socket
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
import pytest
from outbound_support import SEND_FLAGS, row, sender_key, sender_key_env, wait_for
from psycopg.types.json import Jsonb
from standardwebhooks import Webhook

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ALLOW = ("--webhook-allow", "127.0.0.1/32")


class Receiver:
    """A webhook endpoint on 127.0.0.1: answers the statuses of `script` in turn (then 200), or 503
    while `down`; `hold` keeps a request unanswered until set; every request is kept."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.answers: list[int] = []  # the status each request was answered
        self.script: list[int] = []
        self.down = False
        self.hold: threading.Event | None = None
        self.arrived = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                receiver.arrived.set()
                if receiver.hold is not None:
                    receiver.hold.wait(30)
                status = 503 if receiver.down else (receiver.script.pop(0) if receiver.script else 200)
                receiver.answers.append(status)
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/in?x=1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.hold is not None:
            self.hold.set()
        self.server.shutdown()
        self.server.server_close()

    def delivered(self, secret: str) -> list[dict]:
        """Every request, verified by the spec's library (it raises on a bad signature)."""
        return [Webhook(secret).verify(body, headers) for headers, body in self.requests]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def endpoint(conn: psycopg.Connection, url: str, events=("message.received",), owner: str = "acme") -> tuple[int, str, int]:
    """An API key of `owner` with an endpoint at `url`: (key id, whsec_ secret, endpoint id)."""
    conn.execute("SELECT mailroom.set_sender_public_key(%s)", (sender_key()[0],))
    key_id = conn.execute(
        "SELECT mailroom.create_api_key(%s, %s)", (owner, hashlib.sha256(f"mrk_{owner}".encode()).digest())
    ).fetchone()[0]
    endpoint_id, secret = conn.execute(
        "SELECT id, secret FROM mailroom.add_webhook(%s, %s, %s)", (url, list(events), key_id)
    ).fetchone()
    return key_id, secret, endpoint_id


def inbox(conn: psycopg.Connection, owner: str = "acme", at: datetime | None = T0, ttl: int = 60) -> str:
    """An inbox of `owner`'s API keys, made at `at` (None: now), open `ttl` minutes."""
    with conn.transaction():
        if at is not None:
            conn.execute("SELECT mailroom.pin_clock(%s)", (at,))
        return conn.execute(
            "SELECT address FROM mailroom.create_mailbox(%s, 'free', 'api', %s)", (ttl, owner)
        ).fetchone()[0]


def deliver(conn: psycopg.Connection, address: str, at: datetime, subject: str = "hello") -> int:
    """A message stored at `at` (mailroom.clock() pinned for the call), as the SMTP server stores it."""
    with conn.transaction():
        conn.execute("SELECT mailroom.pin_clock(%s)", (at,))
        return conn.execute(
            "SELECT mailroom.deliver_message(%s, %s, 'a@example.org', %s)",
            (address, f"Subject: {subject}\r\n\r\nbody\r\n".encode(), Jsonb({"subject": subject})),
        ).fetchone()[0]


def send_at(cli, when: datetime, *extra: str) -> subprocess.CompletedProcess:
    env = {"PGOPTIONS": f"-c mailroom.clock={when.isoformat()}", **sender_key_env()}
    result = cli("send", "--until-idle", *SEND_FLAGS, *ALLOW, *extra, env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    return result


def webhook_rows(conn: psycopg.Connection) -> list[dict]:
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    return cur.execute("SELECT * FROM mailroom.outbound_messages WHERE kind = 'webhook' ORDER BY id").fetchall()


def test_message_over_smtp_reaches_the_endpoint_signed(conn, cli, cli_popen, receiver, tmp_path: Path):
    _, secret, _ = endpoint(conn, receiver.url)
    address = inbox(conn, at=None)
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log_file:
        cli_popen("inbox", "serve", "--host", "127.0.0.1", "--port", "0", stdout=subprocess.DEVNULL, stderr=log_file)
    wait_for(lambda: "listening on 127.0.0.1:" in log_path.read_text(), what="inbox serve")
    port = int(log_path.read_text().split("listening on 127.0.0.1:")[1].split()[0].rstrip(",)"))
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.sendmail("a@example.org", [address], b"From: a@example.org\r\nSubject: ping\r\n\r\nhello\r\n")
    (hook,) = webhook_rows(conn)
    assert hook["status"] == "queued" and hook["message_id"].startswith("msg_")

    result = send_at(cli, datetime.now(UTC))
    (payload,) = receiver.delivered(secret)  # the spec's verifier accepts it
    headers, _ = receiver.requests[0]
    assert headers["webhook-id"] == hook["message_id"]
    assert payload["type"] == "message.received"
    assert payload["data"]["address"] == address and payload["data"]["subject"] == "ping"
    assert row(conn, hook["id"])["status"] == "sent"
    # never the secret, the URL's path or the payload in the sender's log
    assert secret not in result.stderr and "/hooks/in" not in result.stderr and address not in result.stderr
    # a wrong secret is refused by the verifier: the signature is really the endpoint's
    with pytest.raises(Exception, match="(?i)signature"):
        Webhook("whsec_" + "A" * 32).verify(receiver.requests[0][1], headers)


def test_inbox_without_endpoint_queues_nothing(conn, receiver):
    endpoint(conn, receiver.url)  # acme's
    deliver(conn, inbox(conn, owner="other"), T0)
    assert webhook_rows(conn) == []


def test_the_ssrf_guard_refuses_a_loopback_endpoint_unless_allowed(conn, cli, receiver):
    endpoint(conn, receiver.url)
    deliver(conn, inbox(conn), T0)
    env = {"PGOPTIONS": f"-c mailroom.clock={T0.isoformat()}", **sender_key_env()}
    result = cli("send", "--until-idle", *SEND_FLAGS, env=env, timeout=30)  # no --webhook-allow
    assert result.returncode == 0, result.stderr
    (hook,) = webhook_rows(conn)
    assert receiver.requests == []
    assert hook["status"] == "queued" and hook["last_outcome"] == "connect"  # retried: the operator may allow it
    assert "loopback" in hook["error_log"] and "--webhook-allow" in hook["error_log"]


def test_500_then_200_is_delivered_on_retry_with_the_same_id(conn, cli, receiver):
    _, secret, _ = endpoint(conn, receiver.url)
    deliver(conn, inbox(conn), T0)
    receiver.script = [500]
    send_at(cli, T0)
    (hook,) = webhook_rows(conn)
    assert hook["status"] == "queued" and hook["attempts"] == 1 and hook["last_smtp_code"] == 500
    assert hook["next_retry_at"] == T0 + timedelta(minutes=1)  # attempts² minutes, the queue's backoff
    send_at(cli, T0 + timedelta(minutes=1))
    assert row(conn, hook["id"])["status"] == "sent"
    assert [p["type"] for p in receiver.delivered(secret)] == ["message.received"] * 2
    assert len({h["webhook-id"] for h, _ in receiver.requests}) == 1


def test_a_silent_endpoint_holds_up_one_request_of_a_batch(conn, cli):
    """An endpoint's rows of a batch go one at a time, and once one gets no answer the others of the batch
    are not tried (never sent: retried with the backoff, 'connect'), as a relay that cannot be reached
    in a batch: an API key holder whose endpoint accepts and never answers cannot hold a sender slot,
    and the mail claimed with its rows, for a timeout a row (review of 2026-12-06: 40 rows of such an
    endpoint delayed a password reset claimed with them 27 s)."""
    accepted: list[socket.socket] = []  # connections that brought a webhook request (never answered)
    opened: list[socket.socket] = []  # every connection (another test's probe of a free port may land here)
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(50)

    def read(c: socket.socket) -> None:
        c.settimeout(5)
        with contextlib.suppress(OSError):
            if c.recv(64).startswith(b"POST /hooks"):
                accepted.append(c)

    def accept() -> None:
        while True:
            try:
                c = hole.accept()[0]
            except OSError:
                return
            opened.append(c)
            threading.Thread(target=read, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        endpoint(conn, f"http://127.0.0.1:{hole.getsockname()[1]}/hooks")
        address = inbox(conn)
        for _ in range(5):
            deliver(conn, address, T0)
        # one slot: the five rows are one batch (slots claiming at the same moment may split a small
        # queue between them, SKIP LOCKED, and each batch then tries the endpoint once: CI saw two)
        send_at(cli, T0, "--webhook-timeout", "1s", "--concurrency", "1")
        rows = webhook_rows(conn)
        assert len(accepted) == 1  # one request reached it
        assert sorted(r["last_outcome"] for r in rows) == ["connect"] * 4 + ["uncertain"]
        assert all("not tried" in r["error_log"] for r in rows if r["last_outcome"] == "connect")
        assert all(r["status"] == "queued" for r in rows)
    finally:
        hole.close()
        for c in opened:
            c.close()


def test_a_secret_sealed_for_another_sender_key_stops_only_its_deliveries(conn, cli, receiver):
    """An endpoint registered before `sender-key init` made a new sender key: its deliveries are retried
    with the attempt line saying why, the sender goes on (it stopped with exit 2 before, every mail with
    it: review of 2026-12-06), and the operator can list the old key's file or the holder register again."""
    from mailroom.outbound.sealing import generate_keypair

    conn.execute("SELECT mailroom.set_sender_public_key(%s)", (generate_keypair(2048)[0],))
    key_id = conn.execute("SELECT mailroom.create_api_key('acme', %s)", (hashlib.sha256(b"mrk_acme").digest(),)).fetchone()[0]
    conn.execute("SELECT * FROM mailroom.add_webhook(%s, %s, %s)", (receiver.url, ["message.received"], key_id))
    conn.execute("SELECT mailroom.set_sender_public_key(%s)", (sender_key()[0],))  # the key of MAILROOM_SENDER_KEY_FILE
    deliver(conn, inbox(conn), T0)
    send_at(cli, T0)  # exit 0
    (hook,) = webhook_rows(conn)
    assert receiver.requests == []
    assert hook["status"] == "queued" and hook["last_outcome"] == "local" and hook["attempts"] == 1
    assert "sealed for another sender key" in hook["error_log"]


def test_4xx_fails_fast_but_408_and_429_are_retried(conn, cli, receiver):
    endpoint(conn, receiver.url)
    address = inbox(conn)
    for _ in range(3):
        deliver(conn, address, T0)
    receiver.script = [404, 408, 429]
    send_at(cli, T0, "--concurrency", "1", "--batch-size", "1")
    statuses = [(r["last_smtp_code"], r["status"]) for r in webhook_rows(conn)]
    assert statuses == [(404, "failed"), (408, "queued"), (429, "queued")]


def test_worker_killed_mid_delivery_redelivers_with_the_same_id_flagged(conn, cli, cli_popen, receiver):
    _, secret, _ = endpoint(conn, receiver.url)
    deliver(conn, inbox(conn), T0)
    receiver.hold = threading.Event()
    env = {"PGOPTIONS": f"-c mailroom.clock={T0.isoformat()}", **sender_key_env()}
    proc = cli_popen("send", *SEND_FLAGS, *ALLOW, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert receiver.arrived.wait(20), "the sender never asked the endpoint"
    proc.send_signal(signal.SIGKILL)  # after the request went out, before its answer was recorded
    proc.wait(10)
    receiver.hold.set()  # the receiver took it (its 200 is lost with the worker)
    (hook,) = webhook_rows(conn)
    assert hook["status"] == "processing"

    later = T0 + timedelta(minutes=10)  # the lease is over: the reaper takes it back, possibly sent
    with conn.transaction():
        conn.execute("SELECT mailroom.pin_clock(%s)", (later,))
        assert conn.execute("SELECT mailroom.reap_stuck_messages()").fetchone()[0] == 1
    receiver.hold = None
    send_at(cli, later)
    r = row(conn, hook["id"])
    assert r["status"] == "sent" and r["possibly_sent"]
    first, second = receiver.requests
    assert first[0]["webhook-id"] == second[0]["webhook-id"] == hook["message_id"]
    assert "webhook-possible-duplicate" not in first[0] and second[0]["webhook-possible-duplicate"] == "true"
    assert len(receiver.delivered(secret)) == 2
    counted = conn.execute("SELECT webhook_possible_duplicates FROM mailroom.outbound_stats()").fetchone()[0]
    assert counted == 1
    status = cli("outbound", "status")
    assert status.returncode == 0 and re.search(r"webhooks possibly delivered twice\s+1\b", status.stdout), status.stdout


def test_an_hour_long_outage_loses_no_event(conn, cli, receiver):
    _, secret, _ = endpoint(conn, receiver.url, events=("message.received", "inbox.expired"))
    address = inbox(conn)
    receiver.down = True  # the endpoint answers 503 for an hour; events keep coming
    deliver(conn, address, T0, subject="m0")
    send_at(cli, T0)
    deliver(conn, address, T0 + timedelta(minutes=20), subject="m20")
    deliver(conn, address, T0 + timedelta(minutes=45), subject="m45")
    send_at(cli, T0 + timedelta(minutes=45))
    rows = webhook_rows(conn)
    assert [r["attempts"] for r in rows] == [2, 1, 1] and {r["status"] for r in rows} == {"queued"}
    with conn.transaction():  # the inbox's hour is over: the expiry queues inbox.expired
        conn.execute("SELECT mailroom.pin_clock(%s)", (T0 + timedelta(minutes=60),))
        assert conn.execute("SELECT mailroom.expire_mailboxes()").fetchone()[0] == 1
    receiver.down = False  # back after the hour: every retry is due by its backoff
    now = max(T0 + timedelta(minutes=60), *(r["next_retry_at"] for r in rows))
    send_at(cli, now)
    assert {r["status"] for r in webhook_rows(conn)} == {"sent"}
    answered = list(zip(receiver.delivered(secret), receiver.answers, strict=True))
    taken = sorted(p["data"].get("subject", p["type"]) for p, status in answered if status == 200)
    assert taken == ["inbox.expired", "m0", "m20", "m45"]  # every event, once each


def test_cli_adds_lists_shows_attempts_replays_and_removes(conn, cli, receiver):
    conn.execute("SELECT mailroom.set_sender_public_key(%s)", (sender_key()[0],))
    key_id = conn.execute("SELECT mailroom.create_api_key('acme', %s)", (hashlib.sha256(b"mrk_cli").digest(),)).fetchone()[0]
    added = cli("webhook", "add", receiver.url, "--event", "message.received", "--key-id", str(key_id))
    assert added.returncode == 0, added.stderr
    endpoint_id = int(added.stdout.split("webhook endpoint ")[1].split()[0])
    secret = added.stdout.split("secret: ")[1].split()[0]
    assert secret.startswith("whsec_")
    listed = cli("webhook", "list")
    assert listed.returncode == 0 and receiver.url in listed.stdout and secret not in listed.stdout
    bad = cli("webhook", "add", receiver.url, "--event", "message.sent", "--key-id", str(key_id))
    assert bad.returncode != 0 and "message.received" in bad.stderr and "Traceback" not in bad.stderr

    deliver(conn, inbox(conn), T0)
    receiver.script = [410]  # gone: failed at once
    send_at(cli, T0)
    (hook,) = webhook_rows(conn)
    attempts = cli("webhook", "attempts", str(endpoint_id))
    assert attempts.returncode == 0, attempts.stderr
    assert hook["message_id"] in attempts.stdout and "failed" in attempts.stdout and "attempt 1 http: HTTP 410" in attempts.stdout
    shown = cli("outbound", "show", str(hook["id"]))  # the queue's own commands show deliveries too
    assert shown.returncode == 0 and f"webhook {endpoint_id}" in shown.stdout, shown.stderr
    listed = cli("outbound", "list", "--status", "failed")
    assert listed.returncode == 0 and f"webhook {endpoint_id}" in listed.stdout, listed.stderr
    replayed = cli("webhook", "replay", str(hook["id"]))
    assert replayed.returncode == 0, replayed.stderr
    send_at(cli, T0 + timedelta(minutes=1))
    assert row(conn, hook["id"])["status"] == "sent"
    assert len({h["webhook-id"] for h, _ in receiver.requests}) == 1 and len(receiver.delivered(secret)) == 2
    assert cli("webhook", "remove", str(endpoint_id)).returncode == 0
    gone = cli("webhook", "remove", str(endpoint_id))
    assert gone.returncode == 1 and "unknown webhook endpoint" in gone.stderr


def test_a_name_that_does_not_resolve_in_time_is_bounded_by_the_timeout(monkeypatch):
    """The URL's resolution is within --webhook-timeout too: a name server that never answers (the
    registrant's to choose) holds a slot one timeout, then 'timeout' (nothing sent); it held it for as
    long as the resolver waited before (review of 2026-12-06)."""
    import asyncio
    import time

    from mailroom.core import netguard
    from mailroom.outbound.webhooks import WebhookClient, WebhookPolicy

    async def slow_pin(*args, **kwargs):
        await asyncio.sleep(30)

    monkeypatch.setattr(netguard, "pin", slow_pin)

    async def run():
        client = WebhookClient(WebhookPolicy(timeout=0.3))
        try:
            return await client.deliver({"id": 1, "claim_token": 2, "webhook_url": "https://slow.example/h",
                                         "text_body": "{}", "message_id": "msg_1"}, "whsec_" + "A" * 32)
        finally:
            await client.aclose()

    t0 = time.monotonic()
    out = asyncio.run(run())
    assert time.monotonic() - t0 < 5
    assert out.outcome == "timeout" and "resolve" in out.error
