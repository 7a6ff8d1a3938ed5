"""consume_token on Citus without a fan-out (issue 26, docs/scale.md): the token's account through
the lookup table token_digests (distributed by the digest), then the token on its account's shard
(sql/citus/13). The statements each call sends to the workers are read with
citus.log_remote_commands: a routed call names one shard of tokens, a fan-out every one."""

from __future__ import annotations

import base64
import hashlib
import re
import uuid

import psycopg
import pytest

from mailroom import testing

pytestmark = pytest.mark.citus

SHARD = re.compile(r"mailroom\.(tokens|token_digests)_(\d+)\b")


def _app(cconn):
    return psycopg.connect(testing.as_login(cconn.info.dsn, "mr_app"), autocommit=True)


def _digest(signed: str) -> bytes:
    raw = base64.urlsafe_b64decode(signed + "=" * (-len(signed) % 4))
    return hashlib.sha256(raw[:32]).digest()


def _dequeued(cconn, login: str) -> tuple[str, str]:
    """The (signed, code) a collector gets for this login's pending token."""
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_collector")) as coll:
        for attempt in range(50):
            rows = coll.execute("SELECT login, signed, code FROM mailroom.dequeue_tokens(100)").fetchall()
            coll.commit()
            hit = next(((s, c) for lg, s, c in rows if lg == login), None)
            # a recovery request becomes a token at the end of a call: the next one hands it out
            if hit or (not rows and attempt > 0):
                break
    assert hit, login
    return hit


def _account_and_link(cconn, prefix: str) -> tuple[int, str, str]:
    tag = uuid.uuid4().hex[:8]
    login = f"{prefix}-{tag}"
    with _app(cconn) as app:
        account = app.execute("SELECT mailroom.create_account(%s, %s)", (f"{login}@example.com", login)).fetchone()[0]
    return account, login, _dequeued(cconn, login)[0]


def _routed(cconn, sql: str, args: tuple = (),
            commands: list[str] | None = None) -> tuple[list | psycopg.Error, dict[str, set[str]]]:
    """Run sql as a call of its own; its rows (or its error) and the shards its remote commands name
    (`commands`, if given, gets every remote command's text)."""
    notices: list[str] = []

    def heard(diag: psycopg.errors.Diagnostic) -> None:
        notices.append(diag.message_primary or "")

    cconn.execute("SET citus.log_remote_commands = on")
    cconn.add_notice_handler(heard)
    try:
        try:
            result: list | psycopg.Error = cconn.execute(sql, args).fetchall()
        except psycopg.Error as exc:
            result = exc
    finally:
        cconn.remove_notice_handler(heard)
        cconn.execute("RESET citus.log_remote_commands")
    if commands is not None:
        commands += notices
    shards: dict[str, set[str]] = {"tokens": set(), "token_digests": set()}
    for message in notices:
        for table, shard in SHARD.findall(message):
            shards[table].add(shard)
    return result, shards


def _lookup(cconn, signed: str) -> int | None:
    row = cconn.execute("SELECT account FROM mailroom.token_digests WHERE secret_digest = %s",
                        (_digest(signed),)).fetchone()
    return row[0] if row else None


def test_token_digests_is_distributed_by_the_digest(cconn):
    row = cconn.execute(
        "SELECT partmethod, column_to_column_name(logicalrelid, partkey) FROM pg_dist_partition"
        " WHERE logicalrelid = 'mailroom.token_digests'::regclass"
    ).fetchone()
    assert tuple(row) == ("h", "secret_digest")


def test_consume_reads_one_shard_of_tokens(cconn):
    account, _, signed = _account_and_link(cconn, "route")
    assert _lookup(cconn, signed) == account  # written by the dequeue that minted the link
    commands: list[str] = []
    result, shards = _routed(cconn, "SELECT account, outcome FROM mailroom.consume_token(%s)", (signed,), commands)
    assert [tuple(r) for r in result] == [(account, "consumed")]
    # one shard of the lookup table, one of tokens (the account's): no fan-out
    assert len(shards["token_digests"]) == 1, shards
    assert len(shards["tokens"]) == 1, shards
    # the token read twice: found (its account, id and action, _token_by_digest) and locked; its state
    # is checked on the locked row, not read a third time (issue 46: a round trip to the worker less)
    reads = [c for c in commands if re.search(r"\bSELECT\b.*\bmailroom\.tokens_\d+", c, re.S)]
    assert len(reads) == 2 and "FOR UPDATE" in reads[1], reads
    # the account is locked by that same statement, co-located with its token (issue 46: it was a
    # statement of its own, one more round trip); no other statement reads the account
    assert re.search(r"\bmailroom\.accounts_\d+", reads[1]) and "FOR NO KEY UPDATE" in reads[1], reads[1]
    assert not [c for c in commands if re.search(r"\bSELECT\b.*\bmailroom\.accounts_\d+", c, re.S)
                and c is not reads[1]], commands
    assert cconn.execute("SELECT mailroom.account_status(%s)", (account,)).fetchone()[0] == "active"
    # a used link is refused as on one node, on the same single shard
    result, shards = _routed(cconn, "SELECT * FROM mailroom.consume_token(%s)", (signed,))
    assert isinstance(result, psycopg.Error) and result.sqlstate == "MR114"
    assert len(shards["tokens"]) == 1, shards


