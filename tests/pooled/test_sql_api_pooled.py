"""The SQL API from psql through PgBouncer (transaction mode): what an application does."""

from __future__ import annotations

import shutil
import subprocess

from mailroom.db import cluster as embedded


def psql(url: str, script: str) -> subprocess.CompletedProcess:
    exe = shutil.which("psql") or str(embedded.find_bindir() / "psql")
    return subprocess.run([exe, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url],
                          input=script, capture_output=True, text=True, timeout=60)


def test_sql_api_from_psql_through_the_pooler(conn, urls):
    url = urls("app").database
    calls = "\n".join(
        f"SELECT mailroom.create_account('psql{i}@example.test', 'psql{i}') IS NOT NULL;" for i in range(8)
    )
    out = psql(url, calls)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["t"] * 8
    # the collector's call, the inbox API, the outbound queue and the clock, each several times
    script = "\n".join([
        *["SELECT count(*) FROM mailroom.dequeue_tokens(2);" for _ in range(5)],
        *["SELECT address LIKE '%@%' FROM mailroom.create_mailbox(30, 'pro');" for _ in range(6)],
        "SELECT mailroom.upsert_sender('psql', 'noreply@example.test', '127.0.0.1', 2525) > 0;",
        *[f"SELECT mailroom.enqueue_message('psql', ARRAY['r{i}@example.test'], 's{i}', 'b{i}') > 0;" for i in range(6)],
        *["SELECT queued FROM mailroom.outbound_stats;" for _ in range(6)],
        # a transaction carries SET LOCAL through the pooler (PGOPTIONS does not: use pin_clock)
        "BEGIN;",
        "SELECT mailroom.pin_clock('2099-01-01 00:00+00') IS NOT NULL;",
        "SELECT mailroom.clock() = '2099-01-01 00:00+00';",
        "SELECT mailroom.expire_mailboxes();",
        "COMMIT;",
        "SELECT mailroom.clock() < '2099-01-01 00:00+00';",
    ])
    out = psql(url, script)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        "2", "2", "2", "2", "0", *["t"] * 6, "t", *["t"] * 6, *["6"] * 6, "t", "t", "6", "t",
    ], out.stdout
    assert conn.execute("SELECT count(*) FROM mailroom.mailboxes WHERE NOT is_active").fetchone()[0] == 6


def test_pgoptions_through_the_pooler_is_refused_not_ignored(urls):
    """A worker pinned with PGOPTIONS='-c mailroom.clock=…' gets a clear refusal from PgBouncer,
    not a silently unpinned clock (the test pooler ignores no `options`)."""
    out = subprocess.run(
        [shutil.which("psql") or str(embedded.find_bindir() / "psql"), "-X", "-d", urls("app").database, "-c", "SELECT 1"],
        env={"PGOPTIONS": "-c mailroom.clock=2099-01-01T00:00:00Z", "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode != 0
    assert "unsupported startup parameter" in out.stderr

