"""Upgrading an installation distributed by the earlier Citus layout (docs/scale.md).

The earlier layout kept `mailboxes` a Citus local table on the coordinator (added to Citus'
metadata for its foreign key to the reference table `plans`, with its identity column and its
unique address). It is built here from that release's own sql/ and migrations/ (`git archive` of
the commit below, the last with that layout), migrated through the coordinator and given a
mailbox with a message and an account with its pending token (accounts and tokens were plain
tables on the coordinator then); then this tree's `db migrate` moves it: mailboxes distributed by
id and colocated with messages, every address in mailbox_addresses, accounts by id and tokens by
account, their logins and emails in the lookup tables, the rows and ids kept."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import psycopg
import pytest

from mailroom import testing
from mailroom.db import citus as citus_db
from mailroom.db import migrate

pytestmark = pytest.mark.citus

REPO = Path(__file__).resolve().parents[2]
# the last commit of main whose sql/citus/ kept mailboxes a Citus local table
EARLIER_LAYOUT = "312bb67c754f5b6dc087e490da1793bdbd57694d"


@pytest.fixture(scope="module")
def earlier_tree(tmp_path_factory) -> Path:
    if shutil.which("git") is None or subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{EARLIER_LAYOUT}^{{commit}}"], capture_output=True
    ).returncode:
        pytest.skip(f"needs a git checkout holding {EARLIER_LAYOUT[:7]} (the earlier Citus layout)")
    root = tmp_path_factory.mktemp("earlier-layout")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", EARLIER_LAYOUT, "sql", "migrations"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


def _kind(conn: psycopg.Connection, table: str) -> tuple | None:
    return conn.execute(
        "SELECT partmethod, column_to_column_name(logicalrelid, partkey), colocationid FROM pg_dist_partition"
        " WHERE logicalrelid = %s::regclass", (table,)
    ).fetchone()


def test_db_migrate_moves_the_earlier_layout_keeping_its_mailboxes_and_messages(citus, earlier_tree):
    name = "mailroom_earlier"
    citus_db.drop_database(citus, name)
    citus_db.ensure_database(citus, name)
    url = citus.url(name)
    migrate.migrate(url, root=earlier_tree)
    testing.ensure_test_logins(url)
    with psycopg.connect(url, autocommit=True) as conn:
        assert _kind(conn, "mailroom.mailboxes")[0] == "n"  # the earlier layout: a Citus local table
        assert conn.execute("SELECT to_regclass('mailroom.mailbox_addresses')").fetchone() == (None,)
    with psycopg.connect(testing.as_login(url, "mr_app"), autocommit=True) as app:
        boxes = [
            app.execute("SELECT mailbox_id, address, session_token FROM mailroom.create_mailbox(30, 'free')").fetchone()
            for _ in range(3)
        ]
    with psycopg.connect(testing.as_login(url, "mr_inbound"), autocommit=True) as inbound:
        message = inbound.execute(
            "SELECT mailroom.deliver_message(%s, convert_to('Subject: before\r\n\r\nkept', 'UTF8'), 'a@example.com',"
            " 'before')", (boxes[0][1],),
        ).fetchone()[0]
    with psycopg.connect(testing.as_login(url, "mr_app"), autocommit=True) as app:
        account = app.execute("SELECT mailroom.create_account('Moved@Example.com', 'moved')").fetchone()[0]

    migrate.migrate(url)  # this tree
    with psycopg.connect(url, autocommit=True) as conn:
        mailboxes, messages = _kind(conn, "mailroom.mailboxes"), _kind(conn, "mailroom.messages")
        assert mailboxes[:2] == ("h", "id")
        assert mailboxes[2] == messages[2]  # colocated with messages
        assert _kind(conn, "mailroom.mailbox_addresses")[:2] == ("h", "address")
        assert sorted(conn.execute("SELECT address, mailbox_id FROM mailroom.mailbox_addresses").fetchall()) == sorted(
            (b[1], b[0]) for b in boxes
        )
        for box_id, address, _token in boxes:
            assert conn.execute("SELECT mailroom_internal._mailbox_id(%s)", (address,)).fetchone() == (box_id,)
        assert conn.execute("SELECT message_count FROM mailroom.mailboxes WHERE id = %s", (boxes[0][0],)).fetchone() == (1,)
        # the functions typed by mailboxes' row, dropped by Citus with the earlier table, are back
        assert conn.execute(
            "SELECT count(*) FROM pg_proc WHERE pronamespace = 'mailroom_internal'::regnamespace"
            " AND proname IN ('_authorize_mailbox', '_http_box', '_http_mailbox_json', '_http_message_page')"
        ).fetchone() == (4,)
        # accounts and tokens moved too: distributed, colocated, their keys in the lookup tables
        accounts, tokens = _kind(conn, "mailroom.accounts"), _kind(conn, "mailroom.tokens")
        assert accounts[:2] == ("h", "id") and tokens[:2] == ("h", "account") and accounts[2] == tokens[2]
        assert conn.execute("SELECT account FROM mailroom.account_emails WHERE email = 'moved@example.com'").fetchone() == (
            account,
        )
        assert conn.execute("SELECT account FROM mailroom.account_logins WHERE login = 'moved'").fetchone() == (account,)
        # the row triggers, off while the rows were copied, are on again on the coordinator and every shard
        for table in ("mailroom.accounts", "mailroom.tokens"):
            assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND tgenabled = 'D'",
                                (table,)).fetchone() == (0,)
            disabled = conn.execute(
                "SELECT DISTINCT result FROM run_command_on_shards(%s, $$SELECT count(*) FROM pg_trigger"
                " WHERE tgrelid = '%%s'::regclass AND tgenabled = 'D'$$)", (table,),
            ).fetchall()
            assert disabled == [("0",)], (table, disabled)
    with psycopg.connect(testing.as_login(url, "mr_app"), autocommit=True) as app:
        for email, login, code in (("MOVED@example.com", "other", "MR102"), ("other@example.com", "moved", "MR103")):
            with pytest.raises(psycopg.Error) as taken:
                app.execute("SELECT mailroom.create_account(%s, %s)", (email, login))
            assert taken.value.sqlstate == code, (email, login)
    with psycopg.connect(testing.as_login(url, "mr_collector")) as collector:
        dequeued = collector.execute("SELECT action, login FROM mailroom.dequeue_tokens(10)").fetchall()
        collector.commit()
    assert ("activation", "moved") in [(str(a), b) for a, b in dequeued]  # the pending token, handed out once
    with psycopg.connect(testing.as_login(url, "mr_app"), autocommit=True) as app:
        box_id, address, token = boxes[0]
        assert app.execute("SELECT message_id, subject FROM mailroom.list_messages(%s, %s)", (address, token)).fetchall() == [
            (message, "before")
        ]
        raw = app.execute("SELECT raw FROM mailroom.read_message(%s, %s, %s)", (address, token, message)).fetchone()[0]
        assert bytes(raw).endswith(b"kept")
        # new mailboxes continue the identity past the moved ones; a moved address stays taken
        new_id = app.execute("SELECT mailbox_id FROM mailroom.create_mailbox(30, 'free')").fetchone()[0]
        assert new_id > max(b[0] for b in boxes)
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute(
            "SELECT mailroom_internal._insert_mailbox(%s, 'free', 'api', 'someone', NULL, now() + interval '1 hour', now())",
            (boxes[1][1],),
        ).fetchone() == (None,)

    migrate.migrate(url)  # and again: nothing left to move
    with psycopg.connect(url, autocommit=True) as conn:
        assert _kind(conn, "mailroom.mailboxes")[:2] == ("h", "id")
        assert conn.execute("SELECT count(*) FROM mailroom.mailboxes").fetchone() == (4,)
    citus_db.drop_database(citus, name)
