"""`mailroom inbox create|list|read|extend|tag|clear|delete` as a real subprocess."""

from __future__ import annotations

import json
import smtplib
from datetime import datetime

from inbox_support import as_sent

RAW = b"From: a@example.com\r\nSubject: cli test\r\n\r\nthe body\r\n"


def test_create_list_read_extend_delete(cli, conn, server):
    created = cli("inbox", "create", "--plan", "pro", "--ttl", "30m", "--json")
    assert created.returncode == 0, created.stderr
    box = json.loads(created.stdout)
    assert box["address"].endswith("@mailroom.test")
    assert len(box["session_token"]) == 32
    expires = datetime.fromisoformat(box["expires_at"])
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        assert client.sendmail("a@example.com", [box["address"]], RAW) == {}

    env = {"MAILROOM_SESSION_TOKEN": box["session_token"]}
    listed = cli("inbox", "list", box["address"], env=env)
    assert listed.returncode == 0, listed.stderr
    message_id, _, sender, state, subject = listed.stdout.strip().split("\t")
    assert (sender, state, subject) == ("a@example.com", "unread", "cli test")

    read = cli("inbox", "read", box["address"], message_id, env=env)
    assert read.returncode == 0, read.stderr
    assert "subject: cli test" in read.stdout and "the body" in read.stdout
    raw = cli("inbox", "read", box["address"], message_id, "--raw", env=env)
    # what was sent, after the Received: header inbound SMTP put in front
    assert raw.stdout.encode().endswith(RAW.replace(b"\r\n", b"\n")) or as_sent(raw.stdout.encode()) == RAW
    assert raw.stdout.startswith("Received: from ")
    assert "\tread\t" in cli("inbox", "list", box["address"], env=env).stdout

    extended = cli("inbox", "extend", box["address"], "10m", env=env)
    assert extended.returncode == 0, extended.stderr
    assert datetime.fromisoformat(extended.stdout.split(": ", 1)[1].strip()) > expires

    tagged = cli("inbox", "tag", box["address"], message_id, "Work", "q1", "--unread", "--json", env=env)
    assert tagged.returncode == 0, tagged.stderr
    assert json.loads(tagged.stdout) == {"id": int(message_id), "is_read": False, "tags": ["q1", "work"]}
    read = cli("inbox", "tag", box["address"], message_id, "--read", "--json", env=env)
    assert json.loads(read.stdout)["tags"] == ["q1", "work"] and json.loads(read.stdout)["is_read"] is True
    assert "tags: \n" in cli("inbox", "tag", box["address"], message_id, "--no-tags", env=env).stdout + "\n"
    bad = cli("inbox", "tag", box["address"], message_id, "no way", env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("mailroom: error: a tag is 1 to 64 characters")
    assert cli("inbox", "clear", box["address"], env=env).stdout.strip() == "deleted: 1"
    assert cli("inbox", "list", box["address"], env=env).stdout == ""

    assert cli("inbox", "delete", box["address"], env=env).stdout.strip() == "deleted"
    gone = cli("inbox", "list", box["address"], env=env)
    assert gone.returncode == 1
    assert gone.stderr.startswith("mailroom: error: mailbox was deleted at ")
    assert gone.stderr.strip().endswith("(SQLSTATE MR206)")


def test_text_output_and_api_owner(cli):
    created = cli("inbox", "create", "--owner-type", "api", "--owner-id", "client-1")
    assert created.returncode == 0, created.stderr
    fields = dict(line.split(": ", 1) for line in created.stdout.strip().splitlines())
    assert set(fields) == {"mailbox_id", "address", "expires_at"}  # no session token for api inboxes
    listed = cli("inbox", "list", fields["address"], "--owner-type", "api", "--owner-id", "client-1")
    assert listed.returncode == 0 and listed.stdout == ""


def test_errors_are_one_line(cli, conn):
    # bad input exits 2 (usage), a mailbox that is not there exits 1 (mailroom.core.errors.kind_of)
    cases = [
        (("inbox", "create", "--ttl", "0"), "--ttl must be a positive whole number of minutes (30m, 2h, 7d), got 0s", 2),
        (("inbox", "create", "--plan", "gold"),
         "unknown plan 'gold' (SQLSTATE MR201); SELECT name FROM mailroom.list_plans() lists the plans", 2),
        (("inbox", "list", "nobody@mailroom.test", "--token", "x"), "mailbox not found (SQLSTATE MR203)", 1),
    ]
    for args, message, code in cases:
        result = cli(*args)
        assert result.returncode == code, result
        assert result.stderr == f"mailroom: error: {message}\n"
    address = conn.execute("SELECT address FROM mailroom.create_mailbox()").fetchone()[0]
    result = cli("inbox", "list", address, "--token", "wrong")
    assert result.returncode == 1
    assert result.stderr == "mailroom: error: not authorized for this mailbox (wrong session token or owner) (SQLSTATE MR204)\n"


def test_expired_inbox_says_expired(cli, conn):
    box = conn.execute("SELECT address, session_token FROM mailroom.create_mailbox(5)").fetchone()
    result = cli("inbox", "list", box[0], "--token", box[1], env={"PGOPTIONS": "-c mailroom.clock=2099-01-01T00:00:00Z"})
    assert result.returncode == 1
    assert result.stderr.startswith("mailroom: error: mailbox expired at ")
    assert "MR205" in result.stderr


def test_a_clamped_ttl_says_so(cli):
    """The plan caps the TTL: the command says it did (issue 23), on stderr, and succeeds."""
    created = cli("inbox", "create", "--ttl", "99999m", "--json")
    assert created.returncode == 0, created.stderr
    assert created.stderr == (
        "mailroom: notice: TTL clamped to 60 minutes, the most the free plan allows (asked for 99999)\n")
    assert cli("inbox", "create", "--ttl", "99999").returncode == 2  # a number without a unit is refused


def test_plans_lists_what_create_accepts(cli):
    listed = cli("plans")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split() == ["PLAN", "DEFAULT_TTL", "MAX_TTL", "MAX_MESSAGE_BYTES",
                                                     "MAX_MESSAGES", "WHEN_FULL"]
    assert [line.split()[:3] + line.split()[-1:] for line in listed.stdout.splitlines()[1:]] == [
        ["free", "10m", "1h", "drop_oldest"], ["pro", "1h", "1d", "refuse"], ["sink", "1d", "1d", "drop_oldest"],
        ["enterprise", "1d", "1w", "refuse"]]
