"""Failure handling through the real sender: 4xx backoff (pinned clock), 5xx fast fail with a
scrubbed error_log, dropped and stalled connections, max attempts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from outbound_support import SEND_FLAGS, add_sender, enqueue, row

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def send_at(cli, when: datetime, *extra):
    env = {"PGOPTIONS": f"-c mailroom.clock={when.isoformat()}"}
    result = cli("send", "--until-idle", *SEND_FLAGS, *extra, env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    return result


def test_failed_smtp_call_updates_next_retry(conn, cli, smtp_server):
    server = smtp_server("reply_rcpt", "451 4.7.1 <alice@example.com> greylisted, try again later")
    add_sender(conn, server.port)
    (mid,) = enqueue(conn, 1, to=["alice@example.com"])

    send_at(cli, T0)
    r = row(conn, mid)
    assert r["status"] == "queued"
    assert r["attempts"] == 1
    assert r["next_retry_at"] == T0 + timedelta(minutes=1)  # attempts² minutes
    assert (r["last_smtp_code"], r["last_enhanced_code"]) == (451, "4.7.1")

    send_at(cli, T0 + timedelta(seconds=59))  # not due yet: nothing happens
    assert row(conn, mid)["attempts"] == 1

    t1 = T0 + timedelta(minutes=1)
    send_at(cli, t1)
    r = row(conn, mid)
    assert r["attempts"] == 2 and r["next_retry_at"] == t1 + timedelta(minutes=4)

    t2 = t1 + timedelta(minutes=4)
    send_at(cli, t2)
    r = row(conn, mid)
    assert r["attempts"] == 3 and r["next_retry_at"] == t2 + timedelta(minutes=9)
    assert "@" not in r["error_log"] and r["error_log"].count("<redacted:") == 3


def test_backoff_policy_is_configurable(conn, cli, smtp_server):
    server = smtp_server("reply_rcpt", "450 4.2.1 mailbox busy")
    add_sender(conn, server.port)
    conn.execute("SELECT mailroom.set_setting('outbound.backoff_base', '30 seconds')")
    conn.execute("SELECT mailroom.set_setting('outbound.backoff_exponent', '3')")
    conn.execute("SELECT mailroom.set_setting('outbound.max_attempts', '2')")
    (mid,) = enqueue(conn, 1)
    send_at(cli, T0)
    assert row(conn, mid)["next_retry_at"] == T0 + timedelta(seconds=30)
    send_at(cli, T0 + timedelta(seconds=30))
    r = row(conn, mid)
    assert r["status"] == "failed" and r["attempts"] == 2 and r["next_retry_at"] is None
    assert "giving up after 2 attempts" in r["error_log"]


def test_5xx_fails_at_once_and_error_log_has_no_address(conn, cli, smtp_server):
    server = smtp_server("reply_rcpt", '550 5.1.1 <alice.smith@example.com> "Alice Smith" user unknown')
    add_sender(conn, server.port)
    (mid,) = enqueue(conn, 1, to=["alice.smith@example.com"])
    send_at(cli, T0)
    r = row(conn, mid)
    assert r["status"] == "failed" and r["attempts"] == 1
    assert (r["last_smtp_code"], r["last_enhanced_code"]) == (550, "5.1.1")
    log = r["error_log"]
    assert "alice" not in log.lower() and "@" not in log and "Smith" not in log
    assert "550 5.1.1 <redacted:" in log and "user unknown" in log
    # the same address always maps to the same tag (correlation)
    tag = conn.execute("SELECT mailroom.redact_pii('<alice.smith@example.com>')").fetchone()[0]
    assert tag in log


def test_enhanced_code_wins_over_basic_code(conn, cli, smtp_server):
    server = smtp_server("reply_data", "554 4.7.0 temporary policy failure")
    add_sender(conn, server.port)
    (mid,) = enqueue(conn, 1)
    send_at(cli, T0)
    r = row(conn, mid)
    assert r["status"] == "queued" and r["attempts"] == 1  # 4.x.x: transient despite the 554


def test_dropped_connection_is_retried(conn, cli, smtp_server):
    server = smtp_server("drop_rcpt")
    add_sender(conn, server.port)
    (mid,) = enqueue(conn, 1)
    send_at(cli, T0)
    r = row(conn, mid)
    assert (r["status"], r["attempts"], r["last_outcome"]) == ("queued", 1, "dropped")
    assert r["possibly_sent"] is False


def test_connection_lost_after_data_is_flagged_possibly_sent(conn, cli, smtp_server):
    server = smtp_server("drop_data")
    add_sender(conn, server.port)
    (mid,) = enqueue(conn, 1)
    send_at(cli, T0)
    r = row(conn, mid)
    assert (r["status"], r["last_outcome"], r["possibly_sent"]) == ("queued", "uncertain", True)


def test_stalled_server_times_out(conn, cli, smtp_server):
    server = smtp_server("stall_data")
    add_sender(conn, server.port)
    (mid,) = enqueue(conn, 1)
    send_at(cli, T0, "--smtp-timeout", "0.5s")
    r = row(conn, mid)
    assert (r["status"], r["attempts"], r["last_outcome"]) == ("queued", 1, "uncertain")
    assert r["next_retry_at"] == T0 + timedelta(minutes=1)


def test_unreachable_relay_is_transient(conn, cli):
    from outbound_support import free_port

    add_sender(conn, free_port())  # nothing listens there
    ids = enqueue(conn, 3)
    send_at(cli, T0)
    for mid in ids:
        r = row(conn, mid)
        assert (r["status"], r["attempts"], r["last_outcome"]) == ("queued", 1, "connect")


def test_relay_login_failure_is_not_the_messages_fault(conn, cli, smtp_server):
    from aiosmtpd.smtp import AuthResult
    from outbound_support import sender_key_env

    def reject(server, session, envelope, mechanism, auth_data):
        return AuthResult(success=False, handled=False)

    server = smtp_server(authenticator=reject, auth_require_tls=False)
    add_sender(conn, server.port, username="u", password="wrong")
    ids = enqueue(conn, 3)
    # one slot, so the three messages are one batch (concurrent slots' SKIP LOCKED claims may split them)
    result = cli("send", "--until-idle", "--concurrency", "1", *SEND_FLAGS, env={
        **sender_key_env(), "PGOPTIONS": f"-c mailroom.clock={T0.isoformat()}"}, timeout=30)
    assert result.returncode == 0, result.stderr
    for mid in ids:
        r = row(conn, mid)
        assert (r["status"], r["attempts"], r["last_outcome"], r["last_smtp_code"]) == ("queued", 1, "connect", 535)
    assert server.handler.sessions == 1, "a relay that refused the login is not retried within the batch"
