"""Accounts and tokens against a real cluster: exactly-once dequeue under out-of-order commits and
concurrent collectors, bulk inserts, NOTIFY per statement, signatures checked with Python's hmac,
the index plan of dequeue_tokens, code attempts that survive rolled-back transactions."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import threading

import psycopg
import pytest

KEY = bytes.fromhex("cafebabe" * 8)
OLD_KEY = bytes.fromhex("0badf00d" * 8)


def b64url_decode(value: str) -> bytes:
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))


def expected_mac(key: bytes, action: str, secret: bytes, code: str) -> bytes:
    data = b"/activate" + secret if action == "activation" else b"/recover" + secret + code.encode("ascii")
    return hmac.new(key, data, hashlib.sha256).digest()


@pytest.fixture(autouse=True)
def known_key(conn: psycopg.Connection) -> None:
    """KEY becomes the keyring's active key (an import, as the owner does it), so the HMACs can be
    checked here; no call below passes a key."""
    conn.execute("SELECT mailroom.import_signing_key(%s, true)", (KEY,))


def dequeue(conn: psycopg.Connection, limit: int) -> list[tuple]:
    return conn.execute(
        "SELECT action::text, email, login, signed, code, token_id FROM mailroom.dequeue_tokens(%s)", (limit,)
    ).fetchall()


def drain(conn: psycopg.Connection, limit: int) -> list[int]:
    ids: list[int] = []
    while True:
        with conn.transaction():
            rows = dequeue(conn, limit)
        ids += [r[5] for r in rows]
        if len(rows) < limit:
            return ids


def sqlstate_of(conn: psycopg.Connection, query: str, params: tuple) -> str | None:
    try:
        conn.execute(query, params)
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def test_out_of_order_commits_are_all_dequeued(db_url: str) -> None:
    with psycopg.connect(db_url) as slow, psycopg.connect(db_url) as fast, \
            psycopg.connect(db_url, autocommit=True) as collector:
        slow_id = slow.execute("SELECT mailroom.create_account('slow@example.com', 'slow')").fetchone()[0]
        fast_id = fast.execute("SELECT mailroom.create_account('fast@example.com', 'fast')").fetchone()[0]
        assert slow_id < fast_id
        fast.commit()  # the higher id commits first
        first = drain(collector, 10)
        slow.commit()  # the lower id commits after the higher one was dequeued
        second = drain(collector, 10)
    tokens = dict(psycopg.connect(db_url).execute("SELECT account, id FROM mailroom.tokens").fetchall())
    assert first == [tokens[fast_id]]
    assert second == [tokens[slow_id]], "a token committed after a higher id was dequeued must not be skipped"


def test_rollback_leaves_tokens_eligible(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO mailroom.accounts (email, login) SELECT 'r' || g || '@example.com', 'r' || g "
                 "FROM generate_series(1, 5) AS g")
    with pytest.raises(RuntimeError):
        with conn.transaction():
            assert len(dequeue(conn, 10)) == 5
            raise RuntimeError("collector died before writing its output")
    assert len(drain(conn, 10)) == 5


def test_two_concurrent_collectors_never_share_a_token(db_url: str, conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO mailroom.accounts (email, login) SELECT 'c' || g || '@example.com', 'c' || g "
                 "FROM generate_series(1, 600) AS g")
    # Both hold their claims open at the same time: disjoint sets.
    with psycopg.connect(db_url) as a, psycopg.connect(db_url) as b:
        got_a = {r[5] for r in dequeue(a, 50)}
        got_b = {r[5] for r in dequeue(b, 50)}
        assert len(got_a) == 50 and len(got_b) == 50
        assert not got_a & got_b
        a.rollback()  # A's claims return to the queue, B's stay taken
        b.commit()

    seen: list[list[int]] = [[], [], []]
    barrier = threading.Barrier(3)

    def worker(slot: int) -> None:
        with psycopg.connect(db_url, autocommit=True) as c:
            barrier.wait()
            seen[slot] = drain(c, 7)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    everything = [i for s in seen for i in s] + sorted(got_b)
    assert len(everything) == len(set(everything)) == 600, "every token exactly once across collectors"


def test_bulk_insert_of_10000_accounts_one_notify_fully_dequeued(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener, psycopg.connect(db_url, autocommit=True) as writer:
        listener.execute("LISTEN token_insert")
        listener.execute("SELECT mailroom.listen(ARRAY['token_insert'])")  # sql/08: announced while registered
        writer.execute("INSERT INTO mailroom.accounts (email, login) SELECT 'bulk' || g || '@example.com', "
                       "'bulk' || g FROM generate_series(1, 10000) AS g")
        payloads = [n.payload for n in listener.notifies(timeout=2, stop_after=5)]
        assert payloads == ["10000"], "one notification per statement, payload = number of tokens"
        ids = drain(writer, 1000)
    assert len(ids) == len(set(ids)) == 10000
    assert ids == sorted(ids)


def test_notify_counts_per_statement(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener, psycopg.connect(db_url, autocommit=True) as writer:
        listener.execute("LISTEN token_insert")
        listener.execute("SELECT mailroom.listen(ARRAY['token_insert'])")  # sql/08: announced while registered
        writer.execute("SELECT mailroom.create_account('one@example.com', 'one')")
        writer.execute("UPDATE mailroom.accounts SET status = 'active'")
        writer.execute("INSERT INTO mailroom.tokens (account, action) SELECT id, 'password_recovery' "
                       "FROM mailroom.accounts CROSS JOIN generate_series(1, 3)")
        writer.execute("SELECT mailroom.set_setting('tokens.channel', 'other_channel')")
        writer.execute("SELECT mailroom.request_password_recovery('one@example.com')")
        payloads = [n.payload for n in listener.notifies(timeout=1, stop_after=5)]
    assert payloads == ["1", "3"], "the channel comes from tokens.channel; payload is a bare count"


def test_signed_values_verify_with_python_hmac(conn: psycopg.Connection) -> None:
    conn.execute("SELECT mailroom.create_account('sig@example.com', 'sig')")
    conn.execute("SELECT mailroom.create_account('rec@example.com', 'rec')")
    conn.execute("UPDATE mailroom.accounts SET status = 'active' WHERE login = 'rec'")
    conn.execute("SELECT mailroom.request_password_recovery('rec@example.com')")
    rows = dequeue(conn, 10)  # the activation token; this call issues the requested one (issue 21)
    rows += dequeue(conn, 10)  # which the next call hands out
    assert sorted(r[0] for r in rows) == ["activation", "password_recovery"]
    for action, _email, _login, signed, code, token_id in rows:
        assert len(signed) == 86 and "=" not in signed
        raw = b64url_decode(signed)
        secret, mac = raw[:32], raw[32:]
        assert hmac.compare_digest(mac, expected_mac(KEY, action, secret, code))
        stored = conn.execute(
            "SELECT secret, code, secret_digest FROM mailroom.tokens WHERE id = %s", (token_id,)
        ).fetchone()
        assert stored[0] is None and stored[1] is None, "no plaintext after dispatch"
        assert bytes(stored[2]) == hashlib.sha256(secret).digest()


def test_fixed_vector_matches_python(conn: psycopg.Connection) -> None:
    secret = bytes(range(32))
    for action, code in (("activation", None), ("password_recovery", "01234")):
        signed = conn.execute("SELECT mailroom.sign_token(%s, %s, %s)", (action, secret, code)).fetchone()[0]
        expected = base64.urlsafe_b64encode(secret + expected_mac(KEY, action, secret, code or "")).rstrip(b"=")
        assert signed == expected.decode()


def test_dequeue_uses_the_partial_index_at_size(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO mailroom.accounts (email, login) SELECT 'p' || g || '@example.com', 'p' || g "
                 "FROM generate_series(1, 10000) AS g")
    conn.execute("UPDATE mailroom.tokens SET dispatched_at = mailroom.clock() WHERE id % 500 <> 0")
    conn.execute("ANALYZE mailroom.tokens")
    conn.execute("ANALYZE mailroom.accounts")
    plans: list[str] = []
    conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_min_duration = 0")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET client_min_messages = log")
    for limit in (10, 1000):
        plans.clear()
        with conn.transaction(force_rollback=True):
            rows = dequeue(conn, limit)
        assert len(rows) == min(limit, 20)
        inner = [p for p in plans if "CTE picked" in p]
        assert inner, plans
        # tokens is partitioned by time (docs/retention.md): each partition has its share of
        # tokens_pending_idx, named <partition>_pending_idx; a partition of a few pages (or one
        # created ahead, empty) may be read by a Seq Scan, cheaper than an index descent
        assert re.search(r"Index Scan using tokens_(p\d{8}t\d{4}|default)_pending_idx on tokens_", inner[0])
        scanned = re.findall(r"Seq Scan on (tokens\w*)", inner[0])
        big = conn.execute("SELECT array_agg(relname::text) FROM pg_class WHERE relname = ANY(%s) "
                           "AND relnamespace = 'mailroom'::regnamespace AND pg_relation_size(oid) > 8 * 8192",
                           (scanned,)).fetchone()[0]
        assert big is None, f"sequential scan of {big}"


def _recovery_token(conn: psycopg.Connection, email: str = "lock@example.com") -> tuple[str, str, int]:
    conn.execute("SELECT mailroom.create_account(%s, 'lock')", (email,))
    conn.execute("UPDATE mailroom.accounts SET status = 'active'")
    conn.execute("SELECT mailroom.request_password_recovery(%s)", (email,))
    rows = [r for r in dequeue(conn, 10) + dequeue(conn, 10) if r[0] == "password_recovery"]  # issue, then hand out
    assert len(rows) == 1
    return rows[0][3], rows[0][4], rows[0][5]


def test_wrong_codes_count_in_autocommit_and_in_a_committed_transaction(conn: psycopg.Connection, db_url: str) -> None:
    """A wrong code is a result row, not an error, so its count commits with the caller (no dblink)."""
    signed, code, token_id = _recovery_token(conn)
    wrong = f"{(int(code) + 1) % 100000:05d}"
    consume = "SELECT account, outcome, attempts_left FROM mailroom.consume_token(%s, %s)"
    # four wrong codes, each in its own (autocommit) transaction
    for left in (4, 3, 2, 1):
        assert conn.execute(consume, (signed, wrong)).fetchone() == (None, "wrong_code", left)
    # a fifth inside an explicit transaction that commits
    with psycopg.connect(db_url) as other:
        assert other.execute(consume, (signed, wrong)).fetchone() == (None, "wrong_code", 0)
        other.commit()
    attempts = conn.execute("SELECT code_attempts FROM mailroom.tokens WHERE id = %s", (token_id,)).fetchone()[0]
    assert attempts == 5
    # burned: even the right code is now refused
    assert sqlstate_of(conn, consume, (signed, code)) == "MR116"
    assert conn.execute("SELECT consumed_at FROM mailroom.tokens WHERE id = %s", (token_id,)).fetchone()[0] is None


def test_right_code_after_some_wrong_ones(conn: psycopg.Connection) -> None:
    signed, code, _ = _recovery_token(conn)
    wrong = f"{(int(code) + 7) % 100000:05d}"
    assert conn.execute("SELECT outcome FROM mailroom.consume_token(%s, %s)",
                        (signed, wrong)).fetchone()[0] == "wrong_code"
    account = conn.execute("SELECT account FROM mailroom.consume_token(%s, %s)", (signed, code)).fetchone()[0]
    assert account == conn.execute("SELECT id FROM mailroom.accounts").fetchone()[0]


def test_two_concurrent_consumes_only_one_succeeds(db_url: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT mailroom.create_account('race@example.com', 'race')")
    signed = dequeue(conn, 10)[0][3]
    with psycopg.connect(db_url) as a, psycopg.connect(db_url) as b:
        assert a.execute("SELECT account FROM mailroom.consume_token(%s)", (signed,)).fetchone()[0]
        result: dict[str, str | None] = {}

        def second() -> None:
            result["b"] = sqlstate_of(b, "SELECT mailroom.consume_token(%s)", (signed,))

        t = threading.Thread(target=second)
        t.start()
        t.join(timeout=0.5)
        assert t.is_alive(), "the second consume waits for the first transaction"
        a.commit()
        t.join(timeout=10)
        assert result["b"] == "MR114"


def test_key_rotation_and_errors_from_python(conn: psycopg.Connection) -> None:
    conn.execute("SELECT mailroom.create_account('rot@example.com', 'rot')")
    conn.execute("SELECT mailroom.create_account('rot2@example.com', 'rot2')")
    signed, signed2 = (r[3] for r in dequeue(conn, 10))
    old_id = conn.execute("SELECT id FROM mailroom.signing_keys WHERE state = 'active'").fetchone()[0]
    new_id = conn.execute("SELECT mailroom.rotate_signing_key()").fetchone()[0]
    verify = "SELECT valid, action::text, key_id FROM mailroom.verify_token(%s)"
    assert conn.execute(verify, (signed,)).fetchone() == (True, "activation", old_id)
    assert conn.execute("SELECT account FROM mailroom.consume_token(%s)", (signed,)).fetchone()[0]
    conn.execute("SELECT mailroom.retire_signing_key(%s)", (old_id,))
    assert sqlstate_of(conn, "SELECT mailroom.consume_token(%s)", (signed2,)) == "MR111"
    assert sqlstate_of(conn, "SELECT mailroom.consume_token(%s)", ("x" * 86,)) == "MR110"
    # the previous release's call, with its key: still accepted for one release
    conn.execute("SELECT mailroom.create_account('rot3@example.com', 'rot3')")
    (row,) = dequeue(conn, 10)
    assert conn.execute(verify, (row[3],)).fetchone() == (True, "activation", new_id)
    assert conn.execute("SELECT account FROM mailroom.consume_token(%s, %s, NULL, %s)",
                        (row[3], OLD_KEY, [OLD_KEY])).fetchone()[0]


def test_concurrent_duplicate_email_is_a_clean_error(db_url: str) -> None:
    with psycopg.connect(db_url) as a, psycopg.connect(db_url) as b:
        a.execute("SELECT mailroom.create_account('Dup@Example.com', 'dup1')")
        result: dict[str, str | None] = {}

        def second() -> None:
            result["b"] = sqlstate_of(b, "SELECT mailroom.create_account('dup@example.COM', 'dup2')", ())

        t = threading.Thread(target=second)
        t.start()
        t.join(timeout=0.5)
        assert t.is_alive(), "the second insert waits on the unique index"
        a.commit()
        t.join(timeout=10)
        assert result["b"] == "MR102"
        b.rollback()
        count = b.execute("SELECT count(*) FROM mailroom.accounts").fetchone()[0]
        tokens = b.execute("SELECT count(*) FROM mailroom.tokens").fetchone()[0]
    assert (count, tokens) == (1, 1), "the refused account left no orphan token"


def test_terminated_collector_loses_nothing(db_url: str, conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO mailroom.accounts (email, login) SELECT 'k' || g || '@example.com', 'k' || g "
                 "FROM generate_series(1, 30) AS g")
    victim = psycopg.connect(db_url)
    try:
        assert len(dequeue(victim, 20)) == 20  # claimed, not committed
        pid = victim.info.backend_pid
        assert conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()[0]
        with pytest.raises(psycopg.OperationalError):
            victim.execute("SELECT 1")
    finally:
        victim.close()
    ids = drain(conn, 7)
    assert len(ids) == len(set(ids)) == 30, "the killed collector's claims went back to the queue"


def _blocks_hit(conn: psycopg.Connection) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("SELECT blks_hit FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]


def test_dequeue_reads_by_its_limit_not_by_the_backlog(conn: psycopg.Connection) -> None:
    """Statistics taken while few tokens were pending must not make the pick join every pending token
    and sort them (issue 25: dequeue_tokens(100) touched ~5 buffers per pending token, 50 ms at 3,000)."""
    conn.execute("INSERT INTO mailroom.accounts (email, login) VALUES ('first@example.com', 'first')")
    conn.execute("ANALYZE mailroom.tokens")
    conn.execute("ANALYZE mailroom.accounts")  # the planner now believes almost nothing is pending
    conn.execute("INSERT INTO mailroom.accounts (email, login) SELECT 'many' || g || '@example.com', 'many' || g"
                 " FROM generate_series(1, 6000) AS g")
    dequeue(conn, 100)  # plans cached, pages in memory
    before = _blocks_hit(conn)
    assert len(dequeue(conn, 100)) == 100
    touched = _blocks_hit(conn) - before
    # ~1,000 for the 100 rows it takes (their tokens, accounts, index pages, the signing); the
    # defect read every pending token and its account: more than 20,000 here
    assert touched < 5000, touched
