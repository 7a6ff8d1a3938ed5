"""`mailroom run` and the logins of its workers (issue 23, item 3): it names the role a login lacks
before starting anything, and each worker may have a URL, and so a login, of its own."""

from __future__ import annotations

import os
import signal
import smtplib
import socket
import time

import psycopg
import pytest

from mailroom import testing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_as_a_login_without_the_worker_roles_says_which_role(cli, db_url):
    result = cli("run", "--database-url", testing.as_login(db_url, "mr_admin"), timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("mailroom: error: inbox needs a login granted mailroom_inbound, and mr_admin is "
                                    "not: GRANT mailroom_inbound TO mr_admin, or give --inbox-url a login that is")
    assert result.stderr.count("\n") == 1 and "migrated" not in result.stderr


def test_run_with_a_url_per_worker(cli_popen, conn, db_url):
    urls = {"inbox": "mr_inbound", "collect": "mr_collector", "send": "mr_sender", "expire": "mr_inbound",
            "maintain": "mr_inbound"}
    args = [a for worker, login in urls.items() for a in (f"--{worker}-url", testing.as_login(db_url, login))]
    proc = cli_popen("run", *args, "--inbox-port", str(free_port()),
                     env={"MAILROOM_DATABASE_URL": testing.as_login(db_url, "mr_app_nopin")})  # used by none of them
    try:
        seen = ""
        deadline = time.monotonic() + 60
        while "running: inbox" not in seen and time.monotonic() < deadline and proc.poll() is None:
            seen += proc.stderr.readline().decode()
        assert "running: inbox" in seen, seen
        logins = dict(conn.execute(
            "SELECT application_name, usename FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name IN ('mailroom-collect', 'mailroom-send-0', 'mailroom-inbox', 'mailroom-expire',"
            " 'mailroom-maintain')").fetchall())
        assert logins == {"mailroom-collect": "mr_collector", "mailroom-send-0": "mr_sender",
                          "mailroom-inbox": "mr_inbound", "mailroom-expire": "mr_inbound",
                          "mailroom-maintain": "mr_inbound"}, logins
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    rest = proc.stderr.read().decode()
    with psycopg.connect(db_url, autocommit=True) as c:
        states = {kind: state for kind, state in c.execute("SELECT kind, state FROM mailroom.worker_health()")}
    assert states == {"collector": "stopped", "sender": "stopped", "inbound": "stopped", "expiry": "stopped",
                      "maintenance": "stopped"}, (states, seen, rest)


def test_run_never_says_running_when_a_child_cannot_serve(cli, db_url):
    """The inbound server cannot bind its port: `run` says why and never that it is running (issue 23)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = cli("run", "--inbox-port", str(port), "--no-collect", "--no-send", "--no-expire", "--no-maintain",
                     timeout=60)
    assert result.returncode == 1, result.stderr
    assert "cannot listen on 127.0.0.1" in result.stderr
    assert "mailroom: error: inbox exited with code 1 before it was ready" in result.stderr
    assert "running:" not in result.stderr


def _read_until(proc, needle: str, timeout: float = 60) -> str:
    seen = ""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline and proc.poll() is None:
        seen += proc.stderr.readline().decode()
    assert needle in seen, seen
    return seen


def _stop(proc) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.stderr.read().decode()


def test_the_start_order_costs_no_backoff(cli_popen, conn):
    """Issue 34, item 6: the sender's relay is run's own inbox server (an activation mail to one of its
    inboxes, queued before run starts). The children after the inbox server start only once it listens,
    so the first mail goes out at its first attempt: no backoff paid for the start order."""
    port = free_port()
    domain = conn.execute("SELECT mailroom.setting('inbox.domain')").fetchone()[0]
    conn.execute("SELECT mailroom.upsert_sender('run', %s, '127.0.0.1', %s)", (f"noreply@{domain}", port))
    conn.execute("SELECT mailroom.set_setting('collector.sender', 'run')")
    box = conn.execute("SELECT address FROM mailroom.create_mailbox(NULL, 'free')").fetchone()[0]
    conn.execute("SELECT mailroom.create_account(%s, 'startorder')", (box,))
    proc = cli_popen("run", "--inbox-port", str(port), "--no-maintain")
    try:
        seen = _read_until(proc, "running: inbox")
        lines = seen.splitlines()
        listening = next(i for i, line in enumerate(lines) if "[inbox]" in line and "listening on" in line)
        started = {name: next(i for i, line in enumerate(lines) if f"started {name} (pid" in line)
                   for name in ("inbox", "collect", "send", "expire")}
        assert started["inbox"] < listening < min(started["collect"], started["send"], started["expire"]), seen
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            row = conn.execute("SELECT status, attempts FROM mailroom.outbound_messages").fetchone()
            if row and row[0] != "queued" and row[0] != "processing":
                break
            time.sleep(0.2)
        assert row == ("sent", 1), row
        stored = conn.execute("SELECT count(*) FROM mailroom.messages AS m JOIN mailroom.mailboxes AS b"
                              " ON b.id = m.mailbox_id WHERE b.address = %s", (box,)).fetchone()[0]
        assert stored == 1
    finally:
        _stop(proc)


@pytest.mark.parametrize("workers", [1, 2])
def test_run_with_the_http_face(cli_popen, cli, conn, workers):
    """--http-port: `http serve` runs with the others, reports its heartbeat (mailroom status lists it)
    and stops with them; its inboxes expire by run's expire worker (mailroom_http has no expiry rights).
    With several server processes (MAILROOM_HTTP_WORKERS) each reports in, and run still hears it is ready."""
    import json
    import urllib.request

    http_port = free_port()
    proc = cli_popen("run", "--inbox-port", str(free_port()), "--http-port", str(http_port), "--no-maintain",
                     env={"MAILROOM_HTTP_WORKERS": str(workers)})
    try:
        seen = _read_until(proc, "running: inbox")
        assert f"http (127.0.0.1:{http_port})" in seen, seen
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/openapi.json", timeout=10) as reply:
            assert reply.status == 200 and json.load(reply)["info"]["title"]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            rows = conn.execute("SELECT state, serves FROM mailroom.worker_health() WHERE kind = 'http'").fetchall()
            if len(rows) >= workers:
                break
            time.sleep(0.2)
        assert rows == [("running", f"http 127.0.0.1:{http_port}")] * workers, rows
        status = cli("status")
        assert status.returncode == 0, status.stderr
        assert any(line.split()[:1] == ["http"] and f"http 127.0.0.1:{http_port}" in line
                   for line in status.stdout.splitlines()), status.stdout
        assert not conn.execute(
            "SELECT has_function_privilege('mailroom_http', 'mailroom.expire_mailboxes(integer)', 'EXECUTE')"
        ).fetchone()[0]
    finally:
        _stop(proc)
    assert {s for (s,) in conn.execute("SELECT state FROM mailroom.worker_health() WHERE kind = 'http'")} == {"stopped"}


def test_run_refuses_a_secret_key_that_does_not_sign(cli):
    """MAILROOM_SECRET_KEY reaches collect and send through run: run checks it first (one line, exit 2)."""
    result = cli("run", "--inbox-port", str(free_port()), env={"MAILROOM_SECRET_KEY": "0badf00d" * 8}, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mailroom: error: run: MAILROOM_SECRET_KEY (fingerprint "), lines
    assert "mailroom keys import --active" in lines[0]


def test_an_activation_mail_arrives_quickly_under_runs_defaults(cli_popen, conn):
    """Issue 44, item 7: run's own collector flushes 100 ms after a quiet period's first notification
    (`mailroom collect` alone keeps the seed's 5 s), so an account's activation mail is stored in its
    mailroom inbox well under a second after the commit. The bound here is generous (2.5 s, for a loaded
    machine); `make bench` measures p50 and p99. With the old default every mail took over 5 s."""
    port = free_port()
    domain = conn.execute("SELECT mailroom.setting('inbox.domain')").fetchone()[0]
    conn.execute("SELECT mailroom.upsert_sender('run', %s, '127.0.0.1', %s)", (f"noreply@{domain}", port))
    conn.execute("SELECT mailroom.set_setting('collector.sender', 'run')")
    proc = cli_popen("run", "--inbox-port", str(port), "--no-maintain")
    try:
        _read_until(proc, "running: inbox")
        took = []
        for i in range(4):
            box = conn.execute("SELECT address FROM mailroom.create_mailbox(NULL, 'free')").fetchone()[0]
            started = time.monotonic()
            conn.execute("SELECT mailroom.create_account(%s, %s)", (box, f"quick{i}"))
            deadline = started + 30
            while time.monotonic() < deadline:
                stored = conn.execute("SELECT count(*) FROM mailroom.messages AS m JOIN mailroom.mailboxes AS b"
                                      " ON b.id = m.mailbox_id WHERE b.address = %s", (box,)).fetchone()[0]
                if stored:
                    break
                time.sleep(0.02)
            took.append(time.monotonic() - started)
            time.sleep(0.5)  # a quiet period between accounts: each mail starts a batch of its own
        assert max(took) < 2.5, took
    finally:
        _stop(proc)


def test_run_passes_the_checks_to_the_http_face():
    """Issue 44, item 5: `mailroom run` turns on the link and spam checks of its HTTP face (before, only
    `http serve` had the flags, and run's users had to find the environment variables)."""
    from mailroom.ops.run import RunPlan, children_of

    plan = RunPlan({"http": ""}, http_port=8025, http_args=("--link-check", "--spamd", "127.0.0.1:783"))
    (http,) = children_of(plan)
    assert http.args[-3:] == ["--link-check", "--spamd", "127.0.0.1:783"]
    assert children_of(RunPlan({"http": ""}, http_port=8025))[0].args[-2:] == ["--port", "8025"]


def test_run_refuses_the_checks_without_the_http_face(cli):
    result = cli("run", "--inbox-port", str(free_port()), "--link-check", timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("mailroom: error: --link-check goes with --http-port "
                                     "(the checks are the HTTP face's)")


def _children_named(parent: int) -> dict[int, str]:
    """{pid: comm} of the live children of `parent`."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
                comm = open(f"/proc/{entry}/comm").read().strip()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == parent and fields[0] != "Z":
                found[int(entry)] = comm
    return found


def test_runs_forked_inbox_server_parses_a_large_message_in_workers_it_starts_then(cli_popen, conn):
    """Issue 46, item 5: run's workers are forked copies of run (named `mr <command>`), and the inbox
    server starts its parsing processes at the first message over the inline limit, not before: idle it
    has none; a 100 KiB message is then stored parsed (its subject read by a parsing process)."""
    port = free_port()
    proc = cli_popen("run", "--inbox-port", str(port), "--no-maintain", "--no-collect", "--no-send")
    try:
        _read_until(proc, "running: inbox")
        workers = {comm: pid for pid, comm in _children_named(proc.pid).items()}
        assert set(workers) == {"mr inbox serve", "mr expire"}, workers
        inbox = workers["mr inbox serve"]
        assert _children_named(inbox) == {}
        box = conn.execute("SELECT address FROM mailroom.create_mailbox(NULL, 'free')").fetchone()[0]
        body = ("line of a large message\r\n" * 4096).encode()  # 100 KiB: past parsing.INLINE_BYTES
        with smtplib.SMTP("127.0.0.1", port, timeout=30) as smtp:
            smtp.sendmail("a@x.test", [box], b"From: a@x.test\r\nSubject: large one\r\n\r\n" + body)
        deadline = time.monotonic() + 30
        subject = None
        while subject is None and time.monotonic() < deadline:
            row = conn.execute("SELECT m.subject FROM mailroom.messages AS m JOIN mailroom.mailboxes AS b"
                               " ON b.id = m.mailbox_id WHERE b.address = %s", (box,)).fetchone()
            subject = row[0] if row else None
            time.sleep(0.1)
        assert subject == "large one"
        assert len(_children_named(inbox)) >= 2  # the parsing processes (and multiprocessing's tracker)
    finally:
        _stop(proc)


def test_a_secret_in_runs_environment_reaches_only_the_workers_that_read_it(cli_popen):
    """The attacker review (issue 45, item 5): run's forked workers kept run's whole environment, so the
    HTTP and SMTP faces held MAILROOM_SECRET_KEY and the relay's password. With a secret in run's
    environment every worker is a new interpreter (a fork keeps its parent's memory, the environment block
    included), and each worker's environment goes without the secrets it does not read."""
    import re

    secret = "hunter2-" + "x" * 24
    proc = cli_popen("run", "--inbox-port", str(free_port()), "--http-port", str(free_port()), "--no-maintain",
                     env={"MAILROOM_SMTP_PASSWORD": secret})
    try:
        seen = _read_until(proc, "running: inbox")
        pids = {name: int(pid) for name, pid in re.findall(r"started (\w+) \(pid (\d+)\)", seen)}
        assert {"inbox", "http", "collect", "send", "expire"} <= set(pids), seen
        for name, pid in pids.items():
            environ = open(f"/proc/{pid}/environ", "rb").read()
            assert secret.encode() not in environ, name
            assert b"-m\0mailroom\0" in open(f"/proc/{pid}/cmdline", "rb").read(), name  # a new interpreter
    finally:
        _stop(proc)


def test_run_with_several_sender_processes(cli_popen, conn):
    """MAILROOM_SEND_WORKERS=2 (`send --workers 2`): run's sender forks two, each reports in under its
    own name, run still hears it is ready, and both stop with it."""
    proc = cli_popen("run", "--inbox-port", str(free_port()), "--no-maintain", "--no-collect",
                     env={"MAILROOM_SEND_WORKERS": "2"})
    try:
        _read_until(proc, "running: inbox")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            rows = conn.execute("SELECT worker, state FROM mailroom.worker_health() WHERE kind = 'sender'").fetchall()
            if len(rows) >= 2:
                break
            time.sleep(0.2)
        assert len(rows) == 2 and {s for _, s in rows} == {"running"}, rows
    finally:
        err = _stop(proc)
    assert "stopped (2 sender processes)" in err, err
    assert {s for (s,) in conn.execute("SELECT state FROM mailroom.worker_health() WHERE kind = 'sender'")} == {"stopped"}
