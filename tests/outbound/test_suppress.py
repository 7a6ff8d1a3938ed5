"""The suppression list through the real CLI (`mailroom suppress add|remove|list|check`, run as
mr_admin), and end to end: a relay answering 550 at RCPT puts the recipient on the list (the only
recipient of a message, or one of several), after which the next enqueue to it is refused (MR318).
The asynchronous path (a DSN to the VERP return path) is tests/inboxes/test_bounces.py."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest
from outbound_support import SEND_FLAGS, add_sender, enqueue, row

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def at(when: datetime) -> dict[str, str]:
    return {"PGOPTIONS": f"-c mailroom.clock={when.isoformat()}"}


def test_add_check_list_remove(conn, cli):
    r = cli("suppress", "check", "alice@example.com")
    assert r.returncode == 1 and r.stdout.strip() == "not suppressed"

    r = cli("suppress", "add", " <Alice@Example.com>", "--reason", "complaint")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("suppressed (entry ")

    r = cli("suppress", "check", "ALICE@example.com")
    assert r.returncode == 0 and r.stdout.strip() == "suppressed"
    assert conn.execute("SELECT mailroom.is_suppressed('alice@example.com')").fetchone()[0] is True

    r = cli("suppress", "list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["ADDRESS", "REASON", "ACTIVE"]
    assert lines[1].split()[:3] == ["alice@example.com", "complaint", "yes"]

    r = cli("suppress", "remove", "alice@example.com")
    assert r.returncode == 0 and r.stdout.strip() == "removed"
    r = cli("suppress", "remove", "alice@example.com")
    assert r.returncode == 1
    assert r.stderr.strip() == "mailroom: error: the address is not on the suppression list"
    assert cli("suppress", "list").stdout.strip() == "no suppressions"


def test_bad_input_is_one_line_without_the_address(cli):
    r = cli("suppress", "add", "not-an-address")
    assert r.returncode == 2
    assert r.stderr.startswith("mailroom: error:") and "not-an-address" not in r.stderr
    assert "Traceback" not in r.stderr
    r = cli("suppress", "add", "a@example.com", "--reason", "spam")
    assert r.returncode == 2 and "--reason" in r.stderr


def test_expiry_follows_the_database_clock(cli):
    r = cli("suppress", "add", "temp@example.com", "--for", "1d", env=at(T0))
    assert r.returncode == 0, r.stderr
    assert cli("suppress", "check", "temp@example.com", env=at(T0.replace(hour=23))).returncode == 0
    r = cli("suppress", "check", "temp@example.com", env=at(T0.replace(day=2)))
    assert r.returncode == 1 and r.stdout.strip() == "not suppressed"
    r = cli("suppress", "list", env=at(T0.replace(day=2)))
    assert r.stdout.splitlines()[1].split()[:3] == ["temp@example.com", "manual", "no"]


def test_a_550_at_rcpt_suppresses_the_recipient(conn, cli, smtp_server):
    server = smtp_server("reply_rcpt", "550 5.1.1 <gone@example.com> user unknown")
    add_sender(conn, server.port)
    (mid,) = enqueue(conn, 1, to=["Gone@Example.com"])

    result = cli("send", "--until-idle", *SEND_FLAGS, env=at(T0), timeout=30)
    assert result.returncode == 0, result.stderr
    assert row(conn, mid)["status"] == "failed"

    r = cli("suppress", "check", "gone@example.com")
    assert r.returncode == 0 and r.stdout.strip() == "suppressed"
    r = cli("suppress", "list")
    assert r.stdout.splitlines()[1].split()[:4] == ["gone@example.com", "hard_bounce", "yes", str(mid)]

    with pytest.raises(psycopg.Error) as err:
        enqueue(conn, 1, to=["gone@example.com"])
    assert err.value.sqlstate == "MR318"
    assert "@" not in str(err.value)

    # removed from the list, the address can be written to again
    assert cli("suppress", "remove", "gone@example.com").returncode == 0
    assert enqueue(conn, 1, to=["gone@example.com"])


def test_a_550_at_rcpt_for_one_of_several_recipients_suppresses_that_one(conn, cli, smtp_server):
    server = smtp_server("accept", "550 5.1.1 <gone@example.com> user unknown")
    server.handler.refuse = ("Gone@Example.com",)
    add_sender(conn, server.port)
    (mid,) = enqueue(conn, 1, to=["ok@example.com", "Gone@Example.com"], cc=["cc@example.com"])

    result = cli("send", "--until-idle", *SEND_FLAGS, env=at(T0), timeout=30)
    assert result.returncode == 0, result.stderr
    assert row(conn, mid)["status"] == "sent"  # the relay took it for the two others
    assert [r.rcpt_tos for r in server.handler.received] == [["ok@example.com", "cc@example.com"]]

    r = cli("suppress", "list")
    assert [line.split()[:4] for line in r.stdout.splitlines()[1:]] == [["gone@example.com", "hard_bounce", "yes", str(mid)]]
    assert conn.execute(
        "SELECT outcome, recipient, action, status FROM mailroom.outbound_bounces WHERE message_id = %s", (mid,)
    ).fetchall() == [("hard_bounce", "to[2]", "refused", "5.1.1")]
    with pytest.raises(psycopg.Error) as err:
        enqueue(conn, 1, to=["ok@example.com", "gone@example.com"])
    assert err.value.sqlstate == "MR318"
    assert enqueue(conn, 1, to=["ok@example.com"])


def test_every_recipient_refused_at_rcpt_finalize_picks_the_refusal_that_governs(conn, cli, smtp_server):
    """The relay refuses one recipient for now (451) and one for good (550): the message is retried
    (SQL chose the transient refusal), the 550 one is suppressed; refused for good by both: failed."""
    server = smtp_server("accept")
    server.handler.refuse_with = {"later@example.com": "451 4.2.1 <later@example.com> try again",
                                  "gone@example.com": "550 5.1.1 <gone@example.com> user unknown"}
    add_sender(conn, server.port)
    (mid,) = enqueue(conn, 1, to=["gone@example.com", "later@example.com"])
    result = cli("send", "--until-idle", *SEND_FLAGS, env=at(T0), timeout=30)
    assert result.returncode == 0, result.stderr
    message = row(conn, mid)
    assert (message["status"], message["last_smtp_code"], message["last_enhanced_code"]) == ("queued", 451, "4.2.1")
    assert "2 of 2 recipients refused" in message["error_log"]
    assert cli("suppress", "check", "gone@example.com").returncode == 0
    assert cli("suppress", "check", "later@example.com").returncode == 1

    server.handler.refuse_with = {"once@example.com": "550 5.1.1 <once@example.com> user unknown",
                                  "twice@example.com": "553 5.1.3 <twice@example.com> bad address"}
    (failed,) = enqueue(conn, 1, to=["once@example.com", "twice@example.com"])
    result = cli("send", "--until-idle", *SEND_FLAGS, env=at(T0), timeout=30)
    assert result.returncode == 0, result.stderr
    assert (row(conn, failed)["status"], row(conn, failed)["last_smtp_code"]) == ("failed", 550)


def test_drop_setting_queues_for_the_others_and_show_says_so(conn, cli):
    add_sender(conn, 2525)
    assert cli("suppress", "add", "gone@example.com").returncode == 0
    conn.execute("SELECT mailroom.set_setting('outbound.drop_suppressed_recipients', 'true')")
    (mid,) = enqueue(conn, 1, to=["ok@example.com", "gone@example.com"])
    assert row(conn, mid)["to_addrs"] == ["ok@example.com"]
    shown = cli("outbound", "show", str(mid))
    assert shown.returncode == 0, shown.stderr
    assert any(line.split() == ["suppressed_recipients", "to[2]"] for line in shown.stdout.splitlines())
    assert "gone@" not in shown.stdout
