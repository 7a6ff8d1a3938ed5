"""Fault injection and release over the HTTP API, against the real servers (issue 35, items 4 and 5).

Issue 45, item 1 (release is forwarding, not relaying): the attack review's 200 releases by one key
are refused past release.rate_per_key with MR020 and 429, and its forged `From:` in the release
sender's own domain is queued From the release sender, the original kept in X-Original-From.

A fault set with `PUT …/fault` is answered by the real `mailroom inbox serve` at the chosen stage; a
message delivered over SMTP to a real inbox, released with `POST …/messages/{id}/release`, is sent
by the real sender (`mailroom send --until-idle`) through the outbound queue to a second inbox of
the same server, where it arrives as it was received, under its Resent- block.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import smtplib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from http_support import wait_for_log

from mailroom.http.credentials import cookie_name, csrf_token


class Inbound:
    def __init__(self, port: int) -> None:
        self.port = port

    def send(self, to: str, message: bytes) -> tuple[tuple[int, bytes], tuple[int, bytes] | None]:
        """One transaction: the RCPT reply, and the DATA reply when RCPT was accepted."""
        with smtplib.SMTP("127.0.0.1", self.port, timeout=30) as client:
            client.ehlo()
            client.mail("app@example.org")
            rcpt = client.rcpt(to)
            if rcpt[0] != 250:
                client.rset()
                return rcpt, None
            return rcpt, client.data(message)


@pytest.fixture
def inbound(cli_popen, tmp_path: Path) -> Iterator[Inbound]:
    log_path = tmp_path / "inbound.log"
    with open(log_path, "w") as log_file:
        proc = cli_popen("inbox", "serve", "--host", "127.0.0.1", "--port", "0", stdout=subprocess.DEVNULL,
                         stderr=log_file)
    port = int(wait_for_log(log_path, r"listening on 127\.0\.0\.1:(\d+)", proc).group(1))
    yield Inbound(port)
    proc.terminate()
    proc.wait(timeout=10)


def _key(conn, owner: str) -> str:
    key = "mrk_" + secrets.token_urlsafe(24)
    conn.execute("SELECT mailroom.create_api_key(%s, %s)", (owner, hashlib.sha256(key.encode()).digest()))
    return key


def test_a_fault_set_over_http_is_answered_by_the_real_server(server, inbound):
    box = server.request("POST", "/api/v1/mailboxes").json()
    address, token = box["address"], box["session_token"]
    assert box["fault"] is None
    path = f"/api/v1/mailboxes/{address}/fault"
    missing = server.request("GET", path, token=token)
    assert (missing.status, missing.error_code) == (404, "MR270")
    bad = server.request("PUT", path, token=token, body={"stage": "rcpt", "reply": "250 2.0.0 fine"})
    assert (bad.status, bad.error_code) == (400, "MR231")
    assert server.request("PUT", path, body={"stage": "rcpt", "reply": "451 4.3.0 x"}).status == 401

    put = server.request("PUT", path, token=token,
                         body={"stage": "rcpt", "reply": "451 4.7.1 Greylisted over HTTP", "count": 1})
    assert put.status == 200, put.body
    assert {k: put.json()[k] for k in ("scope", "stage", "reply", "remaining", "fired", "active")} == {
        "scope": "inbox", "stage": "rcpt", "reply": "451 4.7.1 Greylisted over HTTP", "remaining": 1, "fired": 0,
        "active": True}
    assert server.request("GET", f"/api/v1/mailboxes/{address}", token=token).json()["fault"]["stage"] == "rcpt"

    message = b"Subject: retry me\r\n\r\nhello\r\n"
    assert inbound.send(address, message) == ((451, b"4.7.1 Greylisted over HTTP"), None)
    rcpt, data = inbound.send(address, message)  # count 1: the retry goes through
    assert rcpt[0] == 250 and data is not None and data[0] == 250
    shown = server.request("GET", path, token=token).json()
    assert (shown["fired"], shown["remaining"], shown["active"]) == (1, 0, False)

    # after DATA: stored, then the error (what a lost acknowledgement looks like to a client)
    assert server.request("PUT", path, token=token,
                          body={"stage": "after_data", "reply": "554 5.7.1 Stored but refused"}).status == 200
    assert inbound.send(address, message)[1] == (554, b"5.7.1 Stored but refused")
    assert server.request("GET", f"/api/v1/mailboxes/{address}", token=token).json()["message_count"] == 2

    # the page's way: its cookie, and the CSRF header with every change (without it: 403 42501, the fault stays)
    cookie = {"Cookie": f"{cookie_name(address)}={token}"}
    refused = server.request("DELETE", path, headers=cookie)
    assert (refused.status, refused.error_code) == (403, "42501")
    assert server.request("GET", path, headers=cookie).json()["stage"] == "after_data"
    cleared = server.request("DELETE", path, headers={**cookie, "X-CSRF-Token": csrf_token(token)})
    assert cleared.json() == {"deleted": True}
    assert server.request("DELETE", path, token=token).json() == {"deleted": False}
    assert inbound.send(address, message)[1][0] == 250


def test_a_captured_message_released_over_http_arrives_with_its_resent_block(server, inbound, conn, cli):
    key = _key(conn, "team-release")
    source = server.request("POST", "/api/v1/mailboxes", token=key).json()["address"]
    target = server.request("POST", "/api/v1/mailboxes", token=key).json()["address"]
    conn.execute("SELECT mailroom.upsert_sender('relay', 'robot@mailroom.test', '127.0.0.1', %s)", (inbound.port,))

    assert server.request("GET", "/api/v1/release").json() == {"enabled": False, "senders": []}
    original = (b"From: Shop <billing@shop.example.org>\r\nTo: " + source.encode() + b"\r\nSubject: Invoice 42\r\n"
                b"Message-ID: <inv42@shop.example.org>\r\n\r\nPay 12 EUR by Friday.\r\n")
    assert inbound.send(source, original)[1][0] == 250
    listed = server.request("GET", f"/api/v1/mailboxes/{source}/messages", token=key).json()
    message_id = listed[0]["id"]
    release = f"/api/v1/mailboxes/{source}/messages/{message_id}/release"
    off = server.request("POST", release, token=key, body={"to": target})
    assert (off.status, off.error_code) == (403, "MR395")

    conn.execute("SELECT mailroom.set_setting('release.senders', 'relay')")
    assert server.request("GET", "/api/v1/release").json() == {"enabled": True, "senders": ["relay"]}
    nowhere = server.request("POST", release, token=key, body={"to": target})
    assert (nowhere.status, nowhere.error_code) == (403, "MR021")  # release.allowed_recipients: empty allows none
    conn.execute("SELECT mailroom.set_setting('release.allowed_recipients', %s)",
                 (f"*@{target.split('@')[1]},blocked@example.com",))
    wrong = server.request("POST", release, token=key, body={"to": target, "sender": "nope"})
    assert (wrong.status, wrong.error_code) == (403, "MR396")
    bad = server.request("POST", release, token=key, body={"to": "not an address"})
    assert (bad.status, bad.error_code) == (400, "MR303")
    conn.execute("SELECT mailroom.suppress('blocked@example.com', 'manual')")
    suppressed = server.request("POST", release, token=key, body={"to": "blocked@example.com"})
    assert (suppressed.status, suppressed.error_code) == (409, "MR318")

    done = server.request("POST", release, token=key, body={"to": target})
    assert done.status == 200, done.body
    assert {k: done.json()[k] for k in ("to", "sender")} == {"to": target, "sender": "relay"}

    sent = cli("send", "--until-idle")
    assert sent.returncode == 0, sent.stderr
    deadline = time.monotonic() + 10
    arrived: list = []
    while not arrived and time.monotonic() < deadline:
        arrived = server.request("GET", f"/api/v1/mailboxes/{target}/messages", token=key).json()
        time.sleep(0.1)
    assert len(arrived) == 1, "the released message did not arrive"
    status = conn.execute("SELECT status FROM mailroom.outbound_messages WHERE id = %s",
                          (done.json()["outbound_id"],)).fetchone()[0]
    assert status == "sent"
    raw = server.request("GET", f"/api/v1/mailboxes/{target}/messages/{arrived[0]['id']}/raw", token=key).body
    # the target inbox's own Received: on top (issue 44), then the Resent- block, then the message as the
    # first inbox stored it: its Received: and the client's bytes (docs/inboxes.md, Received:)
    received = re.compile(rb"\AReceived: from [^\r\n]*\r\n\tby [^\r\n]* \(mailroom\) with [^\r\n]*\r\n\t[^\r\n]*\r\n")
    top = received.match(raw)
    assert top, raw[:300]
    resent = raw[top.end():]
    assert resent.startswith(b"Resent-Date: "), resent[:200]
    head = resent[: resent.index(b"From: Shop")].decode()
    assert f"\r\nResent-From: robot@mailroom.test\r\nResent-To: {target}\r\nResent-Message-ID: <" in head
    stored = resent[resent.index(b"Received: "):]
    assert received.match(stored) and stored[received.match(stored).end():] == original, stored[:300]
    read = server.request("GET", f"/api/v1/mailboxes/{target}/messages/{arrived[0]['id']}", token=key).json()
    assert (read["subject"], read["body_text"].strip()) == ("Invoice 42", "Pay 12 EUR by Friday.")


def test_the_reviews_200_releases_by_one_key_stop_at_the_rate(server, conn, deliver):
    """The review: 200 of 200 releases answered 200. Now the key's 30 an hour (release.rate_per_key),
    spread over eight inboxes so that no inbox reaches its own 10, then 429 MR020 with Retry-After."""
    key = _key(conn, "team-flood")
    conn.execute("SELECT mailroom.upsert_sender('flood', 'robot@mailroom.test', '127.0.0.1', 9)")
    conn.execute("SELECT mailroom.set_setting('release.senders', 'flood')")
    conn.execute("SELECT mailroom.set_setting('release.allowed_recipients', '*@victim.example')")
    boxes = []
    for _ in range(8):
        address = server.request("POST", "/api/v1/mailboxes", token=key).json()["address"]
        boxes.append((address, deliver(address, "hello")))
    answers = []
    for n in range(200):
        address, message_id = boxes[n % len(boxes)]
        answers.append(server.request("POST", f"/api/v1/mailboxes/{address}/messages/{message_id}/release",
                                      token=key, body={"to": f"target{n}@victim.example"}))
    assert [a.status for a in answers] == [200] * 30 + [429] * 170, [a.status for a in answers]
    refused = answers[30]
    assert refused.error_code == "MR020"
    assert "release.rate_per_key" in refused.json()["error"]["message"]
    assert 0 < int(refused.headers["retry-after"]) <= 3600
    assert all(a.error_code == "MR020" for a in answers[30:])
    key_id = conn.execute("SELECT id FROM mailroom.api_keys WHERE owner_id = 'team-flood'").fetchone()[0]
    assert conn.execute("SELECT count(*) FROM mailroom.audit_log WHERE action = 'release' AND key_id = %s",
                        (key_id,)).fetchone()[0] == 30
    assert conn.execute("SELECT count(*) FROM mailroom.outbound_messages AS m JOIN mailroom.senders AS s "
                        "ON s.id = m.sender_id WHERE s.name = 'flood'").fetchone()[0] == 30

    # one inbox alone: its own 10 an hour (release.rate_per_inbox), whatever the key's
    other = _key(conn, "team-one-inbox")
    address = server.request("POST", "/api/v1/mailboxes", token=other).json()["address"]
    message_id = deliver(address, "hello")
    statuses = [server.request("POST", f"/api/v1/mailboxes/{address}/messages/{message_id}/release", token=other,
                               body={"to": f"t{n}@victim.example"}) for n in range(12)]
    assert [a.status for a in statuses] == [200] * 10 + [429] * 2
    assert "release.rate_per_inbox" in statuses[10].body.decode()


def test_the_reviews_forged_from_is_released_as_forwarded(server, conn, deliver):
    """The review: `From: CEO <ceo@operator.example>` (the release sender's own domain) went out under
    the sender's DKIM signature over that From. Now the queued bytes are From the release sender."""
    key = _key(conn, "team-forge")
    conn.execute("SELECT mailroom.upsert_sender('operator', 'robot@operator.example', '127.0.0.1', 9)")
    conn.execute("SELECT mailroom.set_setting('release.senders', 'operator')")
    conn.execute("SELECT mailroom.set_setting('release.allowed_recipients', '*@victim.example')")
    source = server.request("POST", "/api/v1/mailboxes", token=key).json()["address"]
    forged = (b"From: CEO <ceo@operator.example>\r\nReply-To: wire@attacker.example\r\nTo: " + source.encode()
              + b"\r\nSubject: Urgent wire\r\n\r\nPay today.\r\n")
    message_id = deliver(source, "Urgent wire", raw=forged, from_header="CEO <ceo@operator.example>")
    done = server.request("POST", f"/api/v1/mailboxes/{source}/messages/{message_id}/release", token=key,
                          body={"to": "target@victim.example"})
    assert done.status == 200, done.body
    raw = bytes(conn.execute("SELECT raw_message FROM mailroom.outbound_messages WHERE id = %s",
                             (done.json()["outbound_id"],)).fetchone()[0])
    head = raw[: raw.index(b"\r\n\r\n")].split(b"\r\n")
    froms = [line for line in head if line.lower().startswith(b"from:")]
    assert froms == [b'From: "CEO via mailroom" <robot@operator.example>'], head
    assert b"X-Original-From: CEO <ceo@operator.example>" in head
    assert b"Reply-To: wire@attacker.example" in head  # the message's own Reply-To, not a second one
    assert raw.endswith(b"\r\n\r\nPay today.\r\n")
