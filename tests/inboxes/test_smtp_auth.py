"""SMTP AUTH with the SMTP capture credential (issue 44 item 2, docs/inboxes.md "SMTP AUTH"), over real
SMTP (smtplib's `.login()`) against `mailroom inbox serve` running as mr_inbound: a login stores each
message once in its owner's capture inbox whatever its recipients; a wrong secret is 535; the sixth
failure of a client in a minute is 454; AUTH is offered on a loopback listener; `--submission` requires
it there, and the port without it takes ordinary mail as before. The loopback/TLS decision and the
failure count are unit-tested."""

from __future__ import annotations

import json
import smtplib

import pytest
from inbox_support import wait_for_log

from mailroom.inboxes.auth import FAILURE_WINDOW, MAX_FAILURES, LoginFailures, auth_needs_tls

MESSAGE = b"From: app@example.com\r\nTo: alice@gmail.com, bob@example.org\r\nSubject: welcome\r\n\r\nhello\r\n"


@pytest.mark.parametrize(("host", "needs_tls"), [
    ("127.0.0.1", False), ("127.0.0.53", False), ("::1", False), ("[::1]", False), ("localhost", False),
    ("0.0.0.0", True), ("::", True), ("", True), ("192.0.2.10", True), ("mail.example.com", True),
])
def test_auth_needs_tls_off_loopback_only(host: str, needs_tls: bool) -> None:
    assert auth_needs_tls(host) is needs_tls


def test_login_failures_block_a_client_for_the_window() -> None:
    now = [1000.0]
    failures = LoginFailures(clock=lambda: now[0])
    for _ in range(MAX_FAILURES):
        assert not failures.blocked("192.0.2.1")
        failures.failed("192.0.2.1")
    assert failures.blocked("192.0.2.1")
    assert not failures.blocked("192.0.2.2"), "another client is not held back"
    now[0] += FAILURE_WINDOW + 1
    assert not failures.blocked("192.0.2.1"), "the window passed"


def _credential(cli, owner: str = "team-1") -> dict:
    made = cli("smtpcred", "create", "--owner", owner, "--label", "ci", "--json")
    assert made.returncode == 0, made.stderr
    record = json.loads(made.stdout)
    assert record["secret"].startswith("mrs_") and record["username"].startswith("smtp-")
    return record


def _submission(start_server):
    server = start_server("--submission", "127.0.0.1:0")
    port = int(wait_for_log(server.log_path, r"AUTH required on the submission port 127\.0\.0\.1:(\d+)",
                            server.proc).group(1))
    return server, port


def _stored(conn) -> list[tuple[str, str]]:
    return conn.execute(
        "SELECT b.address, m.envelope_to FROM mailroom.messages AS m JOIN mailroom.mailboxes AS b"
        " ON b.id = m.mailbox_id ORDER BY m.id"
    ).fetchall()


def test_a_login_stores_each_message_once_in_the_capture_inbox(start_server, cli, conn) -> None:
    cred = _credential(cli)
    server, port = _submission(start_server)
    with smtplib.SMTP(server.host, port, timeout=30) as smtp:
        smtp.login(cred["username"], cred["secret"])
        refused = smtp.sendmail("app@example.com", ["alice@gmail.com", "bob@example.org"], MESSAGE)
        assert refused == {}
    stored = _stored(conn)
    assert [address for address, _ in stored] == [cred["capture_address"]], "once, in the capture inbox"
    owner = conn.execute("SELECT owner_type::text, owner_id FROM mailroom.mailboxes WHERE address = %s",
                         (cred["capture_address"],)).fetchone()
    assert owner == ("api", "team-1")
    assert "alice@gmail.com" not in server.log() and cred["username"] not in server.log()


def test_the_submission_port_requires_auth_and_the_other_takes_mail_as_before(
        start_server, cli, conn, make_mailbox) -> None:
    box = make_mailbox()
    server, port = _submission(start_server)
    with smtplib.SMTP(server.host, port, timeout=30) as smtp:
        code, _ = smtp.ehlo("client.test")
        assert code == 250 and smtp.has_extn("auth")
        code, reply = smtp.mail("app@example.com")
        assert code == 530, reply
    with smtplib.SMTP(server.host, server.port, timeout=30) as smtp:
        assert smtp.sendmail("app@example.com", [box.address], MESSAGE) == {}
        with pytest.raises(smtplib.SMTPRecipientsRefused):
            smtp.sendmail("app@example.com", ["alice@gmail.com"], MESSAGE)
    assert [address for address, _ in _stored(conn)] == [box.address]


def test_auth_is_offered_in_ehlo_on_a_loopback_listener(server) -> None:
    with smtplib.SMTP(server.host, server.port, timeout=30) as smtp:
        smtp.ehlo("client.test")
        assert smtp.has_extn("auth")
        assert set(smtp.esmtp_features["auth"].split()) == {"PLAIN", "LOGIN"}


def test_a_wrong_secret_is_535_and_the_sixth_failure_in_a_minute_454(server, cli, conn) -> None:
    cred = _credential(cli)
    codes = []
    for attempt in range(MAX_FAILURES + 1):
        with smtplib.SMTP(server.host, server.port, timeout=30) as smtp:
            smtp.ehlo("client.test")
            smtp.esmtp_features["auth"] = "PLAIN" if attempt % 2 else "LOGIN"  # one attempt per login()
            with pytest.raises(smtplib.SMTPAuthenticationError) as refused:
                smtp.login(cred["username"], cred["secret"] + "x")
            codes.append(refused.value.smtp_code)
    assert codes == [535] * MAX_FAILURES + [454]
    with smtplib.SMTP(server.host, server.port, timeout=30) as smtp, \
            pytest.raises(smtplib.SMTPAuthenticationError) as refused:
        smtp.login(cred["username"], cred["secret"])
    assert refused.value.smtp_code == 454, "until the window passes, even the right secret"
    assert cred["secret"] not in server.log()


def test_a_revoked_credential_is_refused(server, cli) -> None:
    cred = _credential(cli)
    assert cli("smtpcred", "revoke", str(cred["credential_id"])).stdout.strip() == "revoked"
    with smtplib.SMTP(server.host, server.port, timeout=30) as smtp, \
            pytest.raises(smtplib.SMTPAuthenticationError) as refused:
        smtp.login(cred["username"], cred["secret"])
    assert refused.value.smtp_code == 535
    listed = cli("smtpcred", "list", "--owner", "team-1", "--json").stdout
    assert json.loads(listed)["revoked_at"] and "digest" not in listed and cred["secret"] not in listed


def test_auth_login_on_the_port_that_does_not_require_it_captures_too(server, cli, conn) -> None:
    cred = _credential(cli, "team-2")
    with smtplib.SMTP(server.host, server.port, timeout=30) as smtp:
        smtp.ehlo("client.test")
        smtp.esmtp_features["auth"] = "LOGIN"  # the other mechanism
        smtp.login(cred["username"], cred["secret"])
        assert smtp.sendmail("app@example.com", ["carol@example.net"], MESSAGE) == {}
    assert [address for address, _ in _stored(conn)] == [cred["capture_address"]]


@pytest.mark.parametrize(("value", "says"), [
    ("0.0.0.0:2587", "needs --tls-cert"), ("127.0.0.1", "HOST:PORT"), ("127.0.0.1:99999", "HOST:PORT"),
])
def test_a_bad_submission_listener_is_one_line_and_exit_2(cli, value: str, says: str) -> None:
    run = cli("inbox", "serve", "--port", "0", "--submission", value, timeout=120)
    assert run.returncode == 2, run.stderr
    assert says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
