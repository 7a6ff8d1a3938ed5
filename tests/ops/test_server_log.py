"""Secrets stay out of the server log, even when the server logs every statement.

A private cluster logs everything (log_statement = all, log_min_duration_statement = 0); the
migration sets log_parameter_max_length = 0 for the database. Then keys, signed tokens, codes and
an SMTP password travel through the real calls (the collector process, the app's consume, the
admin's upsert_sender, the sender's claim), and the test greps the real log for each of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psycopg

from mailroom.db.migrate import migrate

KEY_HEX = "5eed" * 16
ENC_HEX = "c0de" * 16
PASSWORD = "correct-horse-battery-staple-41"


def test_statement_log_holds_no_key_token_code_or_password(private_cluster, tmp_path):
    url = private_cluster.url()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET log_statement = 'all'")
        admin.execute("ALTER SYSTEM SET log_min_duration_statement = 0")
        admin.execute("SELECT pg_reload_conf()")
    migrate(url)  # sets log_parameter_max_length = 0 for the database: sessions from now on
    start = private_cluster.logfile.stat().st_size
    secrets: list[str] = [KEY_HEX, ENC_HEX, PASSWORD]
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SHOW log_statement").fetchone()[0] == "all"
        assert conn.execute("SHOW log_parameter_max_length").fetchone()[0] == "0"
        conn.execute("SELECT mailroom.create_account('logcheck@example.test', 'logcheck')")
        conn.execute("SELECT mailroom.create_account('logcheck2@example.test', 'logcheck2')")
        # the collector, a real process, signs with its key (a bind parameter)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
        env.update(MAILROOM_DATABASE_URL=url, MAILROOM_SECRET_KEY=KEY_HEX, MAILROOM_BATCH_TIMEOUT="50ms")
        proc = subprocess.Popen([sys.executable, "-m", "mailroom", "collect", "--output", "jsonl"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            lines = [proc.stdout.readline() for _ in range(2)]
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        import json

        tokens = [json.loads(line) for line in lines]
        assert len(tokens) == 2, lines
        secrets += [t["signed"] for t in tokens]
        # the application consumes a link (the signed value and the key are bind parameters)
        conn.execute("SELECT * FROM mailroom.consume_token(%s, %s)", (tokens[0]["signed"], bytes.fromhex(KEY_HEX)))
        # a recovery token: its code travels too
        conn.execute("SELECT mailroom.request_password_recovery('logcheck@example.test')")
        row = conn.execute("SELECT signed, code FROM mailroom.dequeue_tokens(10, %s)", (bytes.fromhex(KEY_HEX),)).fetchone()
        secrets += [row[0], f"'{row[1]}'"]
        conn.execute("SELECT * FROM mailroom.consume_token(%s, %s, %s)", (row[0], bytes.fromhex(KEY_HEX), row[1]))
        # the admin stores a relay password, the sender claims with the encryption key
        conn.execute(
            "SELECT mailroom.upsert_sender('relay', 'noreply@example.test', '127.0.0.1', 2525, 'none', 'u', %s, %s)",
            (PASSWORD, bytes.fromhex(ENC_HEX)),
        )
        conn.execute("SELECT mailroom.enqueue_message('relay', ARRAY['to@example.test'], 's', 'b')")
        claimed = conn.execute("SELECT smtp_password FROM mailroom.claim_messages(10, 'w', %s)",
                               (bytes.fromhex(ENC_HEX),)).fetchall()
        assert claimed and claimed[0][0] == PASSWORD
    time.sleep(0.5)  # the logging collector is not used: postgres writes the file directly
    with private_cluster.logfile.open("rb") as f:
        f.seek(start)
        log = f.read().decode(errors="replace")
    assert "mailroom.consume_token" in log and "LOG:  execute" in log, "statements are really logged"
    assert "parameters:" not in log
    leaked = [s for s in secrets if s in log]
    assert leaked == [], f"{len(leaked)} secret(s) found in the server log"
