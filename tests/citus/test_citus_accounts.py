"""Accounts and tokens distributed on Citus (issue 26): accounts by id, tokens by account, colocated;
login and email kept unique through lookup tables; dequeue_tokens shard by shard (sql/citus/12)."""

from __future__ import annotations

import re
import threading
import uuid

import psycopg
import psycopg.sql
import pytest

from mailroom import testing

pytestmark = pytest.mark.citus


def _app(cconn):
    return psycopg.connect(testing.as_login(cconn.info.dsn, "mr_app"), autocommit=True)


def test_accounts_and_tokens_are_distributed_and_colocated(cconn):
    rows = dict(cconn.execute(
        "SELECT logicalrelid::regclass::text, (partmethod, colocationid)::text FROM pg_dist_partition"
        " WHERE logicalrelid::regclass::text IN ('mailroom.accounts', 'mailroom.tokens',"
        " 'mailroom.account_emails', 'mailroom.account_logins')"
    ).fetchall())
    assert set(rows) == {"mailroom.accounts", "mailroom.tokens", "mailroom.account_emails", "mailroom.account_logins"}
    assert all(v.startswith("(h,") for v in rows.values())
    assert rows["mailroom.accounts"] == rows["mailroom.tokens"]
    keys = {r[0] for r in cconn.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = 'mailroom.tokens'::regclass AND contype IN ('p', 'u', 'f')"
    ).fetchall()}
    assert "PRIMARY KEY (account, id, created_at)" in keys
    assert any(k.startswith("FOREIGN KEY (account) REFERENCES mailroom.accounts(id)") for k in keys)


def test_create_account_duplicates_are_named_as_on_one_node(cconn):
    tag = uuid.uuid4().hex[:8]
    with _app(cconn) as app:
        first = app.execute("SELECT mailroom.create_account(%s, %s)", (f"dup-{tag}@example.com", f"dup-{tag}")).fetchone()[0]
        # the account and its activation token, on one shard
        assert app.execute("SELECT mailroom.account_status(%s)", (first,)).fetchone()[0] == "provisioned"
        assert cconn.execute("SELECT count(*) FROM mailroom.tokens WHERE account = %s AND action = 'activation'",
                             (first,)).fetchone()[0] == 1
        for email, login, code in [
            (f"DUP-{tag}@Example.com", f"other-{tag}", "MR102"),   # email, whatever its case
            (f"dup-{tag}@example.com", f"dup-{tag}", "MR102"),     # both taken: the email is named
            (f"new-{tag}@example.com", f"dup-{tag}", "MR103"),     # login
            ("not-an-email", f"x-{tag}", "MR101"),
        ]:
            with pytest.raises(psycopg.Error) as err:
                app.execute("SELECT mailroom.create_account(%s, %s)", (email, login))
            assert err.value.sqlstate == code, (email, login)
        # a refused create leaves no lookup row, no account and no token behind
        assert cconn.execute("SELECT count(*) FROM mailroom.account_logins WHERE login = %s",
                             (f"other-{tag}",)).fetchone()[0] == 0
        assert cconn.execute("SELECT count(*) FROM mailroom.account_emails WHERE email = %s",
                             (f"new-{tag}@example.com",)).fetchone()[0] == 0
        assert cconn.execute("SELECT count(*) FROM mailroom.accounts WHERE login LIKE %s",
                             (f"%{tag}",)).fetchone()[0] == 1


def test_create_account_announces_on_the_coordinator(cconn):
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_collector"), autocommit=True) as listener:
        channel = listener.execute("SELECT mailroom.setting('tokens.channel')").fetchone()[0]
        listener.execute("SELECT mailroom.listen(%s)", ([channel],))
        listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        tag = uuid.uuid4().hex[:8]
        with _app(cconn) as app:
            app.execute("SELECT mailroom.create_account(%s, %s)", (f"n-{tag}@example.com", f"n-{tag}"))
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert heard == ["1"]


def test_two_collectors_get_every_token_once(cconn):
    tag = uuid.uuid4().hex[:8]
    with _app(cconn) as app:
        ids = {app.execute("SELECT mailroom.create_account(%s, %s)",
                           (f"c{i}-{tag}@example.com", f"c{i}-{tag}")).fetchone()[0] for i in range(60)}
    url = testing.as_login(cconn.info.dsn, "mr_collector")
    got: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def collect(k: int) -> None:
        try:
            with psycopg.connect(url) as conn:
                while True:
                    with conn.transaction():
                        rows = conn.execute("SELECT login FROM mailroom.dequeue_tokens(7)").fetchall()
                    if not rows:
                        return
                    got[k].extend(r[0] for r in rows)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=collect, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    mine = [x for x in got[0] + got[1] if x.endswith(tag)]
    assert len(mine) == len(set(mine)) == len(ids)  # every token of these accounts, each once
    assert got[0] and got[1] or len(mine) == 60


