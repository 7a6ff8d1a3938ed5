"""Issue 14: migration 0100 turns a database with rows into the time-partitioned layout, and
maintain_partitions runs one caller at a time, from the CLI and (where installed) from pg_cron."""

from __future__ import annotations

import io
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import psycopg
import pytest

from mailroom import testing
from mailroom.db import cluster as embedded
from mailroom.db import migrate

ROOT = Path(__file__).resolve().parents[2]
PARTITIONED = ("outbound_messages", "messages", "tokens")


@pytest.fixture
def empty_db(pg):
    name = f"p_{id(object()) & 0xFFFFFF:x}"
    url = testing.create_database(pg, name)
    yield url
    testing.drop_database(pg, name)


def _sql_of_that_release(root: Path) -> None:
    """sql/ as it was just before migration 0100 was added (its functions match the older tables:
    today's sql/ needs tables and columns of later migrations, such as the keyring of 0125)."""
    added = subprocess.run(["git", "-C", str(ROOT), "log", "--diff-filter=A", "--format=%H", "--",
                            "migrations/0100_partitions.sql"], capture_output=True, text=True)
    commit = added.stdout.split()[-1] if added.returncode == 0 and added.stdout.split() else None
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", f"{commit}^", "sql"], capture_output=True) if commit \
        else None
    if archive is None or archive.returncode != 0:
        pytest.skip("needs the git history of the checkout (the sql/ of the release before migration 0100)")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(root, filter="data")


def before_partitions(tmp_path: Path) -> Path:
    """The project as it was before issue 14: migrations up to 0099 and the sql/ of then, and the
    later migrations that only create a role."""
    root = tmp_path / "before"
    _sql_of_that_release(root)
    (root / "migrations").mkdir(parents=True)
    for path in (ROOT / "migrations").glob("*.sql"):
        if int(path.name[:4]) < 100 or path.name.endswith("_role.sql"):
            shutil.copy(path, root / "migrations" / path.name)
    return root


def fill(conn: psycopg.Connection) -> dict[str, list[int]]:
    """Rows in all three tables, through the API where the old layout allows it."""
    conn.execute("SET mailroom.clock = '2026-01-10 12:00Z'")
    for i in range(5):
        conn.execute("SELECT mailroom.create_account(%s, %s)", (f"user{i}@example.com", f"user{i}"))
    box = conn.execute("SELECT address, session_token FROM mailroom.create_mailbox(60, 'free')").fetchone()
    for i in range(4):
        conn.execute("SELECT mailroom.deliver_message(%s, %s, '', %s)", (box[0], b"raw", f"in-{i}"))
    conn.execute("SELECT mailroom.upsert_sender('tap', 'robot@mailroom.test', '127.0.0.1', 2525)")
    for i in range(3):
        conn.execute("SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], %s, 'body')", (f"out-{i}",))
    # a keyed message as the old enqueue wrote it (the old function needs the old unique index)
    conn.execute("""
        INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id,
            idempotency_key, created_at)
        SELECT id, ARRAY['a@example.com'], 'keyed', 'body', '<keyed@x>', 'order-1', '2026-01-09 08:00Z'
        FROM mailroom.senders WHERE name = 'tap'
    """)
    # an old sent row, days before the others
    conn.execute("""
        INSERT INTO mailroom.outbound_messages (sender_id, to_addrs, subject, text_body, message_id, status,
            sent_at, created_at)
        SELECT id, ARRAY['a@example.com'], 'old', 'body', '<old@x>', 'sent', '2025-12-01Z', '2025-12-01Z'
        FROM mailroom.senders WHERE name = 'tap'
    """)
    rows = {t: [r[0] for r in conn.execute(f"SELECT id FROM mailroom.{t} ORDER BY id")] for t in PARTITIONED}
    rows["box"] = list(box)
    return rows


def _kept_columns(conn: psycopg.Connection, table: str) -> str:
    """The table's columns of the older release (later migrations add some)."""
    names = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped"
        " ORDER BY attnum", (f"mailroom.{table}",))]
    return ", ".join(names)


