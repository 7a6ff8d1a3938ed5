"""`db migrate` through PgBouncer in transaction mode: one transaction, no session lock, so it works
there too (0.1.0's runner needed a direct connection for its session advisory lock)."""

from __future__ import annotations

import psycopg

from mailroom import testing
from mailroom.db import migrate


def test_a_fresh_install_and_a_rerun_through_the_pooler(pg, pooler):
    name = "migrate_pooled"
    testing.create_database(pg, name)
    try:
        pooled = pooler.pooled_url(pg.url(name))
        pooler.fill(pooled)  # consecutive transactions land on different server connections
        result = migrate.migrate(pooled)
        assert len(result.applied) == len(migrate.load_migrations())
        assert migrate.migrate(pooled).applied == []
        with psycopg.connect(pg.url(name), autocommit=True) as conn:
            assert conn.execute("SELECT mailroom.schema_version()").fetchone()[0] == max(
                m.version for m in migrate.load_migrations())
    finally:
        testing.drop_database(pg, name)
