"""The core flows on a Citus coordinator with two workers, through the same SQL API.

The worker kinds (four senders with a SIGKILL, queue verbs, expire, maintain) are in
test_citus_workers.py; what does not run on Citus yet is listed in docs/scale.md, "Limits"."""

from __future__ import annotations

import re
import threading

import psycopg
import pytest

from mailroom import testing
from mailroom.db.migrate import migrate

pytestmark = pytest.mark.citus


def test_schema_is_distributed(cconn):
    kinds = dict(cconn.execute(
        "SELECT logicalrelid::regclass::text, partmethod FROM pg_dist_partition"
        " WHERE logicalrelid::regclass::text LIKE 'mailroom.%'"
    ).fetchall())
    assert kinds["mailroom.messages"] == "h"
    assert kinds["mailroom.outbound_messages"] == "h"
    assert kinds["mailroom.plans"] == "n"  # reference (or coordinator-local: also 'n')
    reference = {r[0] for r in cconn.execute(
        "SELECT table_name::text FROM citus_tables WHERE citus_table_type = 'reference'"
    ).fetchall()}
    assert {"mailroom.plans", "mailroom.settings", "mailroom.senders"} <= reference
    shards = cconn.execute(
        "SELECT count(DISTINCT nodename) FROM citus_shards WHERE table_name = 'mailroom.messages'::regclass"
    ).fetchone()[0]
    assert shards == 2  # the messages live on both workers
    lanes = cconn.execute("SELECT count(*) FROM mailroom.outbound_lanes").fetchone()[0]
    assert lanes == cconn.execute(
        "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'mailroom.outbound_messages'::regclass"
    ).fetchone()[0]


def test_migrate_again_is_a_no_op_upgrade(citus_url):
    """A second `db migrate` on the coordinator: sql/ re-applied through Citus, nothing pending, still distributed."""
    result = migrate(citus_url)
    assert result.applied == []
    assert not result.distributed


def test_inbound_stored_on_a_worker_and_read(cconn):
    box = cconn.execute("SELECT mailbox_id, address, session_token FROM mailroom.create_mailbox(30, 'free')").fetchone()
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_inbound"), autocommit=True) as inbound:
        msg = inbound.execute(
            "SELECT mailroom.deliver_message(%s, %s, 'a@example.com', 'Your code', NULL, 'code 123456')",
            (box[1], b"Subject: Your code\r\n\r\ncode 123456\r\n"),
        ).fetchone()[0]
    assert msg is not None
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_app"), autocommit=True) as app:
        rows = app.execute("SELECT subject FROM mailroom.list_messages(%s, %s)", (box[1], box[2])).fetchall()
    assert rows == [("Your code",)]
    # the row is on the worker that holds the mailbox's shard, not on the coordinator
    node = cconn.execute(
        "SELECT nodename FROM citus_shards WHERE shardid = get_shard_id_for_distribution_column('mailroom.messages', %s)",
        (box[0],),
    ).fetchone()[0]
    assert "worker" in node


def test_delivery_receipt_and_settle_on_a_coordinator(cconn):
    """The inbound server's DATA step as it runs it (set_delivery_receipt, then deliver_messages, in
    one pipeline): the message on its worker, the receipt on the coordinator, in one transaction;
    settle_delivery answers the replies, and leaves a tombstone for a key nothing was delivered under."""
    address = cconn.execute("SELECT address FROM mailroom.create_mailbox(30, 'free')").fetchone()[0]
    key, other = "00000000-0000-7000-8000-0000000000c1", "00000000-0000-7000-8000-0000000000c2"
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_inbound"), autocommit=True) as inbound:
        with inbound.pipeline():
            inbound.execute("SELECT mailroom.set_delivery_receipt(%s)", (key,))
            rows = inbound.execute(
                "SELECT verdict, reply FROM mailroom.deliver_messages(ARRAY[1], ARRAY[%s], ARRAY[%s::bytea],"
                " ARRAY[''], ARRAY['receipt'], ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::text[],"
                " ARRAY['[]'::jsonb])", (address, b"Subject: receipt\r\n\r\nhi\r\n"),
            ).fetchall()
        assert [r[0] for r in rows] == ["ok"]
        assert inbound.execute("SELECT mailroom.settle_delivery(%s)", (key,)).fetchone()[0] == [rows[0][1]]
        assert inbound.execute("SELECT mailroom.settle_delivery(%s)", (other,)).fetchone()[0] is None
    assert cconn.execute("SELECT count(*) FROM mailroom.messages WHERE subject = 'receipt'").fetchone()[0] == 1