def test_migration_keeps_every_row_and_the_api_works(empty_db, tmp_path):
    migrate.migrate(empty_db, root=before_partitions(tmp_path))
    testing.ensure_test_logins(empty_db)
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert conn.execute("SELECT relkind FROM pg_class WHERE oid = 'mailroom.outbound_messages'::regclass"
                            ).fetchone()[0] == "r"
        before = fill(conn)
        columns = {t: _kept_columns(conn, t) for t in PARTITIONED}
        whole = {t: conn.execute(f"SELECT md5(string_agg(row({columns[t]})::text, '|' ORDER BY id)) FROM mailroom.{t}"
                                 ).fetchone()[0] for t in PARTITIONED}

    # 0100 alone, with no sql/ pass: today's sql/ needs later migrations (the keyring of 0125, tokens
    # minted at dispatch in 0126); the rows are compared before anything else changes them
    result = migrate.migrate(empty_db, upto=100, apply_sql=False)
    assert "0100_partitions.sql" in result.applied

    with psycopg.connect(empty_db, autocommit=True) as conn:
        for table in PARTITIONED:
            assert conn.execute("SELECT relkind FROM pg_class WHERE oid = %s::regclass",
                                (f"mailroom.{table}",)).fetchone()[0] == "p", table
            ids = [r[0] for r in conn.execute(f"SELECT id FROM mailroom.{table} ORDER BY id")]
            assert ids == before[table], f"{table}: every row, same ids"
            digest = conn.execute(f"SELECT md5(string_agg(row({columns[table]})::text, '|' ORDER BY id))"
                                  f" FROM mailroom.{table}").fetchone()[0]
            assert digest == whole[table], f"{table}: every column of every row unchanged"
        # rows sit in the partition of their time; none in the DEFAULT partition
        assert conn.execute("SELECT tableoid::regclass::text FROM mailroom.outbound_messages WHERE subject = 'old'"
                            ).fetchone()[0] == "mailroom.outbound_messages_p20251201t0000"
        for table in PARTITIONED:
            assert conn.execute(f"SELECT count(*) FROM mailroom.{table}_default").fetchone()[0] == 0

    migrate.migrate(empty_db)  # every later migration applies over the partitioned data, then sql/
    with psycopg.connect(empty_db, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM mailroom.tokens WHERE secret IS NOT NULL OR code IS NOT NULL"
                            ).fetchone()[0] == 0, "no plaintext secret or code left (0126)"
        conn.execute("SET mailroom.clock = '2026-01-10 12:10Z'")  # tokens live 15 minutes
        # ids continue after the old ones (the identity sequence moved on, no id is reused)
        conn.execute("SELECT mailroom.create_account('new@example.com', 'newbie')")
        new_token = conn.execute("SELECT max(id) FROM mailroom.tokens").fetchone()[0]
        assert new_token > max(before["tokens"])
        new_out = conn.execute(
            "SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 'new', 'body', p_idempotency_key => 'order-2')"
        ).fetchone()[0]
        assert new_out > max(before["outbound_messages"])
        new_in = conn.execute("SELECT mailroom.deliver_message(%s, %s, '', 'new')", (before["box"][0], b"raw")
                              ).fetchone()[0]
        assert new_in > max(before["messages"])

        # the old row's idempotency key still answers with its message
        keyed = conn.execute("SELECT id FROM mailroom.outbound_messages WHERE subject = 'keyed'").fetchone()[0]
        assert conn.execute(
            "SELECT mailroom.enqueue_message('tap', ARRAY['a@example.com'], 'again', 'body', p_idempotency_key => 'order-1')"
        ).fetchone()[0] == keyed

        # claim / finalize
        claimed = conn.execute("SELECT id, claim_token FROM mailroom.claim_messages(100, 'w1')").fetchall()
        assert {r[0] for r in claimed} == set(before["outbound_messages"][:3]) | {keyed, new_out}
        done = conn.execute(
            "SELECT id, status::text FROM mailroom.finalize_messages(%s, %s, %s, %s, %s, %s)",
            ([r[0] for r in claimed], [r[1] for r in claimed], ["sent"] * len(claimed), [250] * len(claimed),
             ["2.0.0"] * len(claimed), [None] * len(claimed)),
        ).fetchall()
        assert {r[1] for r in done} == {"sent"} and len(done) == len(claimed)

        # list_messages, and consume a token issued before the migration
        listed = conn.execute("SELECT subject FROM mailroom.list_messages(%s, %s)", before["box"]).fetchall()
        assert [r[0] for r in listed] == ["in-0", "in-1", "in-2", "in-3", "new"]
        signed = conn.execute("SELECT signed FROM mailroom.dequeue_tokens(100) WHERE login = 'user0'").fetchone()[0]
        outcome = conn.execute("SELECT outcome FROM mailroom.consume_token(%s)", (signed,)).fetchone()[0]
        assert outcome == "consumed"
        assert conn.execute("SELECT status::text FROM mailroom.accounts WHERE login = 'user0'").fetchone()[0] == "active"


