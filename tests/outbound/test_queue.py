"""Claiming: SKIP LOCKED disjointness, leases, relay settings, password only with the key."""

from __future__ import annotations

import psycopg
import pytest
from outbound_support import KEY, add_sender, enqueue, row, sender_key


def claim(conn: psycopg.Connection, n: int, worker: str, key: bytes | None = None) -> list[int]:
    return [r[0] for r in conn.execute("SELECT id FROM mailroom.claim_messages(%s, %s, %s)", (n, worker, key))]


def test_select_for_update_skip_locked(db_url, conn):
    add_sender(conn, 2525)
    ids = enqueue(conn, 10)
    a = psycopg.connect(db_url)  # transactions stay open: claimed rows stay locked
    b = psycopg.connect(db_url)
    c = psycopg.connect(db_url)
    try:
        # a claim that waits on a lock fails (55P03) instead of taking long: the holders below never let
        # go during the claim, so any wait at all would reach it (exact, whatever the machine's load)
        b.execute("SET lock_timeout = '500ms'")
        got_a = claim(a, 4, "a")
        got_b = claim(b, 4, "b")  # did not wait for the first one's locks
        assert len(got_a) == 4 and len(got_b) == 4
        assert set(got_a).isdisjoint(got_b)

        # a row locked by anyone else (not even claimed) is skipped, not waited on
        rest = sorted(set(ids) - set(got_a) - set(got_b))
        c.execute("SELECT 1 FROM mailroom.outbound_messages WHERE id = %s FOR UPDATE", (rest[0],))
        got_b2 = claim(b, 100, "b")  # under the same lock_timeout
        assert sorted(got_b2) == rest[1:]
        a.commit()
        b.commit()
        c.rollback()
    finally:
        for x in (a, b, c):
            x.close()
    assert row(conn, rest[0])["status"] == "queued"
    processing = {r[0] for r in conn.execute("SELECT id FROM mailroom.outbound_messages WHERE status = 'processing'")}
    assert processing == set(got_a) | set(got_b) | set(got_b2)
    # each claim got its own fencing token
    tokens = [r[0] for r in conn.execute("SELECT claim_token FROM mailroom.outbound_messages WHERE status = 'processing'")]
    assert len(set(tokens)) == len(tokens) == 9


def test_claim_sets_lease_and_returns_relay(conn):
    from mailroom.outbound.sealing import Unsealer

    add_sender(conn, 2525, username="relayuser", password="s3cret pass", security="starttls")
    (mid,) = enqueue(conn, 1, to=["a@example.com"], cc=["c@example.com"], bcc=["b@example.com"])
    conn.execute("SELECT mailroom.pin_clock('2030-01-01 00:00Z', false)")
    cur = conn.cursor(row_factory=psycopg.rows.dict_row)
    claimed = cur.execute("SELECT * FROM mailroom.claim_messages(10, 'w1', '90 seconds')").fetchall()
    assert len(claimed) == 1
    r = claimed[0]
    assert (r["id"], r["smtp_host"], r["smtp_port"], r["smtp_security"]) == (mid, "127.0.0.1", 2525, "starttls")
    assert (r["smtp_username"], r["smtp_password_set"], r["smtp_allow_cleartext"]) == ("relayuser", True, False)
    # the password comes back sealed: only the private half of the sender key opens it
    assert b"s3cret" not in bytes(r["smtp_password_sealed"])
    assert Unsealer([sender_key()[1].read_bytes()]).open(r["smtp_password_sealed"]) == "s3cret pass"
    assert r["bcc_addrs"] == ["b@example.com"]
    stored = row(conn, mid)
    assert stored["status"] == "processing" and stored["claimed_by"] == "w1"
    assert str(stored["lease_expires_at"] - stored["claimed_at"]) == "0:01:30"
    # the password is stored sealed, never in clear
    enc = conn.execute("SELECT smtp_password_sealed FROM mailroom.senders").fetchone()[0]
    assert b"s3cret" not in bytes(enc)


def test_deprecated_keyed_claim_with_wrong_key_fails_and_claims_nothing(conn):
    """The previous release's claim (one release): its key opens only the previous release's ciphertext."""
    add_sender(conn, 2525, username="u", password="pw", security="starttls")
    conn.execute("UPDATE mailroom.senders SET smtp_password_sealed = NULL, smtp_password_encrypted ="
                 " pgp_sym_encrypt('pw', %s, 'cipher-algo=aes256, s2k-mode=1')", (KEY.hex(),))
    (mid,) = enqueue(conn, 1)
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT * FROM mailroom.claim_messages(10, 'w1', %s, NULL)", (bytes(32),))
    assert err.value.sqlstate == "MR315"
    assert "pw" not in str(err.value)
    assert row(conn, mid)["status"] == "queued"
    r = conn.execute("SELECT smtp_password FROM mailroom.claim_messages(10, 'w1', %s, NULL)", (KEY,)).fetchone()
    assert r[0] == "pw"


def test_enqueue_notifies_ids_only(db_url, conn):
    add_sender(conn, 2525)
    listener = psycopg.connect(db_url, autocommit=True)
    try:
        listener.execute("LISTEN mailroom_outbound")
        ids = enqueue(conn, 2, to=["secret.person@example.com"])
        notes = list(listener.notifies(timeout=2, stop_after=2))
    finally:
        listener.close()
    assert [n.payload for n in notes] == [str(i) for i in ids]


def test_idempotency_key_returns_existing_id(conn):
    add_sender(conn, 2525)
    q = "SELECT mailroom.enqueue_message('main', ARRAY['a@example.com'], 's', 't', p_idempotency_key => %s)"
    first = conn.execute(q, ("order-42",)).fetchone()[0]
    assert conn.execute(q, ("order-42",)).fetchone()[0] == first
    assert conn.execute("SELECT count(*) FROM mailroom.outbound_messages").fetchone()[0] == 1
