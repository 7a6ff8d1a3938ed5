"""docs/testing-signup.md works as written: its pgTAP block, pasted into psql, passes against a
database where the real `mailroom collect --enqueue`, `mailroom send` and `mailroom inbox serve`
carry the activation mail."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

DOC = (Path(__file__).resolve().parents[2] / "docs" / "testing-signup.md").read_text()


def test_the_documented_signup_test_passes(server, conn, db_url, cli_popen, tmp_path):
    block = re.search(r"## The pgTAP test.*?```sql\n(.*?)```", DOC, re.S).group(1)
    conn.execute("CREATE EXTENSION IF NOT EXISTS pgtap")
    conn.execute("SELECT mailroom.upsert_sender('mailroom', 'noreply@app.example.test', '127.0.0.1', %s)",
                 (server.port,))
    conn.execute("SELECT mailroom.set_setting('collector.link_base_url', 'https://app.example.test')")
    logs = []
    for args, env in ((("collect", "--enqueue"), {"MAILROOM_BATCH_TIMEOUT": "100ms"}),
                      (("send", "--poll-interval", "0.2s"), {})):
        log_path = tmp_path / f"{args[0]}.log"
        with open(log_path, "w") as log_file:
            cli_popen(*args, env=env, stdout=subprocess.DEVNULL, stderr=log_file)
        logs.append(log_path)

    psql_env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    proc = subprocess.run(["psql", "-X", "-q", db_url], input=block, capture_output=True, text=True,
                          timeout=90, env=psql_env)
    workers = "\n".join(p.read_text() for p in logs)
    assert proc.returncode == 0, proc.stdout + proc.stderr + workers
    assert "not ok" not in proc.stdout, proc.stdout + workers
    for n in range(1, 7):
        assert re.search(rf"^\s*ok {n} - ", proc.stdout, re.M), proc.stdout + proc.stderr + workers
    assert re.search(r"^\s*1\.\.6\s*$", proc.stdout, re.M), proc.stdout
