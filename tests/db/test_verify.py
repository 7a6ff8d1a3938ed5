"""Issue 47: `mailroom db verify` runs the shipped pgTAP suite on a live installation and changes nothing.

The whole suite on a used database runs in `python -m mailroom.testing used` (make test's second pgTAP
pass); these tests check the runner's guarantees on a few files, as a DBA would see them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from mailroom import testing
from mailroom.db import verify

ROOT = Path(__file__).resolve().parents[2]
CHANNELS = ("mailroom_inbox", "mailroom_outbound", "mailroom_expiry_schedule", "token_insert")


def _unsafe(text: str) -> str | None:
    return verify.VerifyFile("x.sql", verify.split_statements(text)).unsafe()


def test_the_checker_refuses_a_file_that_leaves_its_transaction_or_reaches_outside_it() -> None:
    ok = "BEGIN;\nSELECT plan(1);\nSELECT ok(true, $$COMMIT; VACUUM$$); -- COMMIT\nSELECT * FROM finish();\nROLLBACK;\n"
    assert _unsafe(ok) is None
    for body, why in (
        ("COMMIT;", "COMMIT"), ("END;", "END"), ("VACUUM mailroom.accounts;", "VACUUM"),
        ("SELECT dblink_exec('c', 'BEGIN');", "dblink"), ("SELECT * FROM dblink('c', 'x') AS t (a int);", "dblink"),
        ("PREPARE TRANSACTION 'x';", "PREPARE"), ("ROLLBACK;\nBEGIN;", "ROLLBACK"),
        ("DELETE FROM mailroom.outbound_messages;", "every row"), ("ALTER SYSTEM SET work_mem = '1MB';", "ALTER"),
        ("DROP INDEX mailroom.tokens_pending_idx;", "schema"), ("ANALYZE mailroom.tokens;", "schema"),
        ("CREATE INDEX x ON mailroom.tokens (id);", "schema"),
    ):
        reason = _unsafe(f"BEGIN;\nSELECT plan(1);\n{body}\nSELECT * FROM finish();\nROLLBACK;\n")
        assert reason is not None and why.lower() in reason.lower(), (body, reason)
    assert "ROLLBACK" in (_unsafe("BEGIN;\nSELECT 1;\nCOMMIT;\n") or "")
    assert "BEGIN" in (_unsafe("SELECT 1;\nROLLBACK;\n") or "")


def test_every_shipped_file_stays_in_its_transaction_or_is_marked_not_on_a_live_database_yet() -> None:
    files = [verify.VerifyFile.load(f) for f in verify.suite_files()]
    refused = {vf.name: why for vf in files if (why := vf.unsafe()) is not None and vf.not_live_yet() is None}
    assert refused == {}, refused
    # the suite ships: every file of tests/pgtap is a resource of mailroom.db.pgtap, its fixtures too
    assert {f.name for f in verify.suite_files()} == {p.name for p in (ROOT / "tests" / "pgtap").glob("*.sql")}
    assert verify.suite().joinpath("fixtures", "default_settings.sql").is_file()


def test_the_splitter_keeps_what_psql_keeps() -> None:
    text = ("SELECT 'a;b', $x$ c; d $x$, E'it\\'s;'; -- x;\n/* y; /* z; */ */ SELECT (1;\n"
            "SELECT 1 AS one \\gset\nSELECT :'one', :one::int, '::one';\n")
    assert verify.split_statements(text) == [
        "SELECT 'a;b', $x$ c; d $x$, E'it\\'s;';", "-- x;\n/* y; /* z; */ */ SELECT (1;\nSELECT 1 AS one",
        "\\gset", "SELECT :'one', :one::int, '::one';"]
    assert verify.substitute("SELECT :'one', :one::int, '::one', :\"one\"", {"one": "1"}) == \
        "SELECT '1', 1::int, '::one', \"1\""


def test_the_default_settings_fixture_is_what_a_fresh_migrate_seeds(conn) -> None:
    fresh = dict(conn.execute("SELECT name, value FROM mailroom.settings").fetchall())
    text = verify.suite().joinpath("fixtures", "default_settings.sql").read_text()
    import re

    pinned = dict(re.findall(r"^\s*\('([^']*)', '((?:[^']|'')*)'\)", text, re.M))
    pinned = {k: v.replace("''", "'") for k, v in pinned.items()}
    assert pinned == fresh, (
        "tests/pgtap/fixtures/default_settings.sql differs from a fresh migrate's settings (a setting added or its "
        "default changed): its VALUES are `SELECT format('(%L, %L)', name, value) FROM mailroom.settings ORDER BY name` "
        f"of a fresh database; missing {sorted(fresh.keys() - pinned.keys())}, "
        f"differing {sorted(k for k in fresh.keys() & pinned.keys() if fresh[k] != pinned[k])}")


@pytest.fixture(scope="module")
def used_url(pg) -> str:
    """A database the demo and the data generator used (mailroom.testing.used_database), pgtap installed."""
    return testing.used_database(pg, f"used_{os.getpid()}")


def _verify(url: str, *files: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "MAILROOM_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "mailroom", "db", "verify", *files], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_verify_on_a_used_database_passes_changes_no_row_and_delivers_no_notify(used_url) -> None:
    files = ("01_settings", "08_notify", "20_mailboxes", "22_reading", "32_outbound_enqueue", "35_outbound_admin")
    with psycopg.connect(used_url, autocommit=True) as conn:
        before = verify.checksums(conn)
    heard: list[str] = []
    with psycopg.connect(used_url, autocommit=True) as listener:
        for channel in CHANNELS:
            listener.execute(f"LISTEN {channel}")
        stop = threading.Event()

        def listen() -> None:
            while not stop.is_set():
                heard.extend(n.channel for n in listener.notifies(timeout=0.2, stop_after=1))

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        proc = _verify(used_url, *files)
        time.sleep(1.0)  # a NOTIFY of a committed transaction arrives at once; give a wrong one time to
        stop.set()
        thread.join(timeout=5)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert f"Files={len(files)}, Tests=" in proc.stdout and proc.stdout.rstrip().endswith("Result: PASS")
    assert heard == [], f"a rolled-back transaction's NOTIFY was delivered: {heard}"
    with psycopg.connect(used_url, autocommit=True) as conn:
        assert verify.checksums(conn) == before


def test_a_row_a_live_worker_holds_fails_the_test_within_the_lock_timeout(used_url) -> None:
    with psycopg.connect(used_url) as holder:  # a transaction holding the row 01_settings writes
        holder.execute("SELECT 1 FROM mailroom.settings WHERE name = 'outbound.lease' FOR UPDATE")
        started = time.monotonic()
        proc = _verify(used_url, "01_settings")
        elapsed = time.monotonic() - started
        holder.rollback()
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "lock timeout" in proc.stdout and "Result: FAIL" in proc.stdout
    assert elapsed < 30, f"verify waited {elapsed:.1f}s behind a held row (lock_timeout {verify.LOCK_TIMEOUT})"


def test_a_file_that_holds_a_lock_live_writes_wait_for_fails(used_url) -> None:
    """A function a file calls may do DDL no statement of the file shows (maintain_partitions with the
    clock months ahead creates partitions: a live sender's claim waited 1.3 s behind 09_rates until its
    ROLLBACK, issue 46's CI). The runner fails such a file before its ROLLBACK, naming the lock."""
    text = ("BEGIN;\nSELECT plan(1);\nSET LOCAL mailroom.clock = '2031-06-01 00:00:00+00';\n"
            "CREATE TEMP TABLE report AS SELECT * FROM mailroom.maintain_partitions();\n"
            "SELECT pass('maintenance ran');\nSELECT * FROM finish();\nROLLBACK;\n")
    vf = verify.VerifyFile("ddl_inside.sql", verify.split_statements(text))
    assert vf.unsafe() is None  # nothing in its text gives it away
    with psycopg.connect(used_url, autocommit=True) as conn:
        who = verify.inspect(conn)
    lines: list[str] = []
    result = verify.run_file(used_url, vf, who, lines.append)
    assert not result.ok and result.error is not None, lines
    assert "AccessExclusiveLock on mailroom." in result.error and "until its ROLLBACK" in result.error, result.error
    with psycopg.connect(used_url, autocommit=True) as conn:  # rolled back: no partition of 2031 was kept
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE '%%2031%%'").fetchone()[0] == 0
    # and a file that only writes its own rows passes the same check
    plain = verify.VerifyFile("rows.sql", verify.split_statements(
        "BEGIN;\nSELECT plan(1);\nSELECT mailroom.set_setting('outbound.lease', '7 min');\n"
        "SELECT pass('a row');\nSELECT * FROM finish();\nROLLBACK;\n"))
    assert verify.run_file(used_url, plain, who, lines.append).ok, lines


def test_verify_says_what_it_needs(db_url) -> None:
    proc = _verify(db_url, "01_settings")  # a migrated database without the pgtap extension
    assert proc.returncode == 2 and "CREATE EXTENSION pgtap" in proc.stderr and "Traceback" not in proc.stderr
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION pgtap")
    proc = _verify(db_url, "no_such_file")
    assert proc.returncode == 2 and "no such file in the suite" in proc.stderr
    # a login that is no superuser and no member of the runtime roles: the files that SET ROLE are
    # skipped with the reason, not failed
    proc = _verify(testing.as_login(db_url, "mr_monitor"), "24_inbox_privileges")
    assert proc.returncode == 0, proc.stdout
    assert "skipped: needs membership of mailroom_app" in proc.stdout


def test_a_sender_draining_the_queue_never_waits_longer_than_the_lock_timeout(used_url, pg) -> None:
    """The whole suite while `mailroom send` drains 300 messages: no backend of the sender waits on a
    lock for longer than LOCK_TIMEOUT (sampled every 50 ms from pg_stat_activity)."""
    from aiosmtpd.controller import Controller

    class Accept:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd API)
            return "250 OK"

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    relay = Controller(Accept(), hostname="127.0.0.1", port=port)
    relay.start()
    sender: subprocess.Popen | None = None
    try:
        with psycopg.connect(used_url, autocommit=True) as conn:
            conn.execute("SELECT mailroom.upsert_sender(p_name => 'drain', p_from_address => 'drain@used.example',"
                         " p_host => '127.0.0.1', p_port => %s)", (port,))
            conn.execute("SELECT mailroom.enqueue_message(p_sender => 'drain', p_to => ARRAY['d' || g || '@drain.example'],"
                         " p_subject => 'drain ' || g, p_text_body => 'x') FROM generate_series(1, 300) AS g")
        env = testing.driver_env({**os.environ, "MAILROOM_DATABASE_URL": used_url}, ("send",))
        sender = subprocess.Popen([sys.executable, "-m", "mailroom", "send"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        waits: dict[tuple[int, str], tuple[float, float]] = {}
        done = threading.Event()

        def sample() -> None:
            with psycopg.connect(used_url, autocommit=True) as probe:
                while not done.is_set():
                    now = time.monotonic()
                    for pid, started in probe.execute(
                            "SELECT pid, state_change::text FROM pg_stat_activity"
                            " WHERE usename = 'mr_sender' AND wait_event_type = 'Lock'"):
                        first, _ = waits.get((pid, started), (now, now))
                        waits[(pid, started)] = (first, now)
                    time.sleep(0.05)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        proc = _verify(used_url)
        done.set()
        thread.join(timeout=5)
        assert proc.returncode == 0, proc.stdout[-3000:]
        longest = max((last - first for first, last in waits.values()), default=0.0)
        limit = float(verify.LOCK_TIMEOUT.removesuffix("s"))
        assert longest < limit, f"the sender waited {longest:.2f}s on a lock the suite held (limit {verify.LOCK_TIMEOUT})"
        with psycopg.connect(used_url, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                sent = conn.execute("SELECT count(*) FROM mailroom.outbound_messages AS m JOIN mailroom.senders AS s"
                                    " ON s.id = m.sender_id WHERE s.name = 'drain' AND m.status = 'sent'").fetchone()[0]
                if sent == 300:
                    break
                time.sleep(0.2)
            assert sent == 300, "the sender drained the queue meanwhile"
    finally:
        if sender is not None:
            sender.terminate()
            sender.wait(timeout=30)
        relay.stop()
