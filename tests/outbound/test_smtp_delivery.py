"""End to end: `mailroom send` delivers to real aiosmtpd servers on 127.0.0.1."""

from __future__ import annotations

from email.utils import parsedate_to_datetime

import pytest
from outbound_support import SEND_FLAGS, add_sender, enqueue, row


def send(cli, *extra, env=None, timeout=30):
    result = cli("send", "--until-idle", *SEND_FLAGS, *extra, env=env, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result


def test_successful_smtp_dispatch(conn, cli, smtp_server):
    server = smtp_server()
    add_sender(conn, server.port, from_address="robot@mailroom.test")
    (mid,) = enqueue(conn, 1, to=["alice@example.com"], cc=["carol@example.com"], bcc=["bob@example.com"])
    send(cli)
    assert len(server.handler.received) == 1
    got = server.handler.received[0]
    assert got.mail_from == "robot@mailroom.test"
    assert got.rcpt_tos == ["alice@example.com", "carol@example.com", "bob@example.com"]
    stored = row(conn, mid)
    assert stored["status"] == "sent"
    assert stored["attempts"] == 1 and stored["sent_at"] is not None
    assert stored["last_smtp_code"] == 250 and stored["claim_token"] is None
    assert stored["error_log"] is None


def test_mime_multipart_construction(conn, cli, smtp_server):
    server = smtp_server()
    add_sender(conn, server.port, from_address="robot@mailroom.test")
    conn.execute(
        "SELECT mailroom.enqueue_message('main', ARRAY['alice@example.com', 'al@example.org'], 'Grüße — ünïcode',"
        " 'plain text body', '<p>html body</p>', ARRAY['carol@example.com'], ARRAY['hidden@example.com'],"
        " '{\"Reply-To\": \"help@mailroom.test\", \"X-Campaign\": \"c1\"}')"
    )
    send(cli)
    (got,) = server.handler.received
    msg = got.message
    stored = conn.execute("SELECT message_id, created_at FROM mailroom.outbound_messages").fetchone()
    assert msg.get_content_type() == "multipart/alternative"
    parts = list(msg.iter_parts())
    assert [p.get_content_type() for p in parts] == ["text/plain", "text/html"]
    assert parts[0].get_content().strip() == "plain text body"
    assert parts[1].get_content().strip() == "<p>html body</p>"
    assert msg["Subject"] == "Grüße — ünïcode"
    assert msg["From"] == "robot@mailroom.test"
    assert msg["To"] == "alice@example.com, al@example.org"
    assert msg["Cc"] == "carol@example.com"
    assert msg["Message-ID"] == stored[0]
    assert parsedate_to_datetime(msg["Date"]) == stored[1].replace(microsecond=0)
    assert msg["Reply-To"] == "help@mailroom.test" and msg["X-Campaign"] == "c1"
    assert msg["MIME-Version"] == "1.0"
    assert "Bcc" not in msg and b"hidden@example.com" not in got.content
    assert "hidden@example.com" in got.rcpt_tos
    assert all(len(line) <= 998 for line in got.content.split(b"\r\n"))


def test_text_only_message_is_single_part(conn, cli, smtp_server):
    server = smtp_server()
    add_sender(conn, server.port)
    conn.execute("SELECT mailroom.enqueue_message('main', ARRAY['a@example.com'], 's', 'just text')")
    send(cli)
    (got,) = server.handler.received
    assert got.message.get_content_type() == "text/plain"


def test_connection_reused_across_messages(conn, cli, smtp_server):
    server = smtp_server()
    add_sender(conn, server.port)
    ids = enqueue(conn, 12)
    send(cli, "--concurrency", "1", "--batch-size", "5")
    assert len(server.handler.received) == 12
    assert server.handler.sessions == 1, "one SMTP connection per relay per slot, reused across batches"
    assert {row(conn, i)["status"] for i in ids} == {"sent"}


def test_each_sender_uses_its_own_relay(conn, cli, smtp_server):
    one, two = smtp_server(), smtp_server()
    add_sender(conn, one.port, name="one", from_address="one@mailroom.test")
    add_sender(conn, two.port, name="two", from_address="two@mailroom.test")
    enqueue(conn, 3, sender="one")
    enqueue(conn, 2, sender="two")
    send(cli, "--concurrency", "2")
    assert {r.mail_from for r in one.handler.received} == {"one@mailroom.test"}
    assert len(one.handler.received) == 3 and len(two.handler.received) == 2


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_send_with_login_over_starttls(conn, cli, smtp_server, tmp_path, loop):
    """STARTTLS and AUTH on both event loops (the TLS layer wraps the transport the client's protocol
    was given to again: outbound/smtp.py)."""
    import ssl
    import subprocess

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    logins = []

    def authenticator(server, session, envelope, mechanism, auth_data):
        from aiosmtpd.smtp import AuthResult

        logins.append((auth_data.login, auth_data.password))
        return AuthResult(success=auth_data.login == b"relayuser" and auth_data.password == b"pa55 word", handled=False)

    server = smtp_server(tls_context=context, require_starttls=True, authenticator=authenticator, auth_require_tls=True)
    from outbound_support import sender_key_env

    add_sender(conn, server.port, security="starttls", username="relayuser", password="pa55 word")
    (mid,) = enqueue(conn, 1)
    send(cli, "--tls-ca-file", str(cert), "--event-loop", loop, env=sender_key_env())
    assert logins == [(b"relayuser", b"pa55 word")]
    assert len(server.handler.received) == 1 and row(conn, mid)["status"] == "sent"


def test_send_without_key_for_password_relay_is_a_config_error(conn, cli, smtp_server):
    server = smtp_server()
    add_sender(conn, server.port, username="u", password="p")
    (mid,) = enqueue(conn, 1)
    result = cli("send", "--until-idle", *SEND_FLAGS, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "mailroom: error: sender main logs in to its relay: set MAILROOM_SENDER_KEY_FILE (the sender key)"
    )
    assert row(conn, mid)["status"] == "queued" and row(conn, mid)["attempts"] == 0  # released, not lost


def test_send_with_the_wrong_sender_key_is_a_config_error(conn, cli, smtp_server, tmp_path):
    server = smtp_server()
    from mailroom.outbound.sealing import generate_keypair

    add_sender(conn, server.port, username="u", password="p")
    (mid,) = enqueue(conn, 1)
    other = tmp_path / "other.key"
    other.write_text(generate_keypair(2048)[1])
    result = cli("send", "--until-idle", *SEND_FLAGS, env={"MAILROOM_SENDER_KEY_FILE": str(other)}, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "mailroom: error: MAILROOM_SENDER_KEY_FILE cannot open the relay password of sender main: "
        "it was sealed for another sender key"
    )
    assert "Traceback" not in result.stderr
    assert row(conn, mid)["status"] == "queued" and row(conn, mid)["attempts"] == 0  # released, not lost


def test_send_rejects_bad_key_and_flags(cli):
    result = cli("send", env={"MAILROOM_SENDER_KEY_FILE": "/nonexistent/sender.key"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "mailroom: error: MAILROOM_SENDER_KEY_FILE: cannot read /nonexistent/sender.key: No such file or directory"
    )
    result = cli("send", "--reap-after", "soon")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    result = cli("send", "--concurrency", "0")
    assert result.returncode == 2 and "--concurrency" in result.stderr
    result = cli("send", "--event-loop", "tokio")
    assert result.returncode == 2
    assert result.stderr == "mailroom: error: --event-loop must be one of auto, uvloop, asyncio, got 'tokio'\n"


def test_notify_wakes_an_idle_sender(conn, cli_popen, smtp_server):
    import signal
    import time

    server = smtp_server()
    add_sender(conn, server.port)
    proc = cli_popen("send", "--poll-interval", "60s", "--smtp-timeout", "2s")
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not conn.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'mailroom-send-listen' AND query ILIKE 'LISTEN%'"
        ).fetchone():
            time.sleep(0.05)
        enqueue(conn, 1)
        started = time.monotonic()
        while time.monotonic() - started < 10 and not server.handler.received:
            time.sleep(0.02)
        assert server.handler.received, "the NOTIFY did not wake the sender"
        assert time.monotonic() - started < 5, "woken by NOTIFY, not by the 60 s poll"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0


def test_sender_refuses_to_log_in_over_cleartext_unless_allowed(conn, cli, smtp_server):
    """Issue 21.8: a relay with security none and a login that was not opted in (a row from before the
    rule) gets no AUTH: the attempt fails as a connection problem and the password never leaves."""
    from aiosmtpd.smtp import AuthResult
    from outbound_support import sender_key_env

    logins: list = []

    def authenticator(server, session, envelope, mechanism, auth_data):
        logins.append(auth_data.login)
        return AuthResult(success=True, handled=False)

    server = smtp_server(authenticator=authenticator, auth_require_tls=False)
    add_sender(conn, server.port, username="u", password="pw", allow_cleartext=True)
    conn.execute("UPDATE mailroom.senders SET smtp_allow_cleartext = false")  # as the previous release left it
    (mid,) = enqueue(conn, 1)
    result = cli("send", "--until-idle", *SEND_FLAGS, env=sender_key_env(), timeout=30)
    assert result.returncode == 0, result.stderr
    r = row(conn, mid)
    assert (r["status"], r["last_outcome"]) == ("queued", "connect")
    assert "refused to log in over cleartext" in r["error_log"]
    assert logins == [] and server.handler.sessions == 0
    conn.execute("UPDATE mailroom.senders SET smtp_allow_cleartext = true")  # the loopback opt-in
    conn.execute("UPDATE mailroom.outbound_messages SET next_retry_at = NULL")
    assert cli("send", "--until-idle", *SEND_FLAGS, env=sender_key_env(), timeout=30).returncode == 0
    assert logins == [b"u"] and row(conn, mid)["status"] == "sent"
