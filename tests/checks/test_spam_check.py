"""The spam check (docs/checks.md) against a real SpamAssassin spamd the test starts (Debian's rules,
network tests off): GTUBE scores as spam with its rule, a plain message does not. And against a hostile
spamd on 127.0.0.1 (a line over 64 KiB, a 5,000-digit Content-length, a 400-digit score, a 1 MiB report):
a 502 on nonsense, the long report read in linear time."""

from __future__ import annotations

import re
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest
from checks_support import assert_shape

from mailroom.http import models

GTUBE = "XJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X"


def _raw(subject: str, body: str) -> bytes:
    return (f"From: App <app@example.org>\r\nTo: someone@example.org\r\nSubject: {subject}\r\n"
            f"Date: Fri, 27 Nov 2026 02:00:00 +0000\r\nMessage-ID: <{subject.replace(' ', '.')}@example.org>\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\n\r\n{body}\r\n").encode()


def test_the_spam_check_over_http(serve, inbox, deliver, spamd) -> None:
    server = serve("--spamd", spamd)
    address, token = inbox(server)
    spam = deliver(address, "gtube", raw=_raw("gtube", f"This is the GTUBE, the\n{GTUBE}\n"))
    plain = deliver(address, "lunch", raw=_raw("lunch on friday", "Hi Sam, are we still on for lunch on Friday at noon?"))
    answer = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{spam}/checks/spam", token=token, timeout=30)
    assert answer.status == 200, answer.body
    doc = answer.json()
    assert_shape(doc, models.SpamCheck)
    for rule in doc["rules"]:
        assert_shape(rule, models.SpamRule)
    assert doc["is_spam"] is True and doc["score"] >= 1000 and doc["threshold"] == 5.0, doc
    gtube = next(rule for rule in doc["rules"] if rule["name"] == "GTUBE")
    assert gtube["score"] == 1000.0 and "Generic Test for Unsolicited Bulk Email" in gtube["description"]
    assert doc["rules"] == sorted(doc["rules"], key=lambda r: (-r["score"], r["name"]))
    assert abs(sum(rule["score"] for rule in doc["rules"]) - doc["score"]) < 0.2
    ham = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{plain}/checks/spam", token=token, timeout=30).json()
    assert ham["is_spam"] is False and ham["score"] < ham["threshold"], ham
    assert all(rule["name"] != "GTUBE" for rule in ham["rules"])
    # the link check is still off on this server
    off = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{plain}/checks/links", token=token)
    assert (off.status, off.error_code) == (503, "MR280")


def test_spamd_unreachable_is_named() -> None:
    import asyncio

    from mailroom.checks import spam

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(spam.SpamdFailed, match="spamd cannot be reached"):
        asyncio.run(spam.check(_raw("x", "hello"), spam.Spamd("127.0.0.1", port), timeout=5))


# -- a hostile spamd (issue 45 item 3): nonsense is a 502 with the edge's empty code, never a 500 --------

SPAMD_OK = b"SPAMD/1.1 0 EX_OK\r\n"
TABLE = b"\n pts rule name              description\n---- ---------------------- ------------------\n"
# a report of about 1 MiB: one rule, then continuation lines of its description
LONG_REPORT = b"Content analysis details:\n" + TABLE + b" 1.0 LONG_RULE            starts here\n" + (
    b"   words\n" * 116_000)
HOSTILE = {
    "long-status": b"SPAMD/1.1 0 EX_OK" + b"x" * (70 * 1024) + b"\r\nSpam: True ; 1.0 / 5.0\r\n\r\n",
    "long-header": SPAMD_OK + b"X-Pad: " + b"x" * (70 * 1024) + b"\r\nSpam: True ; 1.0 / 5.0\r\n\r\n",
    "length-digits": SPAMD_OK + b"Content-length: " + b"9" * 5000 + b"\r\nSpam: True ; 1.0 / 5.0\r\n\r\nreport",
    "score-digits": SPAMD_OK + b"Spam: True ; " + b"9" * 400 + b" / 5.0\r\nContent-length: 0\r\n\r\n",
    "threshold-digits": SPAMD_OK + b"Spam: True ; 1.0 / " + b"9" * 400 + b"\r\nContent-length: 0\r\n\r\n",
    "rule-digits": SPAMD_OK + b"Spam: True ; 1.0 / 5.0\r\n\r\n" + TABLE + b"9" * 400 + b" BIG_RULE  big\n",
    "long-report": SPAMD_OK + b"Spam: True ; 1.0 / 5.0\r\nContent-length: %d\r\n\r\n" % len(LONG_REPORT) + LONG_REPORT,
}


class _Hostile(socketserver.BaseRequestHandler):
    """Reads one REPORT request and answers the reply its Subject names (`Subject: hostile NAME`)."""

    def handle(self) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.request.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"Content-length: *([0-9]+)", head).group(1))
        while len(body) < length:
            chunk = self.request.recv(65536)
            if not chunk:
                return
            body += chunk
        name = re.search(rb"Subject: hostile ([a-z-]+)", body).group(1).decode()
        self.request.sendall(HOSTILE[name])
        self.request.shutdown(socket.SHUT_WR)


@pytest.fixture(scope="module")
def hostile_spamd() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Hostile)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_hostile_spamd_is_a_502_not_a_500(serve, inbox, deliver, hostile_spamd) -> None:
    server = serve("--spamd", hostile_spamd)
    address, token = inbox(server)
    for name in HOSTILE:
        if name == "long-report":
            continue
        message = deliver(address, name, raw=_raw(f"hostile {name}", "hello"))
        answer = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{message}/checks/spam", token=token,
                                timeout=30)
        assert answer.status == 502, (name, answer.status, answer.body[:300])
        assert answer.error_code == "", name
        assert "spamd" in answer.json()["error"]["message"], name
    # a long report is read, in linear time (on the event loop: every other request waits for it)
    message = deliver(address, "long-report", raw=_raw("hostile long-report", "hello"))
    answer = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{message}/checks/spam", token=token,
                            timeout=30)
    assert answer.status == 200, answer.body[:300]
    doc = answer.json()
    assert_shape(doc, models.SpamCheck)
    assert [rule["name"] for rule in doc["rules"]] == ["LONG_RULE"]
    assert doc["rules"][0]["description"].startswith("starts here words words")


def test_the_report_is_read_in_linear_time() -> None:
    from mailroom.checks import spam

    report = LONG_REPORT.decode()
    assert len(report) > 1_000_000
    started = time.perf_counter()
    rules = spam.rules_of(report)
    assert time.perf_counter() - started < 0.5  # generous: linear takes a few ms; rebuilding the text, seconds
    assert [rule["name"] for rule in rules] == ["LONG_RULE"]