def test_link_minted_before_the_lookup_still_consumes(cconn):
    """A digest without a lookup row (a link handed out before token_digests existed) is found on
    every shard, as before: the same instrument then names all of them."""
    account, _, signed = _account_and_link(cconn, "legacy")
    cconn.execute("DELETE FROM mailroom.token_digests WHERE secret_digest = %s", (_digest(signed),))
    shard_count = cconn.execute(
        "SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = 'mailroom.tokens'::regclass"
    ).fetchone()[0]
    result, shards = _routed(cconn, "SELECT account, outcome FROM mailroom.consume_token(%s)", (signed,))
    assert [tuple(r) for r in result] == [(account, "consumed")]
    assert len(shards["tokens"]) == shard_count > 1, shards
    assert cconn.execute("SELECT mailroom.account_status(%s)", (account,)).fetchone()[0] == "active"


def test_refusals_keep_the_single_node_codes(cconn):
    account, _, first = _account_and_link(cconn, "refuse")
    # a reissue revokes the first link (it keeps its digest and lookup row: refused on one shard)
    cconn.execute("SELECT mailroom_internal._issue_token(%s, 'activation')", (account,))
    result, shards = _routed(cconn, "SELECT * FROM mailroom.consume_token(%s)", (first,))
    assert isinstance(result, psycopg.Error) and result.sqlstate == "MR117"
    assert len(shards["tokens"]) == 1, shards
    login = cconn.execute("SELECT login FROM mailroom.accounts WHERE id = %s", (account,)).fetchone()[0]
    second = _dequeued(cconn, login)[0]
    assert _lookup(cconn, second) == account
    # a forged MAC on a known secret, a value nobody signed, a malformed one
    raw = bytearray(base64.urlsafe_b64decode(second + "=="))
    raw[-1] ^= 1
    forged = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    nobody = base64.urlsafe_b64encode(bytes(64)).decode().rstrip("=")
    with _app(cconn) as app:
        for value, code in [(forged, "MR111"), (nobody, "MR111"), ("not-a-token", "MR110")]:
            with pytest.raises(psycopg.Error) as err:
                app.execute("SELECT * FROM mailroom.consume_token(%s)", (value,))
            assert err.value.sqlstate == code, value
        assert tuple(app.execute("SELECT account, outcome FROM mailroom.consume_token(%s)",
                                 (second,)).fetchone()) == (account, "consumed")
    # a genuine link whose token is gone while its lookup row stays: unknown, as on one node
    _, _, third = _account_and_link(cconn, "gone")
    cconn.execute("DELETE FROM mailroom.tokens WHERE secret_digest = %s", (_digest(third),))
    assert _lookup(cconn, third) is not None
    with _app(cconn) as app, pytest.raises(psycopg.Error) as err:
        app.execute("SELECT * FROM mailroom.consume_token(%s)", (third,))
    assert err.value.sqlstate == "MR112"


def test_recovery_codes_count_on_one_shard(cconn):
    account, login, signed = _account_and_link(cconn, "recover")
    with _app(cconn) as app:
        app.execute("SELECT * FROM mailroom.consume_token(%s)", (signed,))
        app.execute("SELECT mailroom.request_password_recovery(%s)", (f"{login}@example.com",))
    signed, code = _dequeued(cconn, login)
    assert code and _lookup(cconn, signed) == account
    wrong = "00000" if code != "00000" else "11111"
    max_attempts = int(cconn.execute("SELECT mailroom.setting('tokens.max_code_attempts')").fetchone()[0])
    result, shards = _routed(cconn, "SELECT account, outcome, attempts_left FROM mailroom.consume_token(%s, %s)",
                             (signed, wrong))
    assert [tuple(r) for r in result] == [(None, "wrong_code", max_attempts - 1)]
    assert len(shards["tokens"]) == 1, shards
    with _app(cconn) as app:
        with pytest.raises(psycopg.Error) as err:
            app.execute("SELECT * FROM mailroom.consume_token(%s)", (signed,))
        assert err.value.sqlstate == "MR119"
        row = app.execute("SELECT account, outcome, attempts_left FROM mailroom.consume_token(%s, %s)",
                          (signed, code)).fetchone()
    assert tuple(row) == (account, "consumed", max_attempts - 2)


