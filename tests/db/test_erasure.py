"""Erasure (issue 27, item 6): the address goes everywhere it can through the real API, each call as
the role that makes it; `mailroom erase ADDRESS --yes` (as mr_admin) erases it; then every text, text[],
jsonb and bytea column of every table of schema mailroom, listed from the catalog (a table added later
is searched too), is searched for it, case-insensitively (its lowercase bytes in bytea), and holds it
nowhere; the suppression list still refuses it."""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg import sql

ADDRESS = "Person.Erase@Catch.Test"
LOWER = ADDRESS.lower()


def as_role(conn: psycopg.Connection, role: str, query: str, params: tuple = ()) -> list[tuple]:
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    try:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []
    finally:
        conn.execute("RESET ROLE")


def columns(conn: psycopg.Connection) -> list[tuple[str, str, str]]:
    """Every text-like, jsonb and bytea column of every table (and partition) of schema mailroom."""
    return conn.execute(
        """
        SELECT c.relname, a.attname, t.typname
        FROM pg_class AS c
        JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        JOIN pg_type AS t ON t.oid = a.atttypid
        WHERE c.relnamespace = 'mailroom'::regnamespace AND c.relkind = 'r'
            AND t.typname IN ('text', '_text', 'varchar', '_varchar', 'bpchar', 'json', 'jsonb', 'bytea', 'tsvector',
                              '_outbound_attachment')
        ORDER BY 1, 2
        """
    ).fetchall()


def holding(conn: psycopg.Connection, needle: str) -> list[str]:
    """table.column of every column holding needle somewhere."""
    found = []
    cols = columns(conn)
    assert len(cols) > 60, "the catalog walk finds the schema's columns"
    for table, column, typ in cols:
        ident = sql.Identifier("mailroom", table)
        col = sql.Identifier(column)
        if typ == "bytea":
            cond = sql.SQL("position(convert_to(%s, 'UTF8') IN {}) > 0").format(col)
        elif typ == "_outbound_attachment":
            # an attachment's name, or its bytes (lowercase, as they were written)
            cond = sql.SQL(
                "EXISTS (SELECT 1 FROM unnest({}) AS a WHERE strpos(lower(a.name), %(n)s) > 0"
                " OR position(convert_to(%(n)s, 'UTF8') IN a.content) > 0)"
            ).format(col)
        elif typ == "tsvector":
            # the search vector keeps words, not the address: its parts (person, erase, catch.test)
            cond = sql.SQL("{}::text ILIKE '%%' || split_part(%s, '@', 1) || '%%'").format(col)
        else:
            cond = sql.SQL("strpos(lower({}::text), %s) > 0").format(col)
        q = sql.SQL("SELECT count(*) FROM {} WHERE {}").format(ident, cond)
        if conn.execute(q, {"n": needle} if typ == "_outbound_attachment" else (needle,)).fetchone()[0]:
            found.append(f"{re.sub(r'_(default|p[0-9]+t[0-9]+)$', '', table)}.{column}")
    return sorted(set(found))


