"""`mailroom doctor` against a good deployment and misconfigured ones: a transaction pooler
without a direct listen URL, pending migrations, a missing role, a server log that would write
bind parameters (checked against the real log of a private cluster)."""

from __future__ import annotations

import time

import psycopg
import pytest

from mailroom import testing
from mailroom.db.migrate import migrate

TOKEN = "SECRET-TOKEN-FOR-THE-LOG-CHECK"


def checks(result) -> dict[str, tuple[str, str]]:
    """name -> (status, text) of every check line."""
    found = {}
    for line in result.stdout.splitlines():
        status, rest = line.split(None, 1)
        name, text = rest.split(": ", 1)
        found[name] = (status, text)
    return found


def test_good_setup_direct(cli):
    result = cli("doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    found = checks(result)
    assert found["listen"] == ("OK", "LISTEN/NOTIFY round-trips on the listen URL")
    assert found["pooler"] == ("OK", "direct connection")
    assert found["migrations"][0] == "OK" and "the one expected by mailroom" in found["migrations"][1]
    assert found["roles"][0] == "OK" and found["server log"][0] == "OK"
    assert "FAIL" not in result.stdout


@pytest.mark.parametrize("login", ["mr_collector", "mr_sender", "mr_inbound", "mr_app", "mr_monitor", "mr_admin"])
def test_runtime_logins_see_the_schema_version_without_a_warning(cli, db_url, login):
    """Issue 23: on a correct install the doctor warned that a worker login may not read
    schema_migrations. It now asks mailroom.list_migrations(), which every runtime role may call."""
    from mailroom import testing as harness
    from mailroom.db.files import schema_version

    result = cli("doctor", env={"MAILROOM_DATABASE_URL": harness.as_login(db_url, login),
                                "MAILROOM_LISTEN_URL": harness.as_login(db_url, login)})
    status, text = checks(result)["migrations"]
    assert status == "OK", text
    assert text.startswith(f"schema {schema_version()} ("), text


def test_through_the_pooler_without_a_direct_listen_url(cli, pooled_db_url):
    result = cli("doctor", env={"MAILROOM_DATABASE_URL": pooled_db_url})
    assert result.returncode == 1, result.stdout + result.stderr
    found = checks(result)
    assert found["pooler"][0] == "OK" and found["pooler"][1].startswith("transaction pooling detected")
    assert found["listen"][0] == "FAIL" and "MAILROOM_LISTEN_URL" in found["listen"][1]
    assert [name for name, (status, _) in found.items() if status == "FAIL"] == ["listen"]


def test_through_the_pooler_with_a_direct_listen_url(cli, pooled_db_url, db_url):
    result = cli("doctor", env={"MAILROOM_DATABASE_URL": pooled_db_url, "MAILROOM_LISTEN_URL": db_url})
    assert result.returncode == 0, result.stdout + result.stderr
    found = checks(result)
    assert found["pooler"][1].startswith("transaction pooling detected")
    assert found["listen"][0] == "OK"


@pytest.fixture
def default_pgbouncer(pg):
    """A PgBouncer with its default server choice (the last used first), as most deployments run it."""
    bouncer = testing.PgBouncer(pg, rotate=False).start()
    yield bouncer
    bouncer.stop()


def test_pooler_detected_behind_a_default_pgbouncer(cli, default_pgbouncer, db_url):
    """A lone client keeps one backend there: only a second connection sees the pooling."""
    result = cli("doctor", env={"MAILROOM_DATABASE_URL": default_pgbouncer.pooled_url(db_url),
                                "MAILROOM_LISTEN_URL": db_url})
    assert result.returncode == 0, result.stdout + result.stderr
    assert checks(result)["pooler"][1].startswith("transaction pooling detected"), result.stdout


def test_pending_migrations(cli, pg):
    name = f"doctor_pending_{time.monotonic_ns()}"
    url = testing.create_database(pg, name)
    try:
        migrate(url, upto=50, apply_sql=False)
        result = cli("doctor", env={"MAILROOM_DATABASE_URL": url})
        assert result.returncode == 1
        status, text = checks(result)["migrations"]
        assert status == "FAIL" and "pending" in text and "0070_queue_health.sql" in text, text
    finally:
        testing.drop_database(pg, name)


def _log_since(cluster, start: int) -> str:
    time.sleep(0.3)  # postgres writes the file directly (no logging collector)
    with cluster.logfile.open("rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace")


def _call_with_a_token(url: str) -> None:
    """A call whose bind parameter is a token, and one that fails with it."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT mailroom.setting(%s) IS NULL", ("tokens.ttl",))
        conn.execute("SELECT %s::text", (TOKEN,))
        with pytest.raises(psycopg.Error):
            conn.execute("SELECT mailroom.consume_token(%s)", (TOKEN,))


def test_server_log_and_roles_on_a_private_cluster(private_cluster):
    """The server-log check against what the server really writes, and a missing role."""
    import subprocess
    import sys

    url = private_cluster.url()
    migrate(url)

    def doctor() -> dict[str, tuple[str, str]]:
        env = {"MAILROOM_DATABASE_URL": url, "PATH": "/usr/bin:/bin"}
        out = subprocess.run([sys.executable, "-m", "mailroom", "doctor"], env=env, capture_output=True, text=True,
                             timeout=60)
        return checks(out) | {"exit": (str(out.returncode), out.stderr)}

    with psycopg.connect(private_cluster.url("postgres"), autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET log_min_duration_statement = 0")
        admin.execute("SELECT pg_reload_conf()")
        # the migrating role could not set it (migration 0080 only said so): parameters reach the log
        admin.execute("ALTER DATABASE mailroom RESET log_parameter_max_length")
    found = doctor()
    # a WARN: no key or password travels now, but the links and codes callers send are bearer credentials
    assert found["server log"][0] == "WARN" and "statements are logged with their bind parameters" in found["server log"][1]
    assert "bearer credentials" in found["server log"][1]
    assert found["exit"][0] == "0", "a warning, not a failure"
    start = private_cluster.logfile.stat().st_size
    _call_with_a_token(url)
    assert TOKEN in _log_since(private_cluster, start), "the check is right: the log holds the parameter"

    with psycopg.connect(private_cluster.url("postgres"), autocommit=True) as admin:
        admin.execute("ALTER DATABASE mailroom SET log_parameter_max_length = 0")
        admin.execute("ALTER DATABASE mailroom SET log_parameter_max_length_on_error = -1")
    found = doctor()
    assert found["server log"][0] == "WARN" and "failing statements" in found["server log"][1]
    start = private_cluster.logfile.stat().st_size
    _call_with_a_token(url)
    assert TOKEN in _log_since(private_cluster, start), "an error's context carries the parameter"

    with psycopg.connect(private_cluster.url("postgres"), autocommit=True) as admin:
        admin.execute("ALTER DATABASE mailroom SET log_parameter_max_length_on_error = 0")
    found = doctor()
    assert found["server log"] == ("OK", "statements are logged without bind parameters")
    start = private_cluster.logfile.stat().st_size
    _call_with_a_token(url)
    log = _log_since(private_cluster, start)
    assert "mailroom.consume_token" in log and TOKEN not in log, "logged, without the parameter"
    assert found["roles"][0] == "OK" and found["exit"][0] == "0", found

    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("DROP OWNED BY mailroom_timekeeper")
        admin.execute("DROP ROLE mailroom_timekeeper")
    found = doctor()
    assert found["roles"] == ("FAIL", "missing: mailroom_timekeeper")
    assert found["exit"][0] == "1"


class _DnsStub:
    """A UDP DNS server on 127.0.0.1 answering TXT queries from a dict (dnspython builds the wire)."""

    def __init__(self, records: dict[str, str]):
        import socket
        import threading

        self.records = records
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import dns.message
        import dns.rcode
        import dns.rrset

        while True:
            try:
                data, peer = self.sock.recvfrom(4096)
            except OSError:
                return
            query = dns.message.from_wire(data)
            reply = dns.message.make_response(query)
            name = query.question[0].name.to_text().rstrip(".")
            value = self.records.get(name)
            if value is None:
                reply.set_rcode(dns.rcode.NXDOMAIN)
            else:
                chunks = " ".join(f'"{value[i:i + 255]}"' for i in range(0, len(value), 255))
                reply.answer.append(dns.rrset.from_text(name + ".", 60, "IN", "TXT", chunks))
            self.sock.sendto(reply.to_wire(), peer)

    def close(self) -> None:
        self.sock.close()


def test_dkim_record_checked_against_dns(cli, conn, tmp_path):
    conn.execute("SELECT mailroom.upsert_sender('news', 'news@mailroom.test', '127.0.0.1', 2525)")
    made = cli("outbound", "dkim", "keygen", "news", "--selector", "s1", "--key-file", str(tmp_path / "k.pem"))
    assert made.returncode == 0, made.stderr
    name, value = conn.execute("SELECT dns_name, dns_value FROM mailroom.list_dkim_keys()").fetchone()
    other = value[:-8] + ("A" * 8 if not value.endswith("A" * 8) else "B" * 8)
    # DNS unreachable: said so, nothing checked (a port nobody answers on)
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        silent = s.getsockname()[1]
        result = cli("doctor", env={"MAILROOM_DOCTOR_NAMESERVER": f"127.0.0.1:{silent}"})
    status, text = checks(result)["dkim mailroom.test"]
    assert status == "WARN" and "DNS not reachable" in text, text
    for records, expected in (({name: value}, "OK"), ({name: other}, "FAIL"), ({}, "WARN")):
        stub = _DnsStub(records)
        try:
            result = cli("doctor", env={"MAILROOM_DOCTOR_NAMESERVER": f"127.0.0.1:{stub.port}"})
        finally:
            stub.close()
        status, text = checks(result)["dkim mailroom.test"]
        assert status == expected, (records, text)


def test_warns_when_nothing_expires_inboxes(cli, conn):
    """Issue 33, item 6: the HTTP face and the SMTP server create inboxes but never expire them. With no
    expiry worker reporting in and no pg_cron job, the doctor warns (and counts the inboxes overdue);
    an expiry worker's heartbeat, or a pg_cron job running expiry, makes it OK."""
    box = conn.execute("SELECT mailbox_id FROM mailroom.create_mailbox(NULL, 'free')").fetchone()[0]
    conn.execute("UPDATE mailroom.mailboxes SET expires_at = now() - interval '10 minutes' WHERE id = %s", (box,))
    result = cli("doctor")
    status, text = checks(result)["expiry"]
    assert status == "WARN", text
    assert text.startswith("no process has expired inboxes recently") and "pg_cron is not installed" in text
    assert "1 inbox(es) past their expiry" in text and "mailroom expire" in text
    assert result.returncode == 0  # a WARN, not a FAIL

    # pg_cron's catalog with a job that runs expiry (the table as pg_cron has it; the extension needs
    # shared_preload_libraries, which the test cluster does not load)
    conn.execute("CREATE SCHEMA cron")
    conn.execute("CREATE TABLE cron.job (jobid bigint, jobname text, command text, active boolean)")
    conn.execute("INSERT INTO cron.job VALUES (1, 'mailroom-analyze', 'ANALYZE', true)")
    status, text = checks(cli("doctor"))["expiry"]
    assert status == "WARN" and "pg_cron schedules no expiry job" in text, text
    conn.execute("INSERT INTO cron.job VALUES (2, 'mailroom-expiry', 'CALL mailroom.run_expiry()', true)")
    assert checks(cli("doctor"))["expiry"] == ("OK", "pg_cron runs inbox expiry (job mailroom-expiry)")
    conn.execute("DROP SCHEMA cron CASCADE")

    conn.execute("SELECT mailroom.worker_heartbeat('doctor-test:1', 'expiry', true)")
    assert checks(cli("doctor"))["expiry"] == ("OK", "1 expiry worker(s) running")


def test_the_expiry_check_as_a_login_that_cannot_see_workers(cli, db_url):
    result = cli("doctor", env={"MAILROOM_DATABASE_URL": testing.as_login(db_url, "mr_app")})
    status, text = checks(result)["expiry"]
    assert status == "WARN" and "mailroom_monitor" in text, text
