"""Mailboxes distributed by id on Citus, colocated with their messages (docs/scale.md, issue 26).

An address is kept unique by mailbox_addresses (distributed by address); expiry and purge go shard
by shard (SKIP LOCKED in single-shard statements), so concurrent `expire` workers take each
mailbox once."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from mailroom import testing

pytestmark = pytest.mark.citus


def _node_of(conn: psycopg.Connection, table: str, value) -> str:
    return conn.execute(
        "SELECT nodename || ':' || nodeport FROM citus_shards"
        " WHERE shardid = get_shard_id_for_distribution_column(%s::regclass, %s)",
        (table, value),
    ).fetchone()[0]


def test_mailboxes_distributed_by_id_and_colocated_with_messages(cconn):
    rows = {r[0]: r[1:] for r in cconn.execute(
        "SELECT logicalrelid::regclass::text, partmethod, column_to_column_name(logicalrelid, partkey), colocationid"
        " FROM pg_dist_partition"
        " WHERE logicalrelid IN ('mailroom.mailboxes'::regclass, 'mailroom.messages'::regclass,"
        " 'mailroom.mailbox_addresses'::regclass)"
    ).fetchall()}
    assert rows["mailroom.mailboxes"][:2] == ("h", "id")
    assert rows["mailroom.messages"][:2] == ("h", "mailbox_id")
    assert rows["mailroom.mailboxes"][2] == rows["mailroom.messages"][2]  # one colocation group
    assert rows["mailroom.mailbox_addresses"][:2] == ("h", "address")
    # the single node's unique key on the address is gone (it cannot hold without the id)
    assert cconn.execute(
        "SELECT count(*) FROM pg_constraint WHERE conname = 'mailboxes_address_key'"
    ).fetchone()[0] == 0


def test_an_address_is_unique_through_the_lookup_table(cconn):
    box = cconn.execute("SELECT mailbox_id, address FROM mailroom.create_mailbox(30, 'free')").fetchone()
    assert cconn.execute(
        "SELECT mailbox_id FROM mailroom.mailbox_addresses WHERE address = %s", (box[1],)
    ).fetchone() == (box[0],)
    again = cconn.execute(
        "SELECT mailroom_internal._insert_mailbox(%s, 'free', 'api', 'someone', NULL, now() + interval '1 hour', now())",
        (box[1],),
    ).fetchone()[0]
    assert again is None
    assert cconn.execute("SELECT count(*) FROM mailroom.mailboxes WHERE address = %s", (box[1],)).fetchone()[0] == 1


def test_create_mailbox_on_a_taken_address_gives_the_single_node_error(citus_url):
    """Every generated address taken: 23505 'could not generate a unique mailbox address', as on one node."""
    with psycopg.connect(citus_url) as conn:  # one transaction, rolled back: the fixed bytes go with it
        fixed = conn.execute("SELECT encode(mailroom_internal._random_bytes(10), 'hex')").fetchone()[0]
        conn.execute(
            "CREATE OR REPLACE FUNCTION mailroom_internal._random_bytes(p_count integer) RETURNS bytea LANGUAGE sql"
            f" AS $$ SELECT substr(decode('{fixed}' || repeat('00', 64), 'hex'), 1, p_count) $$"
        )
        conn.execute("SELECT * FROM mailroom.create_mailbox(30, 'free')")
        with pytest.raises(psycopg.errors.UniqueViolation, match="could not generate a unique mailbox address"):
            conn.execute("SELECT * FROM mailroom.create_mailbox(30, 'free')")
        conn.rollback()


def test_delivery_by_address_lands_on_the_mailbox_worker(cconn):
    box = cconn.execute("SELECT mailbox_id, address, session_token FROM mailroom.create_mailbox(30, 'free')").fetchone()
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_inbound"), autocommit=True) as inbound:
        assert inbound.execute("SELECT verdict FROM mailroom.check_recipient(%s)", (box[1].upper(),)).fetchone() == ("ok",)
        msg = inbound.execute(
            "SELECT mailroom.deliver_message(%s, convert_to('Subject: hi\r\n\r\nbody', 'UTF8'), 'a@example.com', 'hi')",
            (f"<{box[1].upper()}>",),
        ).fetchone()[0]
    assert msg is not None
    assert cconn.execute("SELECT message_count FROM mailroom.mailboxes WHERE id = %s", (box[0],)).fetchone() == (1,)
    mailbox_node = _node_of(cconn, "mailroom.mailboxes", box[0])
    assert mailbox_node == _node_of(cconn, "mailroom.messages", box[0])
    assert "worker" in mailbox_node
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_app"), autocommit=True) as app:
        assert app.execute("SELECT subject FROM mailroom.list_messages(%s, %s)", (box[1], box[2])).fetchall() == [("hi",)]
        assert app.execute("SELECT mailroom.mailbox_accepts('nobody@nowhere.test')").fetchone() == (False,)


def _race(url: str, statement: str, at: datetime, workers: int = 3) -> list[int]:
    """`workers` sessions call `statement` (one batch) until it returns 0 twice; what each took in all."""
    totals = [0] * workers
    errors: list[BaseException] = []
    start = threading.Barrier(workers)

    def run(i: int) -> None:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT set_config('mailroom.clock', %s, false)", (at.isoformat(),))
                start.wait()
                empty = 0
                while empty < 2:
                    n = conn.execute(statement).fetchone()[0]
                    totals[i] += n
                    empty = empty + 1 if n == 0 else 0
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return totals


def test_concurrent_expire_and_purge_take_each_mailbox_once(cconn, citus_url):
    ids = [r[0] for r in cconn.execute("SELECT (mailroom.create_mailbox(1)).mailbox_id FROM generate_series(1, 60)")]
    addresses = [r[0] for r in cconn.execute("SELECT address FROM mailroom.mailboxes WHERE id = ANY(%s)", (ids,))]
    for address in addresses[:10]:
        cconn.execute("SELECT mailroom.deliver_message(%s, convert_to('Subject: x\r\n\r\nbody', 'UTF8'))", (address,))
    later = datetime.now(UTC) + timedelta(hours=2)
    due = cconn.execute(
        "SELECT count(*) FROM mailroom.mailboxes WHERE is_active AND expires_at <= %s", (later,)
    ).fetchone()[0]
    assert due >= 60
    expired = _race(citus_url, "SELECT mailroom.expire_mailboxes(7)", later)
    assert sum(expired) == due  # each due mailbox expired by one worker, once
    assert cconn.execute(
        "SELECT count(*) FROM mailroom.mailboxes WHERE is_active AND expires_at <= %s", (later,)
    ).fetchone()[0] == 0

    much_later = later + timedelta(days=1)
    purgeable = cconn.execute(
        "SELECT count(*) FROM mailroom.mailboxes WHERE NOT is_active AND inactive_since <= %s", (much_later,)
    ).fetchone()[0]
    purged = _race(citus_url, "SELECT mailroom.purge_mailboxes(interval '1 hour', 5)", much_later + timedelta(hours=1))
    assert sum(purged) == purgeable
    assert cconn.execute("SELECT count(*) FROM mailroom.mailboxes WHERE id = ANY(%s)", (ids,)).fetchone()[0] == 0
    assert cconn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id = ANY(%s)", (ids,)).fetchone()[0] == 0
    assert cconn.execute(
        "SELECT count(*) FROM mailroom.mailbox_addresses WHERE address = ANY(%s)", (addresses,)
    ).fetchone()[0] == 0


def test_erasure_deletes_the_mailbox_its_messages_and_frees_its_address(cconn):
    """erase_address on Citus: the mailbox of the address, its messages and its mailbox_addresses row go;
    outbound mail to it is rewritten (the statements Citus plans per row on the shards)."""
    box = cconn.execute("SELECT mailbox_id, address FROM mailroom.create_mailbox(30, 'free')").fetchone()
    other = cconn.execute("SELECT mailbox_id, address FROM mailroom.create_mailbox(30, 'free')").fetchone()
    for address in (box[1], other[1]):
        cconn.execute("SELECT mailroom.deliver_message(%s, convert_to('Subject: x\r\n\r\nbody', 'UTF8'))", (address,))
    cconn.execute("SELECT mailroom.upsert_sender('erasure', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    kept = cconn.execute(
        "SELECT mailroom.enqueue_message('erasure', ARRAY[%s, 'kept@example.com'], 'to ' || %s, 'b')",
        (box[1], box[1]),
    ).fetchone()[0]
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_admin"), autocommit=True) as admin:
        dry = dict(admin.execute("SELECT item, affected FROM mailroom.erase_address(%s, true)", (box[1],)).fetchall())
        assert dry["mailboxes"] == 1
        assert cconn.execute("SELECT count(*) FROM mailroom.mailbox_addresses WHERE address = %s",
                             (box[1],)).fetchone() == (1,)  # a dry run changes nothing
        done = dict(admin.execute("SELECT item, affected FROM mailroom.erase_address(%s)", (box[1],)).fetchall())
    assert done == dry
    assert (done["mailboxes"], done["outbound_messages_rewritten"]) == (1, 1)
    assert cconn.execute("SELECT count(*) FROM mailroom.mailboxes WHERE id = %s", (box[0],)).fetchone() == (0,)
    assert cconn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id = %s", (box[0],)).fetchone() == (0,)
    assert cconn.execute(
        "SELECT count(*) FROM mailroom.mailbox_addresses WHERE address = %s", (box[1],)
    ).fetchone() == (0,)  # the address is free again
    # erased in place (issue 34: signed positions stay), the other recipient keeps its position
    assert cconn.execute("SELECT to_addrs, subject FROM mailroom.outbound_messages WHERE id = %s", (kept,)).fetchone() == (
        [cconn.execute("SELECT mailroom_internal._erased_recipient(%s)", (box[1],)).fetchone()[0], "kept@example.com"],
        "to " + cconn.execute("SELECT mailroom_internal._erased_form(%s)", (box[1],)).fetchone()[0]
    )
    # the other mailbox, its message and its address are untouched
    assert cconn.execute("SELECT message_count FROM mailroom.mailboxes WHERE id = %s", (other[0],)).fetchone() == (1,)
    assert cconn.execute("SELECT mailroom_internal._mailbox_id(%s)", (other[1],)).fetchone() == (other[0],)


def test_an_smtp_login_keeps_its_capture_inbox_on_citus(cconn):
    """smtp_credentials is a reference table (no foreign key to the distributed mailboxes): a login
    extends the capture inbox on its shard, and makes a new one once it is gone."""
    assert cconn.execute(
        "SELECT partmethod FROM pg_dist_partition WHERE logicalrelid = 'mailroom.smtp_credentials'::regclass"
    ).fetchone() == ("n",)
    made = cconn.execute(
        "SELECT username, capture_address FROM mailroom.create_smtp_credential('citus-team', sha256('mrs_c'::bytea))"
    ).fetchone()
    login = "SELECT capture_address FROM mailroom.smtp_login(%s, sha256('mrs_c'::bytea))"
    assert cconn.execute(login, (made[0],)).fetchone() == (made[1],)
    cconn.execute("SELECT mailroom_internal._delete_mailbox(%s)", (made[1],))
    again = cconn.execute(login, (made[0],)).fetchone()[0]
    assert again != made[1]
    assert cconn.execute(
        "SELECT owner_type::text, owner_id FROM mailroom.mailboxes WHERE address = %s", (again,)
    ).fetchone() == ("api", "citus-team")
