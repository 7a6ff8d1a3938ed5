"""`mailroom collect` as a real subprocess against a real PostgreSQL: batching, handoff, safety."""

from __future__ import annotations

import json
import signal
import time

import psycopg
import pytest
from collector_support import (
    Collector,
    assert_exactly_once,
    bulk_accounts_sql,
    create_accounts,
    parse_csv_line,
    verify_signed,
    wait_committed,
)


@pytest.fixture
def collectors(db_url):
    started: list[Collector] = []

    def start(*args: str, env: dict[str, str] | None = None, **kw) -> Collector:
        c = Collector(db_url, *args, env=env, **kw)
        started.append(c)
        return c

    yield start
    for c in started:
        c.kill()


def running(collectors, *args: str, **env: str) -> Collector:
    c = collectors(*args, env={k.upper(): v for k, v in env.items()})
    c.wait_stderr("waiting for notifications")  # connected, LISTENing, backlog drained
    return c


# -- batching ---------------------------------------------------------------------------------


def test_batch_by_limit(collectors, conn):
    c = running(collectors, mailroom_batch_limit="3", mailroom_batch_timeout="60s",
                mailroom_healthcheck_interval="60s")
    logins = create_accounts(conn, "lim", 3)
    line = c.read_line(timeout=10)  # long before the 60 s timeout
    records = parse_csv_line(line)
    assert_exactly_once(records, logins)
    assert all(r.action == "1" for r in records)
    c.wait_stderr("processing 3 rows (limit)")
    assert "woke up" in c.stderr_text()
    assert c.stop() == 0


def test_batch_by_timeout(collectors, conn):
    c = running(collectors, mailroom_batch_limit="10", mailroom_batch_timeout="800ms")
    t0 = time.monotonic()
    logins = create_accounts(conn, "tmo", 2)
    c.assert_quiet(0.4)  # fewer than the limit: nothing before the timeout
    records = parse_csv_line(c.read_line(timeout=10))
    assert time.monotonic() - t0 >= 0.7
    assert_exactly_once(records, logins)
    c.wait_stderr("processing 2 rows (timeout)")


def test_backlog_drained_at_start(collectors, conn):
    logins = create_accounts(conn, "old", 25)
    c = collectors(env={"MAILROOM_BATCH_LIMIT": "10", "MAILROOM_BATCH_TIMEOUT": "60s",
                        "MAILROOM_HEALTHCHECK_INTERVAL": "60s"})
    lines = [c.read_line(timeout=10) for _ in range(3)]
    assert [len(parse_csv_line(x)) for x in lines] == [10, 10, 5]
    assert_exactly_once([r for x in lines for r in parse_csv_line(x)], logins)
    c.assert_quiet(0.3)
    c.wait_stderr("backlog: collected 25 tokens in 3 batches")


