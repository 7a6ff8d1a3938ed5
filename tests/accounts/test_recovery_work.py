"""A recovery request does the same work for an existing account and an unknown address (issue 21, item 7).

Not timed: counted. pg_stat_statements (preloaded by the test cluster, mailroom.db.cluster) with
track = all records every statement the request runs, nested ones included; the request for an
active account and the one for an unknown address must run the same statements, as many times,
touching the same number of shared buffers (hits + reads), call for call. The application's own
login (mr_app) makes the calls.
"""

from __future__ import annotations

import psycopg
import pytest

from mailroom import testing

KNOWN = "exists@example.test"
UNKNOWN = "absent@example.test"  # the same length: the same row size


@pytest.fixture
def counted_app(conn, db_url):
    """An autocommit connection as mr_app whose statements pg_stat_statements tracks, nested ones too."""
    available = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements'").fetchone()
    loaded = conn.execute("SHOW shared_preload_libraries").fetchone()[0]
    if not available or "pg_stat_statements" not in loaded:
        pytest.fail("the test cluster preloads pg_stat_statements (mailroom.db.cluster, fast=True)")
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    conn.execute(f"ALTER ROLE mr_app IN DATABASE {conn.info.dbname} SET pg_stat_statements.track = 'all'")
    try:
        with psycopg.connect(testing.as_login(db_url, "mr_app"), autocommit=True) as app:
            yield app
    finally:
        conn.execute(f"ALTER ROLE mr_app IN DATABASE {conn.info.dbname} RESET pg_stat_statements.track")


def _work(conn: psycopg.Connection, app: psycopg.Connection, email: str) -> list[tuple]:
    """The statements one request ran, its own and those of the functions it called (as their owner):
    (query, calls, rows, shared buffers hit + read), sorted."""
    conn.execute("SELECT pg_stat_statements_reset()")
    app.execute("SELECT mailroom.request_password_recovery(%s)", (email,))
    return conn.execute(
        "SELECT query, calls, rows, shared_blks_hit + shared_blks_read FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND userid IN ('mr_app'::regrole, 'mailroom_owner'::regrole) ORDER BY query"
    ).fetchall()


def test_a_request_does_the_same_work_whether_or_not_the_account_exists(conn, counted_app):
    conn.execute("SELECT mailroom.create_account(%s, 'exists')", (KNOWN,))
    conn.execute("UPDATE mailroom.accounts SET status = 'active'")
    # two requests first: the first plans and fills the caches, the second settles the pages the
    # inserts go to (the second insert of a session touches 6 buffers, the next ones 4)
    for warmup in ("warm1@example.test", "warm2@example.test"):
        counted_app.execute("SELECT mailroom.request_password_recovery(%s)", (warmup,))
    rounds = [(_work(conn, counted_app, KNOWN), _work(conn, counted_app, UNKNOWN)) for _ in range(2)]
    for known, unknown in rounds:
        assert known, "pg_stat_statements saw the calls"
        assert any("recovery_requests" in row[0] for row in known), known
        assert known == unknown, (
            "an existing account and an unknown address ran different statements or touched different"
            f" numbers of buffers:\nexisting: {known}\nunknown:  {unknown}"
        )
    # and the request was real: the collector's step issues the existing account's token only
    dequeue = "SELECT login FROM mailroom.dequeue_tokens(10) WHERE action = 'password_recovery'"
    conn.execute(dequeue)  # issues the requested tokens
    assert conn.execute(dequeue).fetchall() == [("exists",)]
