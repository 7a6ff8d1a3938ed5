"""The application as its own least-privilege login (mailroom_app): what it can do, what it cannot,
and the rules no caller can bend (the clock, the consume / suspend race)."""

from __future__ import annotations

import threading

import psycopg
import pytest

from mailroom.testing import as_login


def sqlstate_of(conn: psycopg.Connection, query: str, params: tuple = ()) -> str | None:
    try:
        conn.execute(query, params)
    except psycopg.Error as exc:
        if not conn.autocommit:
            conn.rollback()
        return exc.sqlstate
    return None


def _signed_activation(conn: psycopg.Connection, login: str) -> str:
    conn.execute("SELECT mailroom.create_account(%s, %s)", (f"{login}@example.test", login))
    return conn.execute("SELECT signed FROM mailroom.dequeue_tokens(10) WHERE login = %s", (login,)).fetchone()[0]


def test_app_role_calls_its_api_and_reads_no_table(conn, db_url):
    with psycopg.connect(as_login(db_url, "mr_app_nopin"), autocommit=True) as app:
        account = app.execute("SELECT mailroom.create_account('role@example.test', 'role')").fetchone()[0]
        assert account > 0
        assert sqlstate_of(app, "SELECT secret, code FROM mailroom.tokens") == "42501"
        assert sqlstate_of(app, "UPDATE mailroom.accounts SET status = 'active'") == "42501"
        assert sqlstate_of(app, "SELECT * FROM mailroom.dequeue_tokens(10)") == "42501"
        assert sqlstate_of(app, "SELECT key FROM mailroom.signing_keys") == "42501"
        assert sqlstate_of(app, "SELECT mailroom.export_signing_key()") == "42501"
        assert sqlstate_of(app, "SELECT mailroom.set_setting('tokens.ttl', '1 hour')") == "42501"
        assert sqlstate_of(app, "SELECT mailroom_internal._hmac('a', 'b', 'sha256')") == "42501"
    assert conn.execute("SELECT status::text FROM mailroom.accounts").fetchone()[0] == "provisioned"


@pytest.mark.parametrize(("login", "outcome"), [("mr_app_nopin", "MR113"), ("mr_app", None)])
def test_only_a_timekeeper_login_can_move_the_clock(conn, db_url, login, outcome):
    """An expired token stays expired for mailroom_app whatever it SETs; a timekeeper may pin."""
    signed = _signed_activation(conn, "clock")
    conn.execute("UPDATE mailroom.tokens SET expires_at = clock_timestamp() - interval '1 minute'")
    with psycopg.connect(as_login(db_url, login), autocommit=True) as app:
        app.execute("SET mailroom.clock = '2000-01-01 00:00:00Z'")
        assert sqlstate_of(app, "SELECT * FROM mailroom.consume_token(%s)", (signed,)) == outcome
    consumed = conn.execute("SELECT consumed_at IS NOT NULL FROM mailroom.tokens").fetchone()[0]
    assert consumed == (outcome is None)


def test_consume_waits_for_a_concurrent_suspend_and_then_refuses(conn, db_url):
    """Suspend first (not yet committed), consume second: the consume waits on the account row and
    then refuses (MR118); no used activation token is left on a suspended account."""
    signed = _signed_activation(conn, "race")
    account = conn.execute("SELECT id FROM mailroom.accounts").fetchone()[0]
    url = as_login(db_url, "mr_app_nopin")
    with psycopg.connect(url) as suspender, psycopg.connect(url, autocommit=True) as consumer:
        suspender.execute("SELECT mailroom.suspend_account(%s)", (account,))
        result: dict[str, str | None] = {}

        def consume() -> None:
            result["state"] = sqlstate_of(consumer, "SELECT * FROM mailroom.consume_token(%s)", (signed,))

        t = threading.Thread(target=consume)
        t.start()
        t.join(timeout=0.5)
        assert t.is_alive(), "the consume waits for the suspend's transaction"
        suspender.commit()
        t.join(timeout=10)
    assert result["state"] == "MR118"
    row = conn.execute("SELECT a.status::text, t.consumed_at FROM mailroom.accounts AS a "
                       "JOIN mailroom.tokens AS t ON t.account = a.id").fetchone()
    assert row == ("suspended", None)
