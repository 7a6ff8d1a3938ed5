"""Attachments on outbound mail (issue 27, item 5): enqueued from SQL, sent by `mailroom send`,
received byte for byte as the standard library builds the same message, intact, DKIM-signed."""

from __future__ import annotations

import base64
import email.utils
import json
import re
from email import message_from_bytes, policy
from email.contentmanager import raw_data_manager
from email.message import EmailMessage

import dkim
import psycopg
import pytest
from outbound_support import SEND_FLAGS, add_sender, dkim_record

BINARY = bytes(range(256)) * 40  # every byte value, 10 KB: several base64 lines
TEXT = "héllo wörld\nsecond line\n".encode()
ATTACHMENTS = [
    {"name": "bytes.bin", "content_type": "application/octet-stream", "content_base64": base64.b64encode(BINARY).decode()},
    {"name": "résumé.txt", "content_type": "text/plain", "content_base64": base64.b64encode(TEXT).decode()},
]
_BOUNDARY = re.compile(rb'boundary="([^"]+)"')


def _enqueue(conn, attachments=ATTACHMENTS) -> int:
    return conn.execute(
        "SELECT mailroom.enqueue_message_with_attachments('main', ARRAY['ann@example.com'], 'Report',"
        " 'see attached', %s, p_html_body => '<p>see attached</p>')",
        (json.dumps(attachments),),
    ).fetchone()[0]


def _stdlib(conn, message_id: int, outer: str, inner: str) -> bytes:
    """The same message built by the standard library alone (compat32 at 78 columns, CRLF, the
    policy mailroom's builder is proven byte-identical to in test_message_build), with the
    boundaries the sent message chose."""
    created_at, mid = conn.execute(
        "SELECT created_at, message_id FROM mailroom.outbound_messages WHERE id = %s", (message_id,)
    ).fetchone()
    msg = EmailMessage(policy=policy.compat32.clone(linesep="\r\n", max_line_length=78))
    msg["Subject"] = "Report"
    msg["From"] = "noreply@mailroom.test"
    msg["To"] = "ann@example.com"
    msg["Date"] = email.utils.format_datetime(created_at)
    msg["Message-ID"] = mid
    msg.set_content("see attached", content_manager=raw_data_manager)
    msg.add_alternative("<p>see attached</p>", subtype="html", content_manager=raw_data_manager)
    msg.set_boundary(inner)
    msg.add_attachment(BINARY, "application", "octet-stream", filename="bytes.bin", content_manager=raw_data_manager)
    msg.add_attachment(TEXT, "text", "plain", filename=("utf-8", "", "résumé.txt"), content_manager=raw_data_manager)
    msg.set_boundary(outer)
    return msg.as_bytes()


def test_attachments_arrive_intact_as_the_stdlib_builds_them(conn, cli, smtp_server):
    server = smtp_server()
    add_sender(conn, server.port)
    message_id = _enqueue(conn)
    sent = cli("send", "--until-idle", *SEND_FLAGS)
    assert sent.returncode == 0, sent.stderr
    [received] = server.handler.received
    content = received.content

    outer, inner = (b.decode() for b in _BOUNDARY.findall(content)[:2])
    assert content == _stdlib(conn, message_id, outer, inner)

    back = message_from_bytes(content, policy=policy.default)
    assert back.get_content_type() == "multipart/mixed"
    parts = list(back.iter_attachments())
    assert [(p.get_filename(), p.get_content_type()) for p in parts] == [
        ("bytes.bin", "application/octet-stream"), ("résumé.txt", "text/plain"),
    ]
    assert parts[0].get_payload(decode=True) == BINARY
    assert parts[1].get_payload(decode=True) == TEXT
    assert back.get_body(("plain",)).get_content().strip() == "see attached"


def test_a_message_with_attachments_verifies_under_dkim(conn, cli, smtp_server, tmp_path):
    server = smtp_server()
    add_sender(conn, server.port, from_address="news@mailroom.test")
    key_file = tmp_path / "dkim.pem"
    made = cli("outbound", "dkim", "keygen", "main", "--selector", "att", "--key-file", str(key_file))
    assert made.returncode == 0, made.stderr
    name, value = dkim_record(made.stdout)
    _enqueue(conn)
    sent = cli("send", "--until-idle", *SEND_FLAGS, env={"MAILROOM_DKIM_KEY_FILE": str(key_file)})
    assert sent.returncode == 0, sent.stderr
    [received] = server.handler.received
    dns = {name.encode(): value.encode()}
    assert received.content.startswith(b"DKIM-Signature:")
    assert dkim.verify(received.content, dnsfunc=lambda n, timeout=5: dns.get(n.rstrip(b".")))
    assert b"multipart/mixed" in received.content


def test_a_bad_attachment_is_refused_with_its_code(conn):
    add_sender(conn, 2525)
    for bad, code in (
        ([{"name": "a/b.txt", "content_type": "text/plain", "content_base64": "eA=="}], "MR385"),
        ([{"name": "a.txt", "content_type": "text", "content_base64": "eA=="}], "MR385"),
    ):
        with pytest.raises(psycopg.Error) as caught:
            _enqueue(conn, bad)
        assert caught.value.sqlstate == code