@pytest.fixture
def everywhere(conn: psycopg.Connection) -> dict[str, int]:
    """The address put everywhere a caller can put it, through the API, each call by its role."""
    conn.execute("SELECT mailroom.upsert_sender('main', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    conn.execute("SELECT mailroom.set_setting('outbound.max_attempts', '1')")
    ids: dict[str, int] = {}
    # accounts and tokens; the recovery request; a token email skipped because it is suppressed
    ids["account"] = as_role(conn, "mailroom_app", "SELECT mailroom.create_account(%s, %s)", (ADDRESS, ADDRESS))[0][0]
    as_role(conn, "mailroom_admin", "SELECT mailroom.suppress(%s, 'complaint')", (ADDRESS,))
    as_role(conn, "mailroom_collector", "SELECT mailroom.enqueue_token_emails(10)")
    as_role(conn, "mailroom_app", "SELECT mailroom.request_password_recovery(%s)", (ADDRESS.upper(),))
    assert conn.execute("SELECT count(*) FROM mailroom.suppressed_token_emails").fetchone()[0] == 1
    as_role(conn, "mailroom_admin", "SELECT mailroom.unsuppress(%s)", (ADDRESS,))
    # outbound mail: to it alone, failed with its address in the reply; to it and another, with it in
    # the subject, bodies, a header and the idempotency key
    ids["alone"] = as_role(
        conn, "mailroom_app", "SELECT mailroom.enqueue_message('main', ARRAY[%s], 'hi', 'hello')", (ADDRESS,)
    )[0][0]
    ids["shared"] = as_role(
        conn, "mailroom_app",
        "SELECT mailroom.enqueue_message('main', ARRAY['other@example.com'], %s, %s, %s, p_bcc => ARRAY[%s],"
        " p_headers => jsonb_build_object('Reply-To', %s::text), p_idempotency_key => %s)",
        (f"about {ADDRESS}", f"write to {ADDRESS.upper()}.", f"<a href='mailto:{ADDRESS}'>x</a>", ADDRESS, ADDRESS,
         f"welcome:{ADDRESS}"),
    )[0][0]
    # attachments: one named after it, one holding it in its bytes, one that does neither
    ids["attached"] = as_role(
        conn, "mailroom_app",
        "SELECT mailroom.enqueue_message_with_attachments('main', ARRAY['other@example.com', %s], 'files', 'see',"
        " jsonb_build_array("
        "jsonb_build_object('name', %s || '.vcf', 'content_type', 'text/vcard', 'content_base64', 'eA=='),"
        "jsonb_build_object('name', 'contacts.csv', 'content_type', 'text/csv',"
        " 'content_base64', encode(convert_to(%s, 'UTF8'), 'base64')),"
        "jsonb_build_object('name', 'logo.png', 'content_type', 'image/png', 'content_base64', 'iVBORw0K')))",
        (ADDRESS, ADDRESS, f"name,email\nPerson,{LOWER}\n"),
    )[0][0]
    claimed = as_role(conn, "mailroom_sender", "SELECT id, claim_token FROM mailroom.claim_messages(10, 'host:1')")
    by_id = dict(claimed)
    as_role(
        conn, "mailroom_sender",
        "SELECT * FROM mailroom.finalize_messages(%s, %s, %s, %s::int[], %s::text[], %s::text[])",
        ([ids["alone"], ids["shared"]], [by_id[ids["alone"]], by_id[ids["shared"]]], ["reply", "sent"],
         [550, None], ["5.1.1", None], [f"550 5.1.1 <{ADDRESS}> user unknown", None]),
    )
    # the hard bounce put it on the list, with that message as its source
    assert as_role(conn, "mailroom_app", "SELECT mailroom.is_suppressed(%s)", (ADDRESS,))[0][0] is True
    # inboxes: a catch-all inbox with its address (created at RCPT), a message to it, and a message
    # from it to another inbox
    as_role(conn, "mailroom_admin", "SELECT mailroom.set_catchall_domain('catch.test', %s)", (ADDRESS,))
    raw = f"From: <{ADDRESS.upper()}>\r\nTo: <{ADDRESS}>\r\nSubject: hello\r\n\r\nhello {LOWER}\r\n".encode()
    as_role(conn, "mailroom_inbound", "SELECT * FROM mailroom.check_bounce_recipient(%s, 100)", (ADDRESS,))
    as_role(conn, "mailroom_inbound", "SELECT mailroom.deliver_message(%s, %s, %s, 'hello', %s, %s)",
            (ADDRESS, raw, "someone@example.com", f"<{ADDRESS}>", f"hello {ADDRESS}"))
    other = as_role(conn, "mailroom_app", "SELECT address FROM mailroom.create_mailbox(60, 'free')")[0][0]
    as_role(conn, "mailroom_inbound", "SELECT mailroom.deliver_message(%s, %s, %s)", (other, raw, ADDRESS))
    ids["other_box"] = conn.execute("SELECT id FROM mailroom.mailboxes WHERE address = %s", (other,)).fetchone()[0]
    # a message that holds it only in a base64 attachment (issue 34): what a reader downloads decoded
    import base64

    encoded = base64.encodebytes(f"name,email\r\nPerson,{LOWER}\r\n".encode()).decode().replace("\n", "\r\n")
    hidden = (f"From: <app@example.net>\r\nSubject: contacts\r\nMIME-Version: 1.0\r\n"
              f"Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nsee file\r\n"
              f"--b\r\nContent-Type: text/csv; name=c.csv\r\nContent-Transfer-Encoding: base64\r\n\r\n{encoded}--b--\r\n")
    assert LOWER not in hidden.lower()
    third = as_role(conn, "mailroom_app", "SELECT address FROM mailroom.create_mailbox(60, 'free')")[0][0]
    as_role(conn, "mailroom_inbound", "SELECT mailroom.deliver_message(%s, %s, %s)",
            (third, hidden.encode(), "app@example.net"))
    ids["base64_box"] = conn.execute("SELECT id FROM mailroom.mailboxes WHERE address = %s", (third,)).fetchone()[0]
    # an API key owned by it; a worker whose name and what it serves hold it
    as_role(conn, "mailroom_admin", "SELECT mailroom.create_api_key(%s, sha256('k'::bytea), %s)", (ADDRESS, ADDRESS))
    as_role(conn, "mailroom_sender", "SELECT mailroom.worker_heartbeat(%s, 'sender', true, p_serves => %s)",
            (f"{ADDRESS}:1", f"smtp for {ADDRESS}"))
    return ids


def test_erase_leaves_the_address_in_no_column(conn, cli, everywhere):
    before = holding(conn, LOWER)
    # the search finds it where the API put it (so its "nothing" below means something)
    assert {"accounts.email", "accounts.login", "recovery_requests.email", "outbound_messages.to_addrs",
            "outbound_messages.subject", "outbound_messages.headers", "mailboxes.address",
            "messages.raw", "messages.envelope_to", "suppressions.address", "api_keys.owner_id",
            "catchall_domains.owner_id", "workers.serves", "outbound_idempotency_keys.key",
            "outbound_messages.attachments"} <= set(before), before

    dry = cli("erase", ADDRESS)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("dry run, nothing changed; would erase: ") and "accounts 1" in dry.stdout
    assert LOWER not in dry.stdout.lower() and LOWER not in dry.stderr.lower()
    assert holding(conn, LOWER) == before, "a dry run changes nothing"

    r = cli("erase", ADDRESS.upper(), "--yes")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("erased: ") and "mailboxes 1, messages 2," in r.stdout, r.stdout
    assert LOWER not in r.stdout.lower()

    assert holding(conn, LOWER) == []
    # the message that held it only base64-encoded is gone too (a byte search cannot see it)
    assert conn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id = %s",
                        (everywhere["base64_box"],)).fetchone()[0] == 0
    # the attachments that held it went whole; the other stays
    left = conn.execute(
        "SELECT array_agg((a).name) FROM (SELECT unnest(attachments) AS a FROM mailroom.outbound_messages"
        " WHERE id = %s) AS x", (everywhere["attached"],),
    ).fetchone()[0]
    assert left == ["logo.png"]
    # the error log held it as a redaction tag: that tag is gone too
    tag = conn.execute("SELECT mailroom_internal._redaction_tag(%s)", (LOWER,)).fetchone()[0]
    assert holding(conn, tag) == []
    # still suppressed, by its keyed hash alone
    assert as_role(conn, "mailroom_app", "SELECT mailroom.is_suppressed(%s)", (ADDRESS,))[0][0] is True
    with pytest.raises(psycopg.Error) as refused:
        as_role(conn, "mailroom_app", "SELECT mailroom.enqueue_message('main', ARRAY[%s], 's', 't')", (ADDRESS,))
    assert refused.value.sqlstate == "MR318"
    conn.rollback() if not conn.autocommit else None
    # what is not its own stays: the other recipient's mail, the other inbox
    # (the erased recipient replaced in place: the other keeps its position, issue 34)
    assert conn.execute("SELECT to_addrs, bcc_addrs FROM mailroom.outbound_messages WHERE id = %s",
                        (everywhere["shared"],)).fetchone() == (
        ["other@example.com"], [conn.execute("SELECT mailroom_internal._erased_recipient(%s)", (ADDRESS,)).fetchone()[0]])
    assert conn.execute("SELECT count(*) FROM mailroom.mailboxes WHERE id = %s",
                        (everywhere["other_box"],)).fetchone()[0] == 1


def test_erase_refuses_bad_input_with_one_line(conn, cli):
    r = cli("erase", "not an address", "--yes")
    assert r.returncode == 2
    assert r.stderr.strip() == "mailroom: error: the address to erase is not a valid email address (SQLSTATE MR006)"
    conn.execute("SELECT mailroom.upsert_sender('main', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    r = cli("erase", "NoReply@mailroom.test", "--yes")
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "mailroom: error: the address to erase is in the configuration (sender main): change it first (SQLSTATE MR007)"
    )