def test_consume_activates_the_account(cconn):
    tag = uuid.uuid4().hex[:8]
    with _app(cconn) as app:
        account = app.execute("SELECT mailroom.create_account(%s, %s)", (f"a-{tag}@example.com", f"a-{tag}")).fetchone()[0]
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_collector")) as coll:
        signed = None
        for _ in range(50):
            rows = coll.execute("SELECT login, signed FROM mailroom.dequeue_tokens(100)").fetchall()
            coll.commit()
            signed = next((s for lg, s in rows if lg == f"a-{tag}"), None)
            if signed or not rows:
                break
    assert signed
    with _app(cconn) as app:
        row = app.execute("SELECT account, outcome FROM mailroom.consume_token(%s)", (signed,)).fetchone()
        assert tuple(row) == (account, "consumed")
        assert app.execute("SELECT mailroom.account_status(%s)", (account,)).fetchone()[0] == "active"
        with pytest.raises(psycopg.Error) as err:
            app.execute("SELECT * FROM mailroom.consume_token(%s)", (signed,))
        assert err.value.sqlstate == "MR114"


def test_erase_address_leaves_no_trace_and_the_address_can_register_again(cconn):
    """erase_address on Citus: the account, its token, the mail to it and its lookup rows go; the
    same email (any case) and login can then register again."""
    tag = uuid.uuid4().hex[:8]
    email = f"Gone-{tag}@Example.com"
    cconn.execute("SELECT mailroom.upsert_sender('erase', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    with _app(cconn) as app:
        account = app.execute("SELECT mailroom.create_account(%s, %s)", (email, f"gone-{tag}")).fetchone()[0]
        # mail to it alone (deleted) and shared with another recipient (rewritten, on its lane's shard)
        alone = app.execute("SELECT mailroom.enqueue_message('erase', ARRAY[%s], 'hi', 'b')", (email,)).fetchone()[0]
        shared = app.execute(
            "SELECT mailroom.enqueue_message('erase', ARRAY[%s, %s], %s, 'b')",
            (email, f"keep-{tag}@example.com", f"about {email.lower()}"),
        ).fetchone()[0]
    assert cconn.execute("SELECT count(*) FROM mailroom.account_emails WHERE account = %s", (account,)).fetchone()[0] == 1

    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_admin"), autocommit=True) as admin:
        dry = dict(admin.execute("SELECT * FROM mailroom.erase_address(%s, true)", (email,)).fetchall())
        assert (dry["accounts"], dry["tokens"], dry["outbound_messages_deleted"], dry["outbound_messages_rewritten"]) \
            == (1, 1, 1, 1)
        assert cconn.execute("SELECT count(*) FROM mailroom.account_emails WHERE account = %s",
                             (account,)).fetchone()[0] == 1  # a dry run changes nothing
        done = dict(admin.execute("SELECT * FROM mailroom.erase_address(%s)", (email,)).fetchall())
        assert (done["accounts"], done["tokens"], done["outbound_messages_deleted"]) == (1, 1, 1)

    lower = email.lower()
    for sql, arg in [
        ("SELECT count(*) FROM mailroom.account_emails WHERE email = %s OR account = %s", (lower, account)),
        ("SELECT count(*) FROM mailroom.account_logins WHERE login = %s OR account = %s", (f"gone-{tag}", account)),
        ("SELECT count(*) FROM mailroom.accounts WHERE id = %s OR lower(email) = %s", (account, lower)),
        ("SELECT count(*) FROM mailroom.tokens WHERE account = %s", (account,)),
        ("SELECT count(*) FROM mailroom.outbound_messages WHERE id = %s", (alone,)),
        ("SELECT count(*) FROM mailroom.outbound_messages WHERE id = %s AND (%s = ANY (to_addrs) OR subject ILIKE %s)",
         (shared, email, f"%{lower}%")),
    ]:
        assert cconn.execute(sql, arg).fetchone()[0] == 0, sql
    # erased in place (issue 34: signed positions stay), the other recipient keeps its position
    assert cconn.execute("SELECT to_addrs FROM mailroom.outbound_messages WHERE id = %s",
                         (shared,)).fetchone()[0] == [
        cconn.execute("SELECT mailroom_internal._erased_recipient(%s)", (email,)).fetchone()[0], f"keep-{tag}@example.com"]

    with _app(cconn) as app:
        again = app.execute("SELECT mailroom.create_account(%s, %s)", (email, f"gone-{tag}")).fetchone()[0]
    assert again != account
    assert cconn.execute("SELECT account FROM mailroom.account_emails WHERE email = %s", (lower,)).fetchone()[0] == again


def test_account_times_are_the_callers_pinned_clock(cconn):
    """The account row's triggers run on a worker, whose mailroom.clock() is not the caller's: every
    time an account gets (created, activated, suspended, unsuspended) is the coordinator's clock, so
    a pinned clock is obeyed on Citus as on one node (the worker's real clock was stamped before)."""
    tag = uuid.uuid4().hex[:8]
    times = ["2030-01-02 03:04:05+00", "2030-01-02 03:05:05+00", "2030-01-02 03:06:05+00", "2030-01-02 03:07:05+00"]

    def pin(conn, at):
        conn.execute("SELECT set_config('mailroom.clock', %s, false)", (at,))

    def stamped(account):
        return cconn.execute(
            "SELECT created_at::text, activated_at::text, suspended_at::text, unsuspended_at::text,"
            " status_changed_at::text FROM mailroom.accounts WHERE id = %s", (account,)).fetchone()

    with _app(cconn) as app:
        pin(app, times[0])
        account = app.execute("SELECT mailroom.create_account(%s, %s)", (f"t-{tag}@example.com", f"t-{tag}")).fetchone()[0]
        assert stamped(account)[0] == times[0]
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_collector")) as coll:
        pin(coll, times[0])
        signed = None
        for _ in range(50):
            rows = coll.execute("SELECT login, signed FROM mailroom.dequeue_tokens(100)").fetchall()
            coll.commit()
            signed = next((s for lg, s in rows if lg == f"t-{tag}"), None)
            if signed or not rows:
                break
    assert signed
    with _app(cconn) as app:
        pin(app, times[1])
        assert app.execute("SELECT outcome FROM mailroom.consume_token(%s)", (signed,)).fetchone()[0] == "consumed"
        pin(app, times[2])
        app.execute("SELECT mailroom.suspend_account(%s)", (account,))
        assert stamped(account)[1:] == (times[1], times[2], None, times[2])
        pin(app, times[3])
        app.execute("SELECT mailroom.unsuspend_account(%s)", (account,))
        assert stamped(account)[1:] == (times[1], None, times[3], times[3])


def test_the_deprecated_keyed_consume_activates_too(cconn):
    """consume_token(p_signed, p_key, …), kept for one release, activates the account on Citus as
    the keyless form does (both call _after_consume; it did not on Citus, where the activation was
    written into the keyless form only)."""
    tag = uuid.uuid4().hex[:8]
    with _app(cconn) as app:
        account = app.execute("SELECT mailroom.create_account(%s, %s)", (f"k-{tag}@example.com", f"k-{tag}")).fetchone()[0]
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_collector")) as coll:
        signed = None
        for _ in range(50):
            rows = coll.execute("SELECT login, signed FROM mailroom.dequeue_tokens(100)").fetchall()
            coll.commit()
            signed = next((s for lg, s in rows if lg == f"k-{tag}"), None)
            if signed or not rows:
                break
    assert signed
    with _app(cconn) as app:
        row = app.execute("SELECT account, outcome FROM mailroom.consume_token(%s, %s::bytea)",
                          (signed, bytes(32))).fetchone()
        assert tuple(row) == (account, "consumed")
        assert app.execute("SELECT mailroom.account_status(%s)", (account,)).fetchone()[0] == "active"


def test_dequeue_of_one_reads_without_a_transaction_and_writes_no_coordinator_row(cconn, remote_commands):
    """issue 46: dequeue_tokens' reads of every shard (expired tokens, candidates) are plain reads,
    sent before any transaction is opened on a worker (as a sublink they were intermediate results:
    a transaction on every worker and a statement more on the coordinator); with no recovery request
    pending nothing on the coordinator is written or locked, and one token's digest goes by a routed
    INSERT, not a COPY: so the commit is one-phase when the token and its digest share a worker."""
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_collector")) as coll:
        while coll.execute("SELECT count(*) FROM mailroom.dequeue_tokens(1000)").fetchone()[0]:
            coll.commit()
        coll.commit()
    cconn.execute("DELETE FROM mailroom.recovery_requests")
    for _ in range(6):
        tag = uuid.uuid4().hex[:8]
        with _app(cconn) as app:
            app.execute("SELECT mailroom.create_account(%s, %s)", (f"d-{tag}@example.com", f"d-{tag}"))
        rows, sent = remote_commands(cconn, "SELECT login FROM mailroom.dequeue_tokens(1)", local=True)
        assert [r[0] for r in rows] == [f"d-{tag}"]
        first_write = next(i for i, c in enumerate(sent) if c.startswith("BEGIN"))
        assert [c for c in sent[:first_write] if c.startswith("SELECT account")], sent  # the candidates, read before it
        assert not [c for c in sent if c.startswith(("COPY", "locally: SELECT (EXISTS", "locally: SELECT array_agg"))], sent
        assert not [c for c in sent if c.startswith("locally:") and "recovery_requests" in c
                    and any(w in c for w in ("DELETE", "UPDATE", "FOR UPDATE"))], sent
        shards = {int(m) for c in sent for m in re.findall(r"mailroom\.(?:tokens|token_digests)_(\d+)", c)
                  if c.startswith(("WITH picked", "INSERT INTO mailroom.token_digests"))}
        nodes = {cconn.execute("SELECT mailroom_internal._shard_node(%s)", (s,)).fetchone()[0] for s in shards}
        prepared = [c for c in sent if c.startswith("PREPARE TRANSACTION")]
        assert len(prepared) == (0 if len(nodes) == 1 else len(nodes)), (nodes, sent)
