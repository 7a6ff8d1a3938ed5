"""The sink (issue 44 item 1): `mailroom run --sink` accepts every recipient at every domain over real
SMTP, each an inbox made at RCPT, and any SMTP AUTH login (Mailpit's accept-any, issue 44: no
capture, stored by recipient); its HTTP face on loopback lists them without a key; without the sink the
same mail is refused (550), the same login 535 and the listing needs a key. The rules are SQL's
(pgTAP 24, 29)."""

from __future__ import annotations

import html
import json
import re
import signal
import smtplib
import socket
import time
import urllib.error
import urllib.request

import pytest

MESSAGE = b"From: dev@app.example\r\nTo: somebody\r\nSubject: sink test\r\n\r\nhello from CI\r\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cli_popen, *args: str):
    smtp_port, http_port = free_port(), free_port()
    proc = cli_popen("run", "--inbox-port", str(smtp_port), "--http-port", str(http_port), "--no-collect",
                     "--no-send", "--no-maintain", *args)
    seen = ""
    deadline = time.monotonic() + 90
    while "running: inbox" not in seen and time.monotonic() < deadline and proc.poll() is None:
        seen += proc.stderr.readline().decode()
    assert "running: inbox" in seen, seen
    return proc, smtp_port, http_port, seen


def _stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def _listing(http_port: int) -> tuple[int, object]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/v1/mailboxes", timeout=30) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def _get(http_port: int, path: str) -> tuple[int, str]:
    """GET as a browser following a link of the page (Sec-Fetch-Site: same-origin), keeping its cookies."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    request = urllib.request.Request(f"http://127.0.0.1:{http_port}{path}", headers={"Sec-Fetch-Site": "same-origin"})
    try:
        with opener.open(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_run_sink_stores_mail_for_every_address_and_lists_it_without_a_key(cli_popen, conn):
    proc, smtp_port, http_port, seen = _start(cli_popen, "--sink")
    try:
        assert "inbox (smtp 127.0.0.1:" in seen and ", sink)" in seen, seen
        with smtplib.SMTP("127.0.0.1", smtp_port, timeout=30) as smtp:
            refused = smtp.sendmail("dev@app.example", ["alice@gmail.com", "x@sub.example.com"], MESSAGE)
        assert refused == {}
        # any AUTH login succeeds (Mailpit's accept-any), PLAIN or LOGIN, and captures nothing: stored by recipient
        with smtplib.SMTP("127.0.0.1", smtp_port, timeout=30) as smtp:
            assert smtp.login("anything", "whatever")[0] == 235
            assert smtp.sendmail("dev@app.example", ["carol@example.net"], MESSAGE) == {}
        with smtplib.SMTP("127.0.0.1", smtp_port, timeout=30) as smtp:
            smtp.ehlo()
            smtp.user, smtp.password = "someone", "anything at all"
            assert smtp.auth("LOGIN", smtp.auth_login)[0] == 235
            assert smtp.sendmail("dev@app.example", ["carol@example.net"], MESSAGE) == {}
        stored = conn.execute(
            "SELECT b.address, b.plan, b.owner_type::text, count(m.id) FROM mailroom.mailboxes AS b"
            " JOIN mailroom.messages AS m ON m.mailbox_id = b.id GROUP BY 1, 2, 3 ORDER BY 1").fetchall()
        assert stored == [("alice@gmail.com", "sink", "anonymous", 1), ("carol@example.net", "sink", "anonymous", 2),
                          ("x@sub.example.com", "sink", "anonymous", 1)]
        assert conn.execute("SELECT count(*) FROM mailroom.smtp_credentials").fetchone()[0] == 0
        logged_in = conn.execute("SELECT raw FROM mailroom.messages AS m JOIN mailroom.mailboxes AS b"
                                 " ON b.id = m.mailbox_id WHERE b.address = 'carol@example.net'").fetchall()
        assert all(b" (mailroom) with ESMTPA id " in bytes(raw) for (raw,) in logged_in)  # RFC 3848
        status, boxes = _listing(http_port)
        assert status == 200, boxes
        assert sorted((b["address"], b["message_count"]) for b in boxes) == [  # type: ignore[union-attr]
            ("alice@gmail.com", 1), ("carol@example.net", 2), ("x@sub.example.com", 1)]
        assert all(b["plan"] == "sink" for b in boxes)  # type: ignore[union-attr]
        # the page: /mail lists them without a key, each link opens its inbox with the mail in it
        status, page = _get(http_port, "/mail")
        assert status == 200 and "alice@gmail.com" in page and "x@sub.example.com" in page, page
        link = re.search(r'href="(/inbox/alice%40gmail.com\?token=[^"]+)"', page) or re.search(
            r'href="(/inbox/alice@gmail.com\?token=[^"]+)"', page)
        assert link, page
        status, inbox = _get(http_port, html.unescape(link.group(1)))
        assert status == 200 and "sink test" in inbox, inbox
        # the attacker review (issue 45): a page the developer visits can rebind its own name to
        # 127.0.0.1; its requests name that host, and the open listing is not theirs (a key is asked)
        rebound = urllib.request.Request(f"http://127.0.0.1:{http_port}/api/v1/mailboxes",
                                         headers={"Host": f"evil.example:{http_port}"})
        try:
            with urllib.request.urlopen(rebound, timeout=30) as reply:
                raise AssertionError(f"answered {reply.status}: {reply.read()[:200]!r}")
        except urllib.error.HTTPError as err:
            assert err.code == 401 and json.load(err)["error"]["code"] == "MR240"
        page_req = urllib.request.Request(f"http://127.0.0.1:{http_port}/mail", headers={"Host": "evil.example"})
        try:
            with urllib.request.urlopen(page_req, timeout=30) as reply:
                body = reply.read().decode()
                raise AssertionError(f"answered {reply.status}: {body[:200]}")
        except urllib.error.HTTPError as err:
            body = err.read().decode()
            assert err.code == 401 and "alice@gmail.com" not in body
    finally:
        _stop(proc)


def test_without_the_sink_the_same_mail_is_refused_and_the_listing_needs_a_key(cli_popen, conn):
    proc, smtp_port, http_port, _seen = _start(cli_popen)
    try:
        with smtplib.SMTP("127.0.0.1", smtp_port, timeout=30) as smtp:
            with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
                smtp.sendmail("dev@app.example", ["alice@gmail.com"], MESSAGE)
        assert refused.value.recipients["alice@gmail.com"][0] == 550
        with smtplib.SMTP("127.0.0.1", smtp_port, timeout=30) as smtp:  # logins are checked: the capture credential
            with pytest.raises(smtplib.SMTPAuthenticationError) as wrong:
                smtp.login("anything", "whatever")
        assert wrong.value.smtp_code == 535
        assert conn.execute("SELECT count(*) FROM mailroom.mailboxes").fetchone()[0] == 0
        status, body = _listing(http_port)
        assert status == 401 and body["error"]["code"] == "MR240", body  # type: ignore[index]
        status, page = _get(http_port, "/mail")
        assert status == 401 and "API key" in page, page
    finally:
        _stop(proc)


def test_sink_public_goes_with_sink(cli):
    for command in (["run", "--sink-public"], ["http", "serve", "--sink-public"]):
        result = cli(*command, timeout=60)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == "mailroom: error: --sink-public goes with --sink"


def test_the_open_listing_is_for_loopback_binds_only():
    from mailroom.http.cli import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.2")
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.10", "mail.example.com"))