def test_csv_is_byte_compatible_with_the_article(collectors, conn):
    """One line per batch: action,email,login,signed,code records joined by commas, then \\n."""
    c = running(collectors, mailroom_batch_limit="2", mailroom_batch_timeout="60s",
                mailroom_healthcheck_interval="60s")
    conn.execute("SELECT mailroom.create_account('ann@example.test', 'ann')")
    conn.execute("SELECT mailroom.create_account('bob@example.test', 'bob')")
    line = c.read_line()
    assert line.endswith("\n") and line.count("\n") == 1
    fields = line[:-1].split(",")
    assert len(fields) == 10
    assert fields[0:3] == ["1", "ann@example.test", "ann"] and fields[5:8] == ["1", "bob@example.test", "bob"]
    for signed, code in ((fields[3], fields[4]), (fields[8], fields[9])):
        assert len(signed) == 86 and set(signed) <= set(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        assert len(code) == 5 and code.isdigit()


def test_bulk_insert_10000_in_one_transaction(collectors, conn):
    c = running(collectors, mailroom_batch_limit="1000", mailroom_batch_timeout="200ms")
    with conn.transaction():
        conn.execute(bulk_accounts_sql("bulk", 10_000))
    records = c.records(10_000, timeout=60)
    assert_exactly_once(records, [f"bulk{i}" for i in range(10_000)])
    c.assert_quiet(0.5)


def test_out_of_order_commits(collectors, conn, db_url):
    c = running(collectors, mailroom_batch_limit="10", mailroom_batch_timeout="100ms")
    with psycopg.connect(db_url) as early, psycopg.connect(db_url) as late:
        early.execute("SELECT mailroom.create_account('early@example.test', 'early')")  # lower id, open
        late.execute("SELECT mailroom.create_account('late@example.test', 'late')")
        late.commit()
        first = c.records(1)
        assert [r.login for r in first] == ["late"]
        early.commit()
        second = c.records(1)
    assert_exactly_once(first + second, ["late", "early"])


def test_password_recovery_is_action_2_signed_with_its_code(collectors, conn):
    c = running(collectors, mailroom_batch_limit="1", mailroom_batch_timeout="100ms")
    conn.execute("SELECT mailroom.create_account('rec@example.test', 'rec')")
    (activation,) = c.records(1)
    wait_committed(conn, ["rec"], "activation")  # the line is written before its batch commits
    account = conn.execute("SELECT account FROM mailroom.consume_token(%s)", (activation.signed,)).fetchone()[0]
    assert conn.execute("SELECT status::text FROM mailroom.accounts WHERE id = %s", (account,)).fetchone()[0] == "active"
    conn.execute("SELECT mailroom.request_password_recovery('rec@example.test')")
    (recovery,) = c.records(1)
    wait_committed(conn, ["rec"], "password_recovery")
    assert recovery.action == "2" and recovery.login == "rec"
    verify_signed(recovery)  # HMAC over /recover ‖ secret ‖ code
    assert conn.execute("SELECT account FROM mailroom.consume_token(%s, %s)",
                        (recovery.signed, recovery.code)).fetchone()[0] == account


def test_jsonl_output(collectors, conn):
    c = running(collectors, "--output", "jsonl", mailroom_batch_limit="2", mailroom_batch_timeout="60s",
                mailroom_healthcheck_interval="60s")
    create_accounts(conn, "js", 2)
    docs = [json.loads(c.read_line()) for _ in range(2)]
    assert [d["login"] for d in docs] == ["js0", "js1"]
    assert docs[0]["token_id"] < docs[1]["token_id"]
    for d in docs:
        assert d["action"] == "activation" and d["email"] == f"{d['login']}@example.test"
        verify_signed(parse_csv_line(f"1,{d['email']},{d['login']},{d['signed']},{d['code']}")[0])


# -- several collectors -------------------------------------------------------------------------


def test_two_collectors_split_the_work(collectors, conn):
    a = running(collectors, mailroom_batch_limit="5", mailroom_batch_timeout="50ms")
    b = running(collectors, mailroom_batch_limit="5", mailroom_batch_timeout="50ms")
    logins: list[str] = []
    for i in range(40):
        conn.execute(bulk_accounts_sql(f"two{i}_", 5))
        logins += [f"two{i}_{j}" for j in range(5)]
    deadline = time.monotonic() + 20
    got: dict[str, list] = {"a": [], "b": []}
    while len(got["a"]) + len(got["b"]) < len(logins) and time.monotonic() < deadline:
        for name, c in (("a", a), ("b", b)):
            while not c.lines.empty():
                got[name] += parse_csv_line(c.lines.get())
        time.sleep(0.05)
    a.assert_quiet(0.3)
    b.assert_quiet(0.01)
    assert_exactly_once(got["a"] + got["b"], logins)
    assert got["a"] and got["b"], "both collectors took a share"


# -- signals, bad input, closed stdout -----------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_0_promptly(collectors, sig):
    c = running(collectors, mailroom_batch_timeout="60s", mailroom_healthcheck_interval="600s")
    t0 = time.monotonic()
    assert c.stop(sig) == 0
    assert time.monotonic() - t0 < 1.5
    assert "stopped" in c.stderr_text()


BAD = [
    ({"MAILROOM_BATCH_LIMIT": "0"}, "'MAILROOM_BATCH_LIMIT'): Input should be greater than or equal to 1"),
    ({"MAILROOM_BATCH_LIMIT": "ten"}, "'MAILROOM_BATCH_LIMIT'): Input should be a valid integer"),
    ({"MAILROOM_BATCH_TIMEOUT": "-5"}, "'-5' is not a duration like 500ms, 5s, 10m, 2h or 7d"),
    ({"MAILROOM_BATCH_TIMEOUT": "5s", "MAILROOM_HEALTHCHECK_INTERVAL": "1s"},
     "MAILROOM_HEALTHCHECK_INTERVAL (1s) must be at least MAILROOM_BATCH_TIMEOUT (5s)"),
    # a number without a unit is milliseconds, as the original C collector read these variables
    ({"MAILROOM_BATCH_TIMEOUT": "5000", "MAILROOM_HEALTHCHECK_INTERVAL": "1000"},
     "MAILROOM_HEALTHCHECK_INTERVAL (1s) must be at least MAILROOM_BATCH_TIMEOUT (5s)"),
    ({"MAILROOM_CHANNEL_NAME": " "}, "MAILROOM_CHANNEL_NAME is empty"),
    ({"MAILROOM_CHANNEL_NAME": "c" * 64}, "MAILROOM_CHANNEL_NAME must be printable and at most 63 bytes"),
]


@pytest.mark.parametrize(("env", "message"), BAD)
def test_bad_configuration_is_one_line_exit_2(cli, env, message):
    proc = cli("collect", env=env, timeout=30)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mailroom: error: "), proc.stderr
    assert message in lines[0]
    assert proc.stdout == ""


def test_collect_needs_no_key_and_refuses_one_that_does_not_sign(collectors, conn):
    """The keyring signs in the database: the collector runs with no key. A MAILROOM_SECRET_KEY that is
    not the keyring's active key is never silently ignored: the collector refuses to start (issue 33,
    item 2; tests/accounts/test_secret_key.py has the rest)."""
    c = running(collectors, mailroom_batch_limit="1", mailroom_batch_timeout="50")
    conn.execute("SELECT mailroom.create_account('nokey@example.test', 'nokey')")
    (record,) = c.records(1)
    verify_signed(record)  # the keyring's key
    refused = collectors(env={"MAILROOM_SECRET_KEY": "0badf00d" * 8})
    assert refused.proc.wait(timeout=30) == 2
    refused.wait_stderr("mailroom keys import --active")
    assert "0badf00d" not in refused.stderr_text()


def test_bad_output_format_exit_2(cli):
    proc = cli("collect", "--output", "xml", timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "mailroom: error: --output must be one of csv, jsonl, got 'xml'"


def test_unreachable_database_waits_with_one_line_and_stops_cleanly(cli_popen, tmp_path):
    """Started while the database is out of reach, the collector says so once and waits (issue 23)."""
    proc = cli_popen("collect", env={"MAILROOM_DATABASE_URL": f"host={tmp_path} port=1 dbname=nope"})
    time.sleep(4)  # several retries
    assert proc.poll() is None, proc.stderr.read().decode()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0
    err = proc.stderr.read().decode()
    assert err.count("database unreachable") == 1, err
    assert "waiting and retrying" in err and "Traceback" not in err, err


def test_closed_stdout_rolls_back_and_exits_nonzero(collectors, conn, db_url):
    c = collectors(env={"MAILROOM_BATCH_TIMEOUT": "50ms"}, pump_stdout=False)
    c.wait_stderr("waiting for notifications")
    assert c.proc.stdout is not None
    c.proc.stdout.close()  # the downstream reader dies
    logins = create_accounts(conn, "pipe", 4)
    rc = c.proc.wait(timeout=10)
    assert rc == 1
    last = c.stderr_text().strip().splitlines()[-1]
    assert last.startswith("mailroom: error: stdout closed")
    assert "stay eligible" in last and "Traceback" not in c.stderr_text()
    # nothing was marked dispatched: a fresh collector gets every token
    again = collectors()
    assert_exactly_once(again.records(4), logins)


def test_healthcheck_runs_when_idle(collectors, conn):
    c = running(collectors, mailroom_batch_timeout="100ms", mailroom_healthcheck_interval="200ms")
    time.sleep(0.8)
    queries = [q for (q,) in conn.execute(
        "SELECT query FROM pg_stat_activity WHERE application_name = 'mailroom-collect'")]
    assert "SELECT 1" in queries, queries  # else the LISTEN connection's last query is the settings check
    assert c.proc.poll() is None


def test_channel_mismatch_is_warned_and_backlog_still_drained(collectors, conn):
    logins = create_accounts(conn, "chan", 2)
    c = collectors(env={"MAILROOM_CHANNEL_NAME": "elsewhere"})
    c.wait_stderr("setting tokens.channel is 'token_insert'")
    assert_exactly_once(c.records(2), logins)


# -- reconnect ---------------------------------------------------------------------------------


def test_terminate_backend_reconnects_nothing_lost(collectors, conn):
    c = running(collectors, mailroom_batch_limit="5", mailroom_batch_timeout="100ms")
    logins = create_accounts(conn, "pre", 5)
    records = c.records(5)
    wait_committed(conn, logins)  # a kill between a batch's write and its COMMIT rewrites it with new links
    killed = conn.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'mailroom-collect'"
    ).fetchone()[0]
    assert killed == 2
    logins += create_accounts(conn, "post", 7)  # while it notices and reconnects
    c.wait_stderr("reconnecting")
    c.wait_stderr("waiting for notifications", count=2)
    logins += create_accounts(conn, "after", 3)
    records += c.records(15 - len(records), timeout=15)
    c.assert_quiet(0.5)
    assert_exactly_once(records, logins)


# -- --enqueue --------------------------------------------------------------------------------


def test_enqueue_turns_tokens_into_outbound_messages(collectors, conn):
    conn.execute("SELECT mailroom.upsert_sender('mailroom', 'noreply@example.test', '127.0.0.1', 2525)")
    conn.execute("SELECT mailroom.set_setting('collector.link_base_url', 'https://app.example.test/')")
    c = running(collectors, "--enqueue", mailroom_batch_limit="2", mailroom_batch_timeout="100ms")
    logins = create_accounts(conn, "enq", 3)
    deadline = time.monotonic() + 10
    rows: list = []
    while len(rows) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        rows = conn.execute(
            "SELECT to_addrs, subject, text_body, html_body, idempotency_key, status::text"
            " FROM mailroom.outbound_messages ORDER BY id").fetchall()
    assert len(rows) == 3, c.stderr_text()
    c.assert_quiet(0.3)  # nothing on stdout in enqueue mode
    # queued without a body: the link is minted when the sender claims the email (issue 21.3)
    assert [(text, html) for _to, _s, text, html, _i, _st in rows] == [(None, None)] * 3
    claimed = conn.execute("SELECT text_body, html_body FROM mailroom.claim_messages(10, 'test') ORDER BY id").fetchall()
    records = []
    for (to, subject, _text, _html, idem, status), (text, html), login in zip(rows, claimed, logins, strict=True):
        assert to == [f"{login}@example.test"] and subject == "Activate your account" and status == "queued"
        assert text.startswith(f"Hello {login},") and idem.startswith("token:")
        signed = text.split("https://app.example.test/activate?token=", 1)[1].split("\n", 1)[0]
        assert f'href="https://app.example.test/activate?token={signed}"' in html
        records += parse_csv_line(f"1,{to[0]},{login},{signed},00000")
    assert_exactly_once(records, logins)
    # the tokens were dispatched in the same transaction: a stdout collector finds nothing left
    assert conn.execute("SELECT count(*) FROM mailroom.dequeue_tokens(100)").fetchone()[0] == 0


def test_enqueue_failure_rolls_back_the_dequeue(collectors, conn):
    """Unknown sender: the batch fails in SQL, the collector exits 1 and the tokens stay eligible."""
    logins = create_accounts(conn, "nos", 2)
    c = collectors("--enqueue")
    assert c.proc.wait(timeout=10) == 1
    last = c.stderr_text().strip().splitlines()[-1]
    assert last.startswith("mailroom: error: collector stopped: unknown sender 'mailroom' (SQLSTATE MR301)"), last
    assert conn.execute("SELECT count(*) FROM mailroom.outbound_messages").fetchone()[0] == 0
    again = collectors()
    assert_exactly_once(again.records(2), logins)


def test_commit_lost_after_write_is_written_again_with_working_links(collectors, conn):
    """The connection dies between the write and the COMMIT: the dispatch and the digests of the
    links just written roll back, so those links never work; the batch comes back with new links and
    is written again. Each token ends with exactly one working link."""
    c = collectors(env={"MAILROOM_BATCH_LIMIT": "1000", "MAILROOM_BATCH_TIMEOUT": "50ms"}, pump_stdout=False)
    c.wait_stderr("waiting for notifications")
    conn.execute(bulk_accounts_sql("win", 1000))  # one ~130 kB line: the write blocks on the full pipe
    deadline = time.monotonic() + 10
    # idle in transaction for a while: the batch is written and the write blocks on the full pipe (a
    # moment between two statements of the batch's transaction is idle in transaction too)
    while not conn.execute("SELECT 1 FROM pg_stat_activity WHERE application_name = 'mailroom-collect'"
                           " AND state = 'idle in transaction'"
                           " AND state_change < clock_timestamp() - interval '300 milliseconds'").fetchone():
        assert time.monotonic() < deadline, c.stderr_text()
        time.sleep(0.05)
    conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'mailroom-collect'")
    c.start_pump()  # the write completes, the COMMIT fails
    c.wait_stderr("connection lost while committing a written batch of 1000 tokens")
    c.wait_stderr("1000 tokens written before a lost commit came back: written again with new links")
    dead, live = c.records(1000), c.records(1000)
    assert_exactly_once(dead, [f"win{i}" for i in range(1000)])
    assert_exactly_once(live, [f"win{i}" for i in range(1000)])
    wait_committed(conn, [r.login for r in live[:20]])  # the lines come before their batch's COMMIT
    for first, second in zip(dead[:20], live[:20], strict=True):
        assert first.login == second.login and first.signed != second.signed
        assert _sqlstate(conn, first.signed) == "MR112", "the line written before the lost commit never works"
        assert _sqlstate(conn, second.signed) is None, "the one written again does"
    logins = create_accounts(conn, "next", 2)
    assert_exactly_once(c.records(2), logins)
    c.assert_quiet(0.3)


def _sqlstate(conn, signed: str) -> str | None:
    try:
        conn.execute("SELECT * FROM mailroom.consume_token(%s)", (signed,))
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


def test_comma_in_login_keeps_the_csv_framing(collectors, conn):
    c = running(collectors, mailroom_batch_limit="2", mailroom_batch_timeout="50ms")
    conn.execute("SELECT mailroom.create_account('x@example.test', 'doe, john')")
    conn.execute("SELECT mailroom.create_account('y@example.test', 'plain')")
    records = c.records(2)
    assert [r.login for r in records] == ["doe%2C john", "plain"]
    for r in records:
        verify_signed(r)


def test_sigterm_mid_drain_finishes_the_batch_and_loses_nothing(collectors, conn):
    conn.execute(bulk_accounts_sql("mid", 3000))
    c = collectors(env={"MAILROOM_BATCH_LIMIT": "10"})
    first = c.read_line()
    c.proc.send_signal(signal.SIGTERM)
    assert c.proc.wait(timeout=5) == 0
    time.sleep(0.2)  # let the reader thread take the last lines
    lines = [first]
    while not c.lines.empty():
        lines.append(c.lines.get())
    emitted = [r for line in lines for r in parse_csv_line(line)]
    assert all(len(parse_csv_line(line)) == 10 for line in lines), "only whole batches were written"
    assert len(emitted) < 3000, "it stopped before the end of the backlog"
    left = {login for (login,) in conn.execute("SELECT login FROM mailroom.dequeue_tokens(5000)")}
    assert_exactly_once(emitted, [f"mid{i}" for i in range(3000) if f"mid{i}" not in left])
    assert len(emitted) + len(left) == 3000


def test_startup_drains_the_backlog_once(collectors):
    # the listener's first connect asks for a drain; one that began after it was up covers it
    # (a second drain made tokens created just after start-up look collected by the backlog)
    c = running(collectors, mailroom_healthcheck_interval="60s")
    time.sleep(1.0)
    assert c.stderr_text().count("waiting for notifications") == 1, c.stderr_text()


def test_idle_sweep_collects_tokens_nobody_announced(collectors, conn):
    # listening on a channel nobody notifies: only the periodic sweep can find new tokens
    c = running(collectors, mailroom_channel_name="elsewhere", mailroom_batch_timeout="100ms",
                mailroom_healthcheck_interval="300ms")
    logins = create_accounts(conn, "sweep", 3)
    assert_exactly_once(c.records(3, timeout=5), logins)
    c.wait_stderr("sweep: collected")  # not a NOTIFY-driven batch