def test_a_second_concurrent_caller_is_skipped(db_url):
    with psycopg.connect(db_url) as first, psycopg.connect(db_url, autocommit=True) as second:
        first.execute("SELECT * FROM mailroom.maintain_partitions()").fetchall()  # transaction stays open
        rows = second.execute("SELECT action FROM mailroom.maintain_partitions()").fetchall()
        assert rows == [("skipped",)]
        first.commit()
        rows = second.execute("SELECT action FROM mailroom.maintain_partitions()").fetchall()
        assert ("skipped",) not in rows


def test_cli_maintain_reports_and_its_worker_runs_it(cli, cli_popen, db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET mailroom.clock = '2031-06-01 12:00Z'")
    proc = cli("maintain")
    assert proc.returncode == 0, proc.stderr
    assert "created" in proc.stdout and "outbound_messages_p20310601t0000" in proc.stdout
    proc = cli("maintain")
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" in proc.stdout
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET mailroom.clock = '2031-06-05 12:00Z'")
    worker = cli_popen("maintain", "--every", "1h")  # runs at its start, then hourly
    deadline = time.monotonic() + 30
    parts: list[str] = []
    while "messages_p20310611t0000" not in parts and time.monotonic() < deadline and worker.poll() is None:
        time.sleep(0.2)
        with psycopg.connect(db_url) as conn:
            parts = [r[0] for r in conn.execute("SELECT partition_name FROM mailroom_internal._partitions('messages')")]
    # four days later: the days up to 2031-06-12 exist only if the maintenance worker ran
    assert "messages_p20310611t0000" in parts, "mailroom maintain --every ran maintain_partitions"
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=10)
    assert worker.returncode == 0, stderr
    assert b"partitions: created" in stderr


CRON_CONTROL = Path("/usr/share/postgresql/15/extension/pg_cron.control")


@pytest.mark.skipif(not CRON_CONTROL.exists(), reason="pg_cron is not installed (Debian: postgresql-15-cron)")
def test_pg_cron_recipe_runs_maintenance(private_cluster):
    bindir, run_as = embedded.find_bindir(), embedded.RunAs.detect()
    url = testing.migrated_database(private_cluster, "cronned")
    # cron.* are unknown before pg_cron is loaded (ALTER SYSTEM refuses them): into postgresql.conf;
    # the cluster listens on its unix socket only, so pg_cron connects there
    with (private_cluster.pgdata / "postgresql.conf").open("a") as conf:
        conf.write(f"\nshared_preload_libraries = 'pg_cron'\ncron.database_name = 'cronned'\n"
                   f"cron.host = '{private_cluster.home}'\n")
    private_cluster.stop(bindir, run_as)
    private_cluster.start(bindir, run_as, fast=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pg_cron")
        # the recipe of docs/retention.md, every minute here instead of every 10
        job = conn.execute(
            "SELECT cron.schedule('mailroom-partitions', '* * * * *', 'SELECT mailroom.maintain_partitions()')"
        ).fetchone()[0]
        deadline = time.monotonic() + 150
        status = None
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT status, return_message FROM cron.job_run_details WHERE jobid = %s AND status IN "
                "('succeeded', 'failed') ORDER BY runid DESC LIMIT 1", (job,)
            ).fetchone()
            if row:
                status = row
                break
            time.sleep(1)
        assert status is not None, "pg_cron did not run the job within 150 s"
        assert status[0] == "succeeded", status[1]
