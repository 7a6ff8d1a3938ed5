"""The test pooler itself: it must really behave like a busy transaction pooler, or the pooled
tests prove nothing."""

from __future__ import annotations

import psycopg

from mailroom.db.connect import connection_kwargs


def test_consecutive_transactions_of_one_client_change_server_connection(pooler, db_url):
    pooler.fill(db_url)
    with psycopg.connect(pooler.pooled_url(db_url), **connection_kwargs()) as conn:
        pids = [conn.execute("SELECT pg_backend_pid()").fetchone()[0] for _ in range(6)]
        conn.execute("SELECT set_config('mailroom.probe', 'x', false)")
        kept = [conn.execute("SELECT current_setting('mailroom.probe', true)").fetchone()[0] for _ in range(3)]
        dbname = conn.info.dbname
    assert len(set(pids)) == pooler.pool_size, pids
    assert kept.count("x") < 3, "session state does not follow the client"
    pools = {row[0]: row for row in pooler.admin("SHOW POOLS")}
    assert pools[dbname][-1] == "transaction"
