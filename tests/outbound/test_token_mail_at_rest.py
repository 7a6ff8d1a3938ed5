"""No usable link at rest (issue 21, item 3): a dump of the database, keyring included, taken with
token emails queued, in flight and sent (and links handed to a stdout collector), holds no link or
code that works: every candidate in it is tried with consume_token.

The emails go to an SMTP relay outside the database (a mailroom inbox that receives one holds it,
as any mailbox does).
"""

from __future__ import annotations

import re
import subprocess

import psycopg
from outbound_support import SEND_FLAGS, add_sender

from mailroom.db import cluster as embedded

CANDIDATE_LINK = re.compile(rb"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{86}(?![A-Za-z0-9_-])")
MAILED_LINK = re.compile(r"token=([A-Za-z0-9_-]{86})")


def _dump(db_url: str) -> bytes:
    pg_dump = embedded.find_bindir() / "pg_dump"
    out = subprocess.run([str(pg_dump), "--data-only", "--schema", "mailroom", "-d", db_url],
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout


def _works(conn: psycopg.Connection, link: str, code: str | None) -> bool:
    """Whether consume_token takes it (tried in a transaction that is rolled back: nothing is used up)."""
    try:
        with conn.transaction(force_rollback=True):
            row = conn.execute("SELECT outcome FROM mailroom.consume_token(%s, %s)", (link, code)).fetchone()
    except psycopg.Error:
        return False
    return row is not None and row[0] == "consumed"


def test_a_dump_holds_no_working_link_or_code(conn, db_url, cli, smtp_server):
    relay = smtp_server()
    add_sender(conn, relay.port, name="mailroom")
    conn.execute("SELECT mailroom.set_setting('collector.link_base_url', 'https://app.example.test')")
    for n in range(6):
        conn.execute("SELECT mailroom.create_account(%s, %s)", (f"rest{n}@example.test", f"rest{n}"))
    conn.execute("UPDATE mailroom.accounts SET status = 'active' WHERE login IN ('rest4', 'rest5')")
    conn.execute("SELECT mailroom.request_password_recovery('rest4@example.test')")
    conn.execute("SELECT mailroom.request_password_recovery('rest5@example.test')")
    # what collect --enqueue does, then send: rest0, rest1, rest4's recovery are sent
    # (the first call issues the requested recovery tokens, the second enqueues them: sql/13_recovery.sql)
    assert sum(conn.execute("SELECT mailroom.enqueue_token_emails(100)").fetchone()[0] for _ in range(2)) == 6
    conn.execute("UPDATE mailroom.outbound_messages SET send_after = '2100-01-01', next_retry_at = '2100-01-01'"
                 " WHERE to_addrs[1] IN ('rest2@example.test', 'rest3@example.test', 'rest5@example.test')")
    result = cli("send", "--until-idle", *SEND_FLAGS, timeout=60)
    assert result.returncode == 0, result.stderr
    mailed = [m.message.get_body(preferencelist=("plain",)).get_content() for m in relay.handler.received]
    assert len(mailed) == 3
    # in flight: rest2 and rest5's recovery claimed by a sender that has not finalized yet
    conn.execute("UPDATE mailroom.outbound_messages SET send_after = NULL, next_retry_at = NULL"
                 " WHERE to_addrs[1] IN ('rest2@example.test', 'rest5@example.test')")
    in_flight = conn.execute("SELECT text_body FROM mailroom.claim_messages(10, 'in-flight')").fetchall()
    assert len(in_flight) == 2
    # queued: rest3's email. And a token handed to a stdout collector: rest6
    conn.execute("SELECT mailroom.create_account('rest6@example.test', 'rest6')")
    (handed,) = conn.execute("SELECT signed FROM mailroom.dequeue_tokens(10)").fetchall()

    dump = _dump(db_url)
    assert b"signing_keys" in dump and b"rest0@example.test" in dump, "the dump holds the keyring and the queue"

    # the links that work, and their codes, are outside the database only
    live = [(MAILED_LINK.search(text).group(1), (re.search(r"code ([0-9]{5})", text) or [None, None])[1])
            for text in mailed + [t for (t,) in in_flight]] + [(handed[0], None)]
    assert len(live) == 6 and all(_works(conn, link, code) for link, code in live), "the live links do work"
    for link, code in live:
        assert link.encode() not in dump
        if code is not None:
            assert not re.search(rb"(?<![0-9])" + code.encode() + rb"(?![0-9])", dump), "a code in the dump"
    # every 86-character base64url run in the dump, tried as a link (with each live code, too)
    candidates = {m.decode() for m in CANDIDATE_LINK.findall(dump)}
    codes = [None] + [code for _, code in live if code is not None]
    working = [c for c in candidates for code in codes if _works(conn, c, code)]
    assert working == [], f"{len(working)} working link(s) in the dump"
