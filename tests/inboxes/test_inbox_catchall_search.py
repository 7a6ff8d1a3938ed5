"""Catch-all domains over SMTP, and `mailroom inbox search`: the first RCPT to an unknown address on a catch-all domain creates
its inbox (owned by the domain's owner, read with that owner's API key), within the domain's quota;
other domains still refuse unknown addresses."""

from __future__ import annotations

import smtplib

import pytest


def test_catchall_rcpt_creates_the_inbox_within_its_quota(conn, start_server):
    conn.execute("SELECT mailroom.set_catchall_domain('dev.example', 'team-qa', 'free', 1)")
    server = start_server()
    with smtplib.SMTP(server.host, server.port, timeout=10) as smtp:
        smtp.sendmail("app@example.org", ["QA-Run-1@Dev.Example"], b"Subject: hello\r\n\r\nfirst")
        with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
            smtp.sendmail("app@example.org", ["qa-run-2@dev.example"], b"Subject: hello\r\n\r\nsecond")
        assert refused.value.recipients["qa-run-2@dev.example"][0] == 550  # over the quota
        with pytest.raises(smtplib.SMTPRecipientsRefused):
            smtp.sendmail("app@example.org", ["someone@other.example"], b"Subject: x\r\n\r\nx")
    rows = conn.execute(
        "SELECT m.address, m.owner_type::text, m.owner_id, m.message_count FROM mailroom.mailboxes AS m"
        " WHERE m.catchall_domain = 'dev.example'").fetchall()
    assert rows == [("qa-run-1@dev.example", "api", "team-qa", 1)]
    listed = conn.execute("SELECT subject FROM mailroom.list_messages('qa-run-1@dev.example', null, 'api', 'team-qa')")
    assert listed.fetchall() == [("hello",)]


def test_inbox_search_command(conn, cli, make_mailbox):
    box = make_mailbox()
    for subject, text in (("Welcome aboard", "code 48213"), ("Invoice", "total due")):
        conn.execute("SELECT mailroom.deliver_message(%s, 'x', 'app@example.org', %s, null, %s)",
                     (box.address, subject, text))
    found = cli("inbox", "search", box.address, "48213", "--token", box.token)
    assert found.returncode == 0, found.stderr
    assert [line.split("\t")[3] for line in found.stdout.splitlines()] == ["Welcome aboard"]
    bad = cli("inbox", "search", box.address, "-", "--token", box.token)
    assert bad.returncode == 2 and "MR246" in bad.stderr and "Traceback" not in bad.stderr