def test_a_minted_link_replaces_the_lookup_row(cconn):
    """A token email's link (_mint_token, the claim's rendering): the previous link's row goes, the
    new one's is written; the old link is then unknown, the new one consumes."""
    account, _, old = _account_and_link(cconn, "mint")
    token = cconn.execute("SELECT id FROM mailroom.tokens WHERE secret_digest = %s", (_digest(old),)).fetchone()[0]
    new = cconn.execute("SELECT signed FROM mailroom_internal._mint_token(%s)", (token,)).fetchone()[0]
    assert _lookup(cconn, old) is None
    assert _lookup(cconn, new) == account
    with _app(cconn) as app:
        with pytest.raises(psycopg.Error) as err:
            app.execute("SELECT * FROM mailroom.consume_token(%s)", (old,))
        assert err.value.sqlstate == "MR112"
        assert tuple(app.execute("SELECT account, outcome FROM mailroom.consume_token(%s)",
                                 (new,)).fetchone()) == (account, "consumed")


def test_erasure_leaves_no_digest_row(cconn):
    account, login, signed = _account_and_link(cconn, "erase")
    assert _lookup(cconn, signed) == account
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_admin"), autocommit=True) as admin:
        admin.execute("SELECT * FROM mailroom.erase_address(%s)", (f"{login}@example.com",)).fetchall()
    assert cconn.execute("SELECT count(*) FROM mailroom.token_digests WHERE account = %s",
                         (account,)).fetchone()[0] == 0


def test_deleted_tokens_take_their_lookup_rows(cconn):
    """Retention (a partition's closed or expired tokens), purge_tokens and a tokens partition
    dropped: the deleted tokens' digests leave token_digests. Last in this module: it deletes
    closed tokens of the partitions it names, and purges every token."""
    links = {kind: _account_and_link(cconn, kind) for kind in ("consumed", "revoked", "expired", "purged")}
    with _app(cconn) as app:
        app.execute("SELECT * FROM mailroom.consume_token(%s)", (links["consumed"][2],))
    cconn.execute("SELECT mailroom_internal._issue_token(%s, 'activation')", (links["revoked"][0],))
    cconn.execute("UPDATE mailroom.tokens SET expires_at = now() - interval '1 second' WHERE account = %s",
                  (links["expired"][0],))
    assert all(_lookup(cconn, s) == a for a, _, s in links.values())
    partitions = {_partition(cconn, links[kind][2]) for kind in ("consumed", "revoked", "expired")}

    # past retention (cut-off: a minute from now): the consumed, revoked and expired tokens go
    for name in partitions:
        cconn.execute("SELECT mailroom_internal._delete_tokens_past_retention(%s, now() + interval '1 minute', 1000)", (name,))
    for kind in ("consumed", "revoked", "expired"):
        assert _lookup(cconn, links[kind][2]) is None, kind
    assert _lookup(cconn, links["purged"][2]) == links["purged"][0]  # still open: kept, with its row

    with cconn.transaction():
        cconn.execute("SELECT mailroom.pin_clock(now() + interval '400 days')")
        assert cconn.execute("SELECT mailroom.purge_tokens('1 day')").fetchone()[0] >= 1
    assert cconn.execute("SELECT count(*) FROM mailroom.tokens WHERE account = %s",
                         (links["purged"][0],)).fetchone()[0] == 0
    assert _lookup(cconn, links["purged"][2]) is None

    # before _maintain_partitions drops a tokens partition (sql/05's seam)
    _, _, dropped = _account_and_link(cconn, "dropped")
    cconn.execute("SELECT mailroom_internal._forget_token_digests(%s)", (_partition(cconn, dropped),))
    assert _lookup(cconn, dropped) is None


def _partition(cconn, signed: str) -> str:
    """The tokens partition holding this link's token (its row's table on a worker is the
    partition's shard: the name less its shard id)."""
    shard = cconn.execute("SELECT tableoid::regclass::text FROM mailroom.tokens WHERE secret_digest = %s",
                          (_digest(signed),)).fetchone()[0]
    return re.sub(r"_\d+$", "", shard.removeprefix("mailroom."))