def test_outbound_claims_exactly_once_across_lanes(cconn):
    """4 claimers race over every lane: each queued message is claimed by exactly one of them."""
    cconn.execute("SELECT mailroom.upsert_sender('lanes', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    total = 400
    cconn.execute(
        "SELECT mailroom.enqueue_message('lanes', ARRAY['r' || g || '@example.com'], 's', 'b') FROM generate_series(1, %s) g",
        (total,),
    )
    spread = cconn.execute(
        "SELECT count(DISTINCT lane) FROM mailroom.outbound_messages WHERE status = 'queued'"
    ).fetchone()[0]
    assert spread > 1
    claimed: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    url = testing.as_login(cconn.info.dsn, "mr_sender")

    def claimer(name: str) -> None:
        got: list[int] = []
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                while True:
                    ids = [r[0] for r in conn.execute("SELECT id FROM mailroom.claim_messages(25, %s)", (name,))]
                    if not ids:
                        break
                    got += ids
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        claimed[name] = got

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    everything = [i for ids in claimed.values() for i in ids]
    assert len(everything) == len(set(everything)) == total
    assert sum(1 for ids in claimed.values() if ids) > 1
    left = cconn.execute("SELECT count(*) FROM mailroom.outbound_messages WHERE status = 'queued'").fetchone()[0]
    assert left == 0
    _forget_sender(cconn, "lanes")


def test_reaper_returns_a_dead_claimers_rows(cconn):
    cconn.execute("SELECT mailroom.upsert_sender('reap', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    cconn.execute(
        "SELECT mailroom.enqueue_message('reap', ARRAY['z' || g || '@example.com'], 's', 'b') FROM generate_series(1, 20) g"
    )
    claimed = cconn.execute("SELECT count(*) FROM mailroom.claim_messages(20, 'dead', interval '1 second')").fetchone()[0]
    assert claimed == 20
    reaped = cconn.execute("SELECT mailroom.reap_stuck_messages(interval '0 seconds')").fetchone()[0]
    assert reaped >= 20  # and the earlier tests' claims, never finalized
    again = cconn.execute("SELECT count(*) FROM mailroom.claim_messages(20, 'alive')").fetchone()[0]
    assert again == 20
    _forget_sender(cconn, "reap")


def _forget_sender(cconn, name: str) -> None:
    """The module shares one database: a test's messages to its dead relay (127.0.0.1:2525) must
    not be left queued for the senders of the tests after it (the demo's would try them first)."""
    cconn.execute(
        "DELETE FROM mailroom.outbound_messages WHERE sender_id = (SELECT id FROM mailroom.senders WHERE name = %s)",
        (name,),
    )


def _node(cconn, table: str, value: int | str) -> int:
    """The worker (Citus group) of the shard of `table` holding `value` (a bigint id or a text key)."""
    cast = "text" if isinstance(value, str) else "bigint"
    return cconn.execute(
        f"SELECT mailroom_internal._shard_node(get_shard_id_for_distribution_column(%s::regclass, %s::{cast}))",
        (table, value),
    ).fetchone()[0]


def test_single_key_writes_commit_on_one_worker(cconn, remote_commands):
    """issue 37: a new mailbox's id is chosen on its address's worker, so create_mailbox commits
    there in one phase; a delivery's guard and message are two statements routed to the mailbox's
    worker (not an INSERT … SELECT through the coordinator); a new account is placed on its email's
    worker."""
    for _ in range(4):
        (box,), sent = remote_commands(cconn, "SELECT mailbox_id, address FROM mailroom.create_mailbox(30, 'free')")
        assert _node(cconn, "mailroom.mailboxes", box[0]) == _node(cconn, "mailroom.mailbox_addresses", box[1])
        assert not [c for c in sent if c.startswith("PREPARE TRANSACTION")], sent
        _, sent = remote_commands(cconn, "SELECT mailroom.deliver_message(%s, %s)",
                                   (box[1], b"Subject: hi\r\n\r\nhi\r\n"))
        assert not [c for c in sent if c.startswith(("PREPARE TRANSACTION", "COPY"))], sent
        assert [c for c in sent if c.startswith("INSERT INTO mailroom.messages_")], sent
    for i in range(4):
        (row,) = cconn.execute("SELECT mailroom.create_account(%s, %s)", (f"near{i}@example.com", f"near{i}")).fetchall()
        assert _node(cconn, "mailroom.accounts", row[0]) == _node(cconn, "mailroom.account_emails", f"near{i}@example.com")
        # its activation token, written without the reissue's revocation (nothing to revoke)
        assert cconn.execute("SELECT count(*) FROM mailroom.tokens WHERE account = %s AND action = 'activation'"
                             " AND revoked_at IS NULL", (row[0],)).fetchone()[0] == 1


def _finalize_sent(cconn, rows) -> None:
    cconn.execute("SELECT * FROM mailroom.finalize_messages(%s, %s, %s)",
                  ([r[0] for r in rows], [r[1] for r in rows], ["sent"] * len(rows)))


def test_claim_reads_the_head_and_stays_on_one_worker(cconn, remote_commands):
    """issue 37: a claim with nothing due is one lane's statement and a read of the queue's head
    (nothing prepared on a worker), and (issue 46) the session's next one, its last having found
    nothing, the head's read alone (no transaction on a worker); a claim from a queue deeper than it
    takes its rows from one lane, on one worker (one-phase commit); finalize prepares at most once a
    worker; one lane a worker."""
    cconn.execute("SELECT mailroom.upsert_sender('head', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    while cconn.execute("SELECT count(*) FROM mailroom.claim_messages(500, 'drain')").fetchone()[0]:
        pass
    cconn.execute("SELECT mailroom.enqueue_message('head', ARRAY['one@example.com'], 's', 'b')")
    assert len(cconn.execute("SELECT id FROM mailroom.claim_messages(10, 'one')").fetchall()) == 1
    rows, sent = remote_commands(cconn, "SELECT id FROM mailroom.claim_messages(10, 'idle')")
    assert rows == []
    assert not [c for c in sent if c.startswith(("PREPARE", "COMMIT PREPARED"))], sent
    assert len([c for c in sent if c.startswith("UPDATE")]) == 1, sent  # the first lane only
    assert [c for c in sent if c.startswith("SELECT lane")], sent  # the head's read
    # the last claim found nothing: the next one reads the head and, nothing due, stops there (no
    # lane's locking statement)
    rows, again = remote_commands(cconn, "SELECT id FROM mailroom.claim_messages(10, 'idle')", local=True)
    assert rows == []
    assert [c for c in again if c.startswith("SELECT lane")], again
    assert not [c for c in again if c.startswith(("UPDATE", "PREPARE"))], again
    assert len(again) < len(sent), (again, sent)
    # the head's read is one SELECT a worker, nothing else: no transaction opened on a worker, no
    # intermediate result read back on the coordinator (issue 46: as ARRAY(SELECT …) it was both)
    assert not [c for c in again if c.startswith(("BEGIN", "COMMIT", "COPY"))], again
    assert [c for c in again if c.startswith("locally:")] == [
        c for c in again if c.startswith("locally:") and "mailroom.settings_" in c], again
    lanes = cconn.execute(
        "SELECT count(*), count(DISTINCT mailroom_internal._shard_node(get_shard_id_for_distribution_column("
        "'mailroom.outbound_messages', lane))) FROM mailroom.outbound_lanes"
    ).fetchone()
    assert lanes == (2, 2)

    cconn.execute(
        "SELECT mailroom.enqueue_message('head', ARRAY['h' || g || '@example.com'], 's', 'b') FROM generate_series(1, 120) g"
    )
    nodes = {r[0] for r in cconn.execute(
        "SELECT DISTINCT mailroom_internal._shard_node(get_shard_id_for_distribution_column("
        "'mailroom.outbound_messages', lane)) FROM mailroom.outbound_messages WHERE status = 'queued'"
    )}
    assert len(nodes) == 2  # the queue spans both workers
    # the last claim found nothing: this one starts from the head's lanes and finds rows
    rows, sent = remote_commands(cconn, "SELECT id, claim_token FROM mailroom.claim_messages(10, 'head')")
    assert len(rows) == 10 and [c for c in sent if c.startswith("SELECT lane")], sent
    _finalize_sent(cconn, rows)
    # that one found rows: this one starts from a random lane, which fills it
    rows, sent = remote_commands(cconn, "SELECT id, claim_token FROM mailroom.claim_messages(10, 'head')")
    assert len(rows) == 10
    assert not [c for c in sent if c.startswith("PREPARE")], sent
    assert not [c for c in sent if c.startswith("SELECT lane")], sent  # the first lane filled it
    claimed_nodes = {r[0] for r in cconn.execute(
        "SELECT DISTINCT mailroom_internal._shard_node(get_shard_id_for_distribution_column("
        "'mailroom.outbound_messages', lane)) FROM mailroom.outbound_messages WHERE id = ANY(%s)", ([r[0] for r in rows],)
    )}
    assert len(claimed_nodes) == 1
    outcomes, sent = remote_commands(
        cconn, "SELECT result FROM mailroom.finalize_messages(%s, %s, %s)",
        ([r[0] for r in rows], [r[1] for r in rows], ["sent"] * len(rows)),
    )
    assert [o[0] for o in outcomes] == ["sent"] * 10
    assert len([c for c in sent if c.startswith("PREPARE TRANSACTION")]) <= 2, sent
    _forget_sender(cconn, "head")


def test_finalize_writes_the_claims_lane_only(cconn, remote_commands):
    """issue 46: a claim token carries its lane on Citus, so the finalize of a batch claimed from one
    lane writes that lane's shard alone and commits on its worker in one phase (it wrote every shard,
    a two-phase commit of both workers); a token without a lane (taken before this release, in flight
    across an upgrade) still finalizes, over every lane; the claim's return paths, made once a claim,
    are the ones _return_paths makes."""
    cconn.execute("SELECT mailroom.upsert_sender('lanes', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    cconn.execute("SELECT mailroom.set_sender_bounce_domain('lanes', 'Bounces.Example.COM')")
    while cconn.execute("SELECT count(*) FROM mailroom.claim_messages(500, 'drain')").fetchone()[0]:
        pass
    cconn.execute(
        "SELECT mailroom.enqueue_message('lanes', ARRAY['l' || g || '@example.com', 'm' || g || '@example.com'], 's', 'b')"
        " FROM generate_series(1, 80) g"
    )
    rows = cconn.execute("SELECT id, claim_token, return_paths FROM mailroom.claim_messages(10, 'lanes')").fetchall()
    assert len(rows) == 10
    lanes = {r[0] for r in cconn.execute(
        "SELECT DISTINCT lane FROM mailroom.outbound_messages WHERE id = ANY(%s)", ([r[0] for r in rows],))}
    assert len(lanes) == 1
    assert cconn.execute("SELECT mailroom_internal._claim_lanes(%s)", ([r[1] for r in rows],)).fetchone()[0] == list(lanes)
    for rid, _, paths in rows:
        made = cconn.execute(
            "SELECT mailroom_internal._return_paths(%s, (SELECT id FROM mailroom.senders WHERE name = 'lanes'), 2)", (rid,)
        ).fetchone()[0]
        assert paths == made and len(paths) == 2 and paths[0].endswith("@bounces.example.com"), (paths, made)
    outcomes, sent = remote_commands(
        cconn, "SELECT result FROM mailroom.finalize_messages(%s, %s, %s)",
        ([r[0] for r in rows], [r[1] for r in rows], ["sent"] * len(rows)), local=True,
    )
    assert [o[0] for o in outcomes] == ["sent"] * 10
    assert not [c for c in sent if c.startswith(("PREPARE", "COMMIT PREPARED"))], sent
    updates = [i for i, c in enumerate(sent) if c.startswith("UPDATE mailroom.outbound_messages_")]
    assert len(updates) == 1, sent
    # the UPDATE is a plain statement routed to the lane's shard, not a CTE whose rows come back as an
    # intermediate result for the coordinator to run the rest of the statement over (a COPY to the
    # worker, then statements run locally: 7.4 ms of the coordinator's CPU for a finalize of 10);
    # nothing else is written for a batch all sent (no suppression, backoff, webhook or counter)
    assert not [c for c in sent if c.startswith("COPY") or "read_intermediate_result" in c], sent
    assert sent[updates[0] + 1:] == ["COMMIT"], sent[updates[0]:]

    # a token of the previous release (no lane in it) for one row of the batch: every lane is written
    rows = cconn.execute("SELECT id, claim_token FROM mailroom.claim_messages(10, 'lanes')").fetchall()
    assert len(rows) == 10
    old = cconn.execute("SELECT nextval('mailroom.outbound_claim_token_seq')").fetchone()[0]
    cconn.execute("UPDATE mailroom.outbound_messages SET claim_token = %s WHERE id = %s", (old, rows[0][0]))
    tokens = [old] + [r[1] for r in rows[1:]]
    assert cconn.execute("SELECT mailroom_internal._claim_lanes(%s)", (tokens,)).fetchone()[0] is None
    outcomes, sent = remote_commands(
        cconn, "SELECT result FROM mailroom.finalize_messages(%s, %s, %s)",
        ([r[0] for r in rows], tokens, ["sent"] * len(rows)),
    )
    assert [o[0] for o in outcomes] == ["sent"] * 10
    assert len([c for c in sent if c.startswith("UPDATE mailroom.outbound_messages_")]) == 2, sent
    # release names the lanes of its tokens too
    rows = cconn.execute("SELECT id, claim_token FROM mailroom.claim_messages(10, 'lanes')").fetchall()
    (released,), sent = remote_commands(
        cconn, "SELECT mailroom.release_messages(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))
    assert released == (10,)
    assert len([c for c in sent if c.startswith("UPDATE mailroom.outbound_messages_")]) == 1, sent
    _forget_sender(cconn, "lanes")


def test_demo_story_on_citus(ccli):
    """The activation story end to end: account -> token -> collect -> send -> inbox serve -> consume."""
    proc = ccli("demo", "--pace", "0", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "status is now active" in out
    assert re.search(r"expire_mailboxes\(\) expired 1 inbox", out)
    assert "every process the demo started has stopped" in out


def _partition_of(cconn, table: str, where: str, arg) -> str:
    """The partition of `table` holding the rows `where` selects (on a worker a row's table is its
    partition's shard: the name less its shard id)."""
    shard = cconn.execute(f"SELECT DISTINCT tableoid::regclass::text FROM mailroom.{table} WHERE {where}",
                          (arg,)).fetchone()[0]
    return re.sub(r"_\d+$", "", shard.removeprefix("mailroom."))


def test_rows_past_retention_go_through_the_seams(cconn):
    """sql/05's _delete_past_retention calls its seams (sql/citus/25): finished outbound rows of a
    partition lane by lane, with their idempotency keys; the old messages of an inactive mailbox.
    Last in this module: it deletes every finished outbound row of the partition it names."""
    cconn.execute("SELECT mailroom.upsert_sender('retain', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    ids = [r[0] for r in cconn.execute(
        "SELECT mailroom.enqueue_message('retain', ARRAY['k' || g || '@example.com'], 's', 'b',"
        " p_idempotency_key => 'retain-' || g) FROM generate_series(1, 40) g"
    ).fetchall()]  # 40 rows on random lanes: all in one lane has a chance of 2^-39 with two lanes (6 gave 1 in 32)
    cconn.execute("UPDATE mailroom.outbound_messages SET status = 'cancelled' WHERE id = ANY(%s)", (ids,))
    lanes = cconn.execute("SELECT count(DISTINCT lane) FROM mailroom.outbound_messages WHERE id = ANY(%s)",
                          (ids,)).fetchone()[0]
    assert lanes > 1  # rows of several shards
    partition = _partition_of(cconn, "outbound_messages", "id = ANY(%s)", ids)
    deleted = cconn.execute("SELECT mailroom_internal._delete_past_retention('outbound_messages', %s,"
                            " now() + interval '1 minute', 1000)", (partition,)).fetchone()[0]
    assert deleted >= len(ids)
    assert cconn.execute("SELECT count(*) FROM mailroom.outbound_messages WHERE id = ANY(%s)",
                         (ids,)).fetchone()[0] == 0
    assert cconn.execute("SELECT count(*) FROM mailroom.outbound_idempotency_keys WHERE message_id = ANY(%s)",
                         (ids,)).fetchone()[0] == 0

    box = cconn.execute("SELECT mailbox_id, address FROM mailroom.create_mailbox(30, 'free')").fetchone()
    kept = cconn.execute("SELECT mailbox_id, address FROM mailroom.create_mailbox(30, 'free')").fetchone()
    for mailbox in (box, kept):
        cconn.execute("SELECT mailroom.deliver_message(%s, %s, 'a@example.com', 'old', NULL, 'old')",
                      (mailbox[1], b"Subject: old\r\n\r\nold\r\n"))
    cconn.execute("UPDATE mailroom.mailboxes SET is_active = false, inactive_since = now() WHERE id = %s", (box[0],))
    for mailbox in (box, kept):
        partition = _partition_of(cconn, "messages", "mailbox_id = %s", mailbox[0])
        cconn.execute("SELECT mailroom_internal._delete_past_retention('messages', %s, now() + interval '1 minute', 1000)",
                      (partition,))
    assert cconn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id = %s", (box[0],)).fetchone()[0] == 0
    assert cconn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id = %s", (kept[0],)).fetchone()[0] == 1
