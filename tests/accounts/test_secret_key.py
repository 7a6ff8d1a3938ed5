"""MAILROOM_SECRET_KEY is never silently ignored (issue 33, item 2): a command that signs (collect,
send) started with it checks, by its fingerprint, that it is the keyring's active key, and refuses to
start with one line naming `mailroom keys import --active` (exit 2) when it is not."""

from __future__ import annotations

import hashlib
import time

import psycopg
import pytest
from collector_support import KEY, KEY_HEX, Collector, verify_signed

OTHER_HEX = "0badf00d" * 8  # a key the keyring does not hold


def _fingerprint(hex_key: str) -> str:
    return hashlib.sha256(bytes.fromhex(hex_key)).digest()[:8].hex()


def _refused(proc, fp: str, what: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith("mailroom: error: "), line
    assert f"fingerprint {fp}" in line and what in line, line
    assert "mailroom keys import --active" in line, line


@pytest.mark.parametrize("command", [("collect",), ("send", "--until-idle", "--poll-interval", "0.1s")])
def test_a_key_the_keyring_does_not_hold_is_refused_with_one_line(cli, command):
    proc = cli(*command, env={"MAILROOM_SECRET_KEY": OTHER_HEX}, timeout=60)
    _refused(proc, _fingerprint(OTHER_HEX), "not in the keyring")
    assert OTHER_HEX not in proc.stderr + proc.stdout, "the key itself is never printed"


@pytest.mark.parametrize("command", [("collect",), ("send", "--until-idle", "--poll-interval", "0.1s")])
def test_a_verify_only_key_is_refused_too(cli, conn, command):
    """The previous release's key imported as verify-only (links already sent keep working) still does
    not sign: a verifier holding it would fail every new link."""
    conn.execute("SELECT mailroom.import_signing_key(%s)", (bytes.fromhex(OTHER_HEX),))
    proc = cli(*command, env={"MAILROOM_SECRET_KEY": OTHER_HEX}, timeout=60)
    _refused(proc, _fingerprint(OTHER_HEX), "verify-only")


def test_a_malformed_key_is_refused_before_connecting(cli):
    proc = cli("send", "--until-idle", env={"MAILROOM_SECRET_KEY": "nothex", "MAILROOM_DATABASE_URL": "port=1"})
    assert proc.returncode == 2 and proc.stderr.strip() == \
        "mailroom: error: MAILROOM_SECRET_KEY must be 64 hex characters (32 bytes), got 6 characters"


def test_the_sender_starts_with_the_active_key(cli, conn):
    conn.execute("SELECT mailroom.import_signing_key(%s, true)", (bytes.fromhex(OTHER_HEX),))
    proc = cli("send", "--until-idle", "--poll-interval", "0.1s", env={"MAILROOM_SECRET_KEY": OTHER_HEX}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "started" in proc.stderr


def test_the_collector_starts_with_the_active_key_and_signs_with_it(db_url, conn):
    """(Collector makes KEY the active key, as an import would.) The links it writes verify with the
    key the environment holds: what the application's verifier has."""
    c = Collector(db_url, env={"MAILROOM_SECRET_KEY": KEY_HEX, "MAILROOM_BATCH_LIMIT": "1",
                               "MAILROOM_BATCH_TIMEOUT": "50"})
    try:
        c.wait_stderr("waiting for notifications")
        conn.execute("SELECT mailroom.create_account('keyed@example.test', 'keyed')")
        (record,) = c.records(1)
        verify_signed(record, KEY)
        assert KEY_HEX not in c.stderr_text()
    finally:
        c.kill()


def test_a_rotation_after_the_start_does_not_stop_a_running_collector(db_url, conn):
    """The check is made at the start: a key rotated while it runs is the operator's own doing."""
    c = Collector(db_url, env={"MAILROOM_SECRET_KEY": KEY_HEX, "MAILROOM_BATCH_LIMIT": "1",
                               "MAILROOM_BATCH_TIMEOUT": "50"})
    try:
        c.wait_stderr("waiting for notifications")
        conn.execute("SELECT mailroom.rotate_signing_key()")
        conn.execute("SELECT mailroom.create_account('rotated@example.test', 'rotated')")
        assert len(c.records(1)) == 1
        time.sleep(0.2)
        assert c.proc.poll() is None
    finally:
        c.kill()


def test_the_check_needs_no_admin_rights(db_url):
    """The collector's and the sender's roles ask about one fingerprint; they cannot list the keyring."""
    from mailroom.testing import as_login

    for login in ("mr_collector", "mr_sender"):
        with psycopg.connect(as_login(db_url, login), autocommit=True) as conn:
            assert conn.execute("SELECT mailroom.signing_key_state_of(%s)", (_fingerprint(OTHER_HEX),)).fetchone()[0] \
                is None
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT * FROM mailroom.list_signing_keys()")
    assert KEY  # (the helper's key is the one the Collector makes active)


def test_the_check_a_worker_makes_on_its_first_connection(db_url):
    """A worker started while the database is out of reach checks on its first connection (the
    collector on its work connection, in a transaction it rolls back; the sender async)."""
    import asyncio

    from mailroom.core.errors import ConfigError
    from mailroom.db import keyring as secret_key
    from mailroom.testing import as_login

    fp = _fingerprint(OTHER_HEX)
    with psycopg.connect(as_login(db_url, "mr_collector")) as work:
        with pytest.raises(ConfigError, match="mailroom keys import --active"):
            secret_key.check(work, "collect", fp)
        assert work.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # rolled back
        secret_key.check(work, "collect", None)  # no variable: nothing asked

    async def sender() -> None:
        async with await psycopg.AsyncConnection.connect(as_login(db_url, "mr_sender"), autocommit=True) as conn:
            with pytest.raises(ConfigError, match="not in the keyring"):
                await secret_key.acheck(conn, "send", fp)

    asyncio.run(sender())
    # the active key passes (KEY, made active as an import would)
    with psycopg.connect(db_url, autocommit=True) as owner:
        owner.execute("SELECT mailroom.import_signing_key(%s, true)", (KEY,))
    with psycopg.connect(as_login(db_url, "mr_collector"), autocommit=True) as conn:
        secret_key.check(conn, "collect", secret_key.fingerprint(KEY))
