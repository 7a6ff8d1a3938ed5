"""Keys never travel (issue 20, item 5): the server log of a full run holds no key and no relay
password, and no link or code the collector produced that nobody consumed.

A private cluster logs every statement with its bind parameters, server-wide
(log_statement = all, log_min_duration_statement = 0, log_parameter_max_length = -1), and mailroom is
installed as the README says, by a non-superuser owner, so migration 0080 cannot turn parameter
logging off for the database. Then the real processes and calls run: the admin makes the sender key
and a relay with a password, the collector hands out links (stdout) and enqueues emails, the sender
claims and delivers them through an authenticated relay, the application consumes some links and a
recovery code, the admin rotates the signing key; the admin registers a webhook endpoint, whose
whsec_ secret the sender opens to sign a message.received for a real receiver. What a caller sends by
design (the link it consumes, its code: bearer credentials, docs/security.md) is in the log; nothing
else secret is.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
from aiosmtpd.smtp import AuthResult
from outbound_support import Handler, SmtpServer
from psycopg.types.json import Jsonb
from standardwebhooks import Webhook

from mailroom.db.migrate import migrate

PASSWORD = "correct-horse-battery-staple-41"
ROOT = Path(__file__).resolve().parents[2]


def _cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "mailroom", *args], env=env, capture_output=True, text=True,
                            timeout=timeout, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result


def _collect_jsonl(env: dict[str, str], n: int) -> list[dict]:
    proc = subprocess.Popen([sys.executable, "-m", "mailroom", "collect", "--output", "jsonl"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        lines = [proc.stdout.readline() for _ in range(n)]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return [json.loads(line) for line in lines]


def test_a_full_run_leaves_no_key_password_or_unconsumed_link_in_the_server_log(private_cluster, tmp_path):
    home, port = str(private_cluster.home), str(private_cluster.port)

    def url(user: str, dbname: str = "mail") -> str:
        return f"host={home} port={port} dbname={dbname} user={user}"

    with psycopg.connect(private_cluster.url(), autocommit=True) as dba:
        for name, value in (("log_statement", "all"), ("log_min_duration_statement", "0"),
                            ("log_parameter_max_length", "-1"), ("log_parameter_max_length_on_error", "-1")):
            dba.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        dba.execute("SELECT pg_reload_conf()")
        # README, "Install on an existing server": a non-superuser owner with CREATEROLE
        dba.execute("CREATE ROLE mail_owner LOGIN CREATEROLE")
        dba.execute("CREATE DATABASE mail OWNER mail_owner")
    migrate(url("mail_owner"))
    with psycopg.connect(url("mail_owner"), autocommit=True) as owner:
        assert owner.execute("SHOW log_parameter_max_length").fetchone()[0] == "-1", "0080 could not turn it off"
        for login, group in (("myapp", "mailroom_app"), ("collector", "mailroom_collector"),
                             ("sender", "mailroom_sender"), ("ops", "mailroom_admin"), ("inbound", "mailroom_inbound")):
            owner.execute(f"CREATE ROLE {login} LOGIN")
            owner.execute(f"GRANT {group} TO {login}")
    start = private_cluster.logfile.stat().st_size

    base = {k: v for k, v in os.environ.items() if not k.startswith(("MAILROOM_", "PG"))}
    ops = {**base, "MAILROOM_DATABASE_URL": url("ops")}
    collector = {**base, "MAILROOM_DATABASE_URL": url("collector"), "MAILROOM_BATCH_TIMEOUT": "50ms"}

    # the admin: a sender key, and a relay whose password is sealed before it leaves the CLI
    logins: list[tuple[bytes, bytes]] = []

    def authenticator(server, session, envelope, mechanism, auth_data):
        logins.append((auth_data.login, auth_data.password))
        return AuthResult(success=auth_data.password == PASSWORD.encode(), handled=False)

    relay = SmtpServer(Handler(), authenticator=authenticator, auth_require_tls=False).start()
    hooks: list[tuple[dict, bytes]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            hooks.append((dict(self.headers.items()), self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        key_file = tmp_path / "sender.key"
        _cli(ops, "outbound", "sender-key", "init", "--out", str(key_file), "--bits", "2048")
        _cli({**ops, "MAILROOM_SMTP_PASSWORD": PASSWORD}, "outbound", "sender", "relay", "--from",
             "noreply@example.test", "--host", "127.0.0.1", "--port", str(relay.port), "--username", "mailer",
             "--allow-cleartext-login")
        with psycopg.connect(url("ops"), autocommit=True) as admin:
            admin.execute("SELECT mailroom.set_setting('collector.sender', 'relay')")
            key_id = admin.execute("SELECT mailroom.create_api_key('hooked', %s)",
                                   (hashlib.sha256(b"mrk_hooked").digest(),)).fetchone()[0]
        # the admin: a webhook endpoint, its secret a result printed once
        added = _cli(ops, "webhook", "add", f"http://127.0.0.1:{receiver.server_address[1]}/in", "--event",
                     "message.received", "--key-id", str(key_id))
        whsec = added.stdout.split("secret: ")[1].split()[0]

        with psycopg.connect(url("myapp"), autocommit=True) as app:
            for n in range(1, 5):
                app.execute("SELECT mailroom.create_account(%s, %s)", (f"u{n}@example.test", f"u{n}"))
            # the collector (stdout): links as results
            links = {t["login"]: t["signed"] for t in _collect_jsonl(collector, 4)}
            for login in ("u1", "u3"):  # the application consumes two of them
                app.execute("SELECT * FROM mailroom.consume_token(%s)", (links[login],))
            for login in ("u1", "u3"):
                app.execute("SELECT mailroom.request_password_recovery(%s)", (f"{login}@example.test",))
            recovery = {t["login"]: t for t in _collect_jsonl(collector, 2)}
            used = recovery["u1"]
            app.execute("SELECT * FROM mailroom.consume_token(%s, %s)", (used["signed"], used["code"]))

            # a message for the key owner's inbox: its message.received goes out with the mail below
            inbox = app.execute("SELECT address FROM mailroom.create_mailbox(30, 'free', 'api', 'hooked')").fetchone()[0]
            with psycopg.connect(url("inbound"), autocommit=True) as inbound:
                inbound.execute("SELECT mailroom.deliver_message(%s, %s, 'a@example.test', %s)",
                                (inbox, b"Subject: hi\r\n\r\nhi\r\n", Jsonb({"subject": "hi"})))

            # the collector (--enqueue) and the sender through the authenticated relay
            app.execute("SELECT mailroom.create_account('u5@example.test', 'u5')")
            enqueue = subprocess.Popen([sys.executable, "-m", "mailroom", "collect", "--enqueue"], env=collector,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
            try:
                deadline = time.monotonic() + 20
                with psycopg.connect(url("mail_owner"), autocommit=True) as owner:
                    while not owner.execute(
                        "SELECT count(*) FROM mailroom.outbound_messages WHERE kind = 'mail'"
                    ).fetchone()[0]:
                        assert time.monotonic() < deadline, "the token email was not enqueued"
                        time.sleep(0.1)
            finally:
                enqueue.terminate()
                enqueue.wait(timeout=10)
            _cli({**base, "MAILROOM_DATABASE_URL": url("sender"), "MAILROOM_SENDER_KEY_FILE": str(key_file)},
                 "send", "--until-idle", "--poll-interval", "0.2s", "--webhook-allow", "127.0.0.1/32")
        assert logins == [(b"mailer", PASSWORD.encode())], "the sender opened the sealed password and logged in"
        ((headers, body),) = hooks
        assert Webhook(whsec).verify(body, headers)["type"] == "message.received", "the sender opened the secret"
        (mail,) = relay.handler.received
        mailed = mail.content.decode().split("/activate?token=", 1)[1][:86]

        # the admin rotates the signing key
        _cli(ops, "keys", "rotate")
        _cli(ops, "keys", "list")
    finally:
        relay.stop()
        receiver.shutdown()
        receiver.server_close()

    with psycopg.connect(private_cluster.url("mail"), autocommit=True) as dba:
        keys = [bytes(k).hex() for (k,) in dba.execute("SELECT key FROM mailroom.signing_keys WHERE key IS NOT NULL")]
        assert len(keys) == 2
    time.sleep(0.5)  # postgres writes its log file directly (no logging collector)
    with private_cluster.logfile.open("rb") as f:
        f.seek(start)
        log = f.read().decode(errors="replace")
    assert "mailroom.consume_token" in log and "parameters: $1 = '" in log, "statements and parameters are logged"

    # what the application sends by design is a bearer credential, and so it is logged (docs/security.md)
    assert links["u1"] in log and used["signed"] in log and f"'{used['code']}'" in log
    # nothing else: no key (in any form a bytea parameter takes), no relay password, no link or
    # code the collector or the sender produced that nobody consumed
    secrets = {f"signing key {i}": k for i, k in enumerate(keys)}
    secrets |= {"relay password": PASSWORD, "unconsumed link u2": links["u2"], "unconsumed link u4": links["u4"],
                "unconsumed recovery link": recovery["u3"]["signed"],
                "unconsumed recovery code": f"'{recovery['u3']['code']}'", "mailed link": mailed,
                "webhook secret": whsec, "webhook secret's key": whsec.removeprefix("whsec_")}
    leaked = [what for what, value in secrets.items() if value in log]
    assert leaked == [], f"in the server log: {', '.join(leaked)}"
    assert "PRIVATE KEY" not in log and max(key_file.read_text().splitlines(), key=len) not in log
