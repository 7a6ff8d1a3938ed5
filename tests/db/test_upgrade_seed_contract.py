"""An upgrade brings the seed's contracts of issue 33 (docs/upgrading.md, "0.2.0: the seed's NOTIFY
contract and retry count"): outbound.max_attempts still at the old default 10 becomes 11 (the first
attempt and up to 10 retries), an operator's other value stays; token_insert notifies a plain LISTEN."""

from __future__ import annotations

import psycopg
from test_upgrade import install_previous_release

from mailroom import testing
from mailroom.db import migrate

MIGRATION = testing.checkout_root() / "migrations" / "0191_outbound_max_attempts_eleven.sql"


def test_the_retry_default_moves_only_where_it_was_the_old_default(conn):
    assert conn.execute("SELECT mailroom.setting('outbound.max_attempts')").fetchone()[0] == "11"  # fresh
    for before, after in (("10", "11"), ("12", "12"), ("3", "3")):
        conn.execute("UPDATE mailroom.settings SET value = %s WHERE name = 'outbound.max_attempts'", (before,))
        conn.execute(MIGRATION.read_text())
        assert conn.execute("SELECT mailroom.setting('outbound.max_attempts')").fetchone()[0] == after, before


def test_an_upgrade_from_the_previous_release(pg):
    name = "upgrade_seed_contract"
    url = install_previous_release(pg, name)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT mailroom.setting('outbound.max_attempts')").fetchone()[0] == "10"
        migrate.migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("SELECT mailroom.setting('outbound.max_attempts')").fetchone()[0] == "11"
            conn.execute("SELECT mailroom.set_setting('notify.always', 'false')")  # what upgrading.md step 5 says
        with psycopg.connect(url, autocommit=True) as lis, psycopg.connect(url, autocommit=True) as app:
            lis.execute("LISTEN token_insert")
            app.execute("SELECT mailroom.create_account('upgraded@example.com', 'upgraded')")
            assert [(n.channel, n.payload) for n in lis.notifies(timeout=5, stop_after=1)] == [("token_insert", "1")]
    finally:
        testing.drop_database(pg, name)
