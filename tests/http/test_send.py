"""Send over HTTP (issue 44, item 9): `POST /api/v1/send` against the real servers.

A key granted a sender (`mailroom apikey grant-sender`) sends Mailpit's request shape; the real sender
(`mailroom send --until-idle`) delivers it over SMTP on 127.0.0.1 to the real `mailroom inbox serve`,
where it is read back. The refusals, each as its HTTP status and MR code: a key without a grant (403),
a recipient outside send.allowed_recipients (403), over send.rate_per_key (429, Retry-After), a line
break in the Subject or a Name (400), a field it does not know (400), a body over its bound (413).
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from http_support import wait_for_log

from mailroom.http import models


@pytest.fixture
def inbound_port(cli_popen, tmp_path: Path) -> Iterator[int]:
    log_path = tmp_path / "inbound.log"
    with open(log_path, "w") as log_file:
        proc = cli_popen("inbox", "serve", "--host", "127.0.0.1", "--port", "0", stdout=subprocess.DEVNULL,
                         stderr=log_file)
    yield int(wait_for_log(log_path, r"listening on 127\.0\.0\.1:(\d+)", proc).group(1))
    proc.terminate()
    proc.wait(timeout=10)


def _key(conn, owner: str) -> tuple[int, str]:
    key = "mrk_" + secrets.token_urlsafe(24)
    key_id = conn.execute("SELECT mailroom.create_api_key(%s, %s)",
                          (owner, hashlib.sha256(key.encode()).digest())).fetchone()[0]
    return key_id, key


def test_a_granted_key_sends_a_mail_that_the_sender_delivers(server, inbound_port, conn, cli):
    key_id, key = _key(conn, "team-send")
    target = server.request("POST", "/api/v1/mailboxes", token=key).json()["address"]
    conn.execute("SELECT mailroom.upsert_sender('relay', 'robot@send.example', '127.0.0.1', %s)", (inbound_port,))
    conn.execute("SELECT mailroom.set_setting('send.allowed_recipients', %s)", (f"*@{target.split('@')[1]}",))
    mail = {
        "From": {"Email": "robot@send.example", "Name": "Robot"},
        "To": [{"Email": target, "Name": "QA"}],
        "ReplyTo": [{"Email": "help@send.example"}],
        "Subject": "Your receipt",
        "Text": "Thanks for your order 42.",
        "HTML": "<p>Thanks for your order <b>42</b>.</p>",
        "Headers": {"X-Campaign": "spring"},
        "Attachments": [{"Content": base64.b64encode(b"order,42\n").decode(), "Filename": "order.csv",
                         "ContentType": "text/csv"}],
    }

    refused = server.request("POST", "/api/v1/send", token=key, body=mail)
    assert (refused.status, refused.error_code) == (403, "MR374"), refused.body  # no grant yet
    granted = cli("apikey", "grant-sender", str(key_id), "relay")
    assert (granted.returncode, granted.stdout.strip()) == (0, "granted"), granted.stderr
    listed = cli("apikey", "senders", str(key_id), "--json")
    assert json.loads(listed.stdout)["sender"] == "relay", listed.stdout

    sent = server.request("POST", "/api/v1/send", token=key, body=mail, headers={"Idempotency-Key": "order-42"})
    assert sent.status == 200, sent.body
    answer = sent.json()
    assert set(answer) == set(models.Sent.model_fields)  # the model documents the answer, key for key
    assert (answer["ID"], answer["sender"]) == (str(answer["outbound_id"]), "relay")
    again = server.request("POST", "/api/v1/send", token=key, body=mail, headers={"Idempotency-Key": "order-42"})
    assert again.json() == answer  # the same Idempotency-Key: the same message, not a second one

    done = cli("send", "--until-idle")
    assert done.returncode == 0, done.stderr
    deadline = time.monotonic() + 10
    arrived: list = []
    while not arrived and time.monotonic() < deadline:
        arrived = server.request("GET", f"/api/v1/mailboxes/{target}/messages", token=key).json()
        time.sleep(0.1)
    assert len(arrived) == 1, "the message sent over HTTP did not arrive"
    read = server.request("GET", f"/api/v1/mailboxes/{target}/messages/{arrived[0]['id']}", token=key).json()
    assert (read["subject"], read["body_text"].strip()) == ("Your receipt", "Thanks for your order 42.")
    assert "<b>42</b>" in read["body_html"]
    assert [(a["filename"], a["content_type"]) for a in read["attachments"]] == [("order.csv", "text/csv")]
    raw = server.request("GET", f"/api/v1/mailboxes/{target}/messages/{arrived[0]['id']}/raw", token=key).body
    head = raw[: raw.index(b"\r\n\r\n")].decode()
    assert "\r\nFrom: robot@send.example\r\n" in "\r\n" + head, head
    assert f"\r\nMessage-ID: {answer['message_id']}\r\n" in "\r\n" + head, head
    assert "\r\nReply-To: help@send.example\r\n" in "\r\n" + head and "\r\nX-Campaign: spring\r\n" in "\r\n" + head
    assert conn.execute("SELECT count(*) FROM mailroom.audit_log WHERE action = 'send' AND key_id = %s",
                        (key_id,)).fetchone()[0] == 1

    revoked = cli("apikey", "revoke-sender", str(key_id), "relay")
    assert (revoked.returncode, revoked.stdout.strip()) == (0, "revoked"), revoked.stderr
    after = server.request("POST", "/api/v1/send", token=key, body=mail)
    assert (after.status, after.error_code) == (403, "MR374")


def test_the_refusals_answer_their_status_and_code(server, conn, cli):
    key_id, key = _key(conn, "team-refused")
    conn.execute("SELECT mailroom.upsert_sender('refusals', 'robot@refused.example', '127.0.0.1', 9)")
    assert cli("apikey", "grant-sender", str(key_id), "refusals").returncode == 0
    conn.execute("SELECT mailroom.set_setting('send.allowed_recipients', '*@allowed.example')")
    conn.execute("SELECT mailroom.set_setting('send.rate_per_key', '3/h')")
    mail = {"To": [{"Email": "qa@allowed.example"}], "Subject": "Hello", "Text": "Hi"}

    def send(body: dict, token: str | None = key):
        return server.request("POST", "/api/v1/send", token=token, body=body)

    assert (send(mail, None).status, send(mail, None).error_code) == (401, "MR240")
    session = server.request("POST", "/api/v1/mailboxes").json()["session_token"]
    assert (send(mail, session).status, send(mail, session).error_code) == (401, "MR241")
    outside = send({**mail, "Cc": ["boss@elsewhere.example"]})
    assert (outside.status, outside.error_code) == (403, "MR021")
    assert "send.allowed_recipients" in outside.json()["detail"]
    crlf = send({**mail, "Subject": "Hello\r\nBcc: everyone@allowed.example"})
    assert (crlf.status, crlf.error_code) == (400, "MR376")
    named = send({**mail, "To": [{"Email": "qa@allowed.example", "Name": "QA\nBcc: x@allowed.example"}]})
    assert (named.status, named.error_code) == (400, "MR376")
    tagged = send({**mail, "Tags": ["x"]})
    assert (tagged.status, tagged.error_code) == (400, "MR375")
    assert "'Tags'" in tagged.json()["detail"]
    assert send({**mail, "To": "qa@allowed.example"}).status == 422  # a type the model refuses
    many = send({**mail, "Bcc": [f"b{n}@allowed.example" for n in range(10)]})
    assert (many.status, many.error_code) == (400, "MR377")

    # send.rate_per_key 3/h: three sent (the refusals above counted none), then 429 with Retry-After
    answers = [send(mail) for _ in range(4)]
    assert [a.status for a in answers] == [200, 200, 200, 429], [a.body for a in answers]
    assert answers[3].error_code == "MR020" and 0 < int(answers[3].headers["retry-after"]) <= 3600
    assert conn.execute("SELECT count(*) FROM mailroom.audit_log WHERE action = 'send' AND key_id = %s",
                        (key_id,)).fetchone()[0] == 3


def test_a_body_over_its_bound_is_refused_before_it_is_read(server):
    from mailroom.api.edge import bound_of

    bound = bound_of("POST", "/api/v1/send").max_bytes
    assert bound == 4 * 1024 * 1024
    base = urlsplit(server.base)
    conn = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
    try:
        conn.putrequest("POST", "/api/v1/send")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(bound + 1))
        conn.endheaders()
        reply = conn.getresponse()
        status, body = reply.status, reply.read()
    finally:
        conn.close()
    assert status == 413, body
    assert json.loads(body)["error"]["code"] == "MR030"
