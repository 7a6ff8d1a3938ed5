"""One-click unsubscribe (RFC 8058, issue 27 item 2) through the HTTP face: a bulk message sent by
the real `mailroom send` to a real SMTP sink carries, per recipient, List-Unsubscribe with an
https link and List-Unsubscribe-Post; the POST a mail client makes to that link (as
`mailroom http serve`, role mailroom_http) suppresses exactly that recipient with reason
unsubscribe, once. Token mail (activation, recovery) and mail not marked bulk carry none."""

from __future__ import annotations

import re
import socket
import threading
from email import message_from_bytes, policy

import pytest
from aiosmtpd.controller import Controller

BASE = "https://mail.mailroom.test"
SEND_FLAGS = ("--poll-interval", "0.2s", "--smtp-timeout", "5s", "--shutdown-grace", "1s")


class _Sink:
    def __init__(self) -> None:
        self.received: list[tuple[list[str], bytes]] = []
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd hook name
        with self.lock:
            self.received.append((list(envelope.rcpt_tos), envelope.original_content))
        return "250 2.0.0 Ok"


@pytest.fixture
def sink():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handler = _Sink()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    handler.port = port
    yield handler
    controller.stop()


def _headers(content: bytes):
    return message_from_bytes(content, policy=policy.default)


def test_one_click_unsubscribes_exactly_its_recipient_once(conn, cli, sink, server):
    conn.execute("SELECT mailroom.upsert_sender('news', 'news@mailroom.test', '127.0.0.1', %s)", (sink.port,))
    conn.execute("SELECT mailroom.set_setting('outbound.unsubscribe_base_url', %s)", (BASE,))
    conn.execute("SELECT mailroom.set_setting('outbound.bounce_domain', 'bounces.mailroom.test')")
    mid = conn.execute(
        "SELECT mailroom.enqueue_bulk_message('news', ARRAY['u1@example.com', 'u2@example.com'], 'News', 'hello',"
        " p_bcc => ARRAY['u3@example.com'])"
    ).fetchone()[0]
    plain = conn.execute("SELECT mailroom.enqueue_message('news', ARRAY['p@example.com'], 'Receipt', 'x')").fetchone()[0]
    sent = cli("send", "--until-idle", *SEND_FLAGS, timeout=60)
    assert sent.returncode == 0, sent.stderr

    by_rcpt = {rcpts[0]: _headers(content) for rcpts, content in sink.received}
    assert sorted(by_rcpt) == ["p@example.com", "u1@example.com", "u2@example.com", "u3@example.com"]
    assert by_rcpt["p@example.com"]["List-Unsubscribe"] is None, "mail not marked bulk carries no List-Unsubscribe"
    links = {}
    for rcpt in ("u1@example.com", "u2@example.com", "u3@example.com"):
        msg = by_rcpt[rcpt]
        assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        value = msg["List-Unsubscribe"]
        https = re.search(r"<(https://[^>]+)>", value).group(1)
        assert re.search(r"<mailto:unsubscribe\+\d+-\d+-[0-9a-f]{16}@bounces\.mailroom\.test>", value)
        assert https.startswith(f"{BASE}/unsubscribe/{mid}-")
        links[rcpt] = https.removeprefix(BASE)
    assert len(set(links.values())) == 3, "each recipient has its own link"

    form = {"Content-Type": "application/x-www-form-urlencoded"}
    # a GET (a link scanner) changes nothing; a POST without One-Click is refused
    assert server.request("GET", links["u2@example.com"]).status == 200
    bad = server.request("POST", links["u2@example.com"], headers=form, body=b"List-Unsubscribe=Yes")
    assert bad.status in (400, 422) and b"MR384" in bad.body
    assert conn.execute("SELECT count(*) FROM mailroom.suppressions").fetchone()[0] == 0

    done = server.request("POST", links["u2@example.com"], headers=form, body=b"List-Unsubscribe=One-Click")
    assert done.status == 200, done.body
    assert conn.execute("SELECT address, reason, source_message FROM mailroom.suppressions").fetchall() == [
        ("u2@example.com", "unsubscribe", mid)]

    # once: after the admin removes it, the same link does nothing (and still answers 200)
    assert conn.execute("SELECT mailroom.unsuppress('u2@example.com')").fetchone()[0] is True
    again = server.request("POST", links["u2@example.com"], headers=form, body=b"List-Unsubscribe=One-Click")
    assert again.status == 200
    assert conn.execute("SELECT count(*) FROM mailroom.suppressions").fetchone()[0] == 0

    # multipart/form-data, as some clients send it; the Bcc recipient's own link
    boundary = "xYz"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"List-Unsubscribe\"\r\n\r\nOne-Click\r\n"
            f"--{boundary}--\r\n").encode()
    multi = server.request("POST", links["u3@example.com"], body=body,
                           headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert multi.status == 200, multi.body
    assert conn.execute("SELECT address FROM mailroom.suppressions").fetchall() == [("u3@example.com",)]

    # a forged token (another recipient's position under this signature): 404, nothing
    forged = re.sub(r"-(\d+)-", lambda m: f"-{int(m.group(1)) % 3 + 1}-", links["u1@example.com"], count=1)
    assert server.request("POST", forged, headers=form, body=b"List-Unsubscribe=One-Click").status == 404
    assert conn.execute("SELECT count(*) FROM mailroom.suppressions").fetchone()[0] == 1
    assert plain  # the plain message went out above without a header
    assert links["u1@example.com"].split("/")[-1] not in server.log(), "the token reached the server's log"
