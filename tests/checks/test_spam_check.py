"""The spam check (docs/checks.md) against a real SpamAssassin spamd the test starts (Debian's rules,
network tests off): GTUBE scores as spam with its rule, a plain message does not."""

from __future__ import annotations

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
    import socket

    import pytest

    from mailroom.checks import spam

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with pytest.raises(spam.SpamdFailed, match="spamd cannot be reached"):
        asyncio.run(spam.check(_raw("x", "hello"), spam.Spamd("127.0.0.1", port), timeout=5))
