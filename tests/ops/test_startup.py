"""A started command loads its own area only: `mailroom collect` imports no other command's modules
and no help renderer (the root command loads areas lazily, driver/mailroom/cli.py), nor pydantic
(typer 0.29 coerces options through it: mailroom.cli.fast_options keeps it out of collect)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

PROBE = """
import atexit, json, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["mailroom", "collect"]
from mailroom.cli import main
main()
"""

OTHER_AREAS = ("mailroom.inboxes", "mailroom.outbound", "mailroom.ops", "mailroom.http", "mailroom.db.migrate",
               "mailroom.db.cluster")
HEAVY = ("rich", "typer.rich_utils", "aiosmtpd", "aiosmtplib", "prometheus_client", "psycopg_pool", "fastapi", "starlette",
         "uvicorn", "cryptography", "pydantic", "pydantic_core")


def test_started_collector_imports_only_its_area(db_url, tmp_path):
    out = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env.update(MAILROOM_DATABASE_URL=db_url, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-c", PROBE, str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    seen = ""
    assert proc.stderr is not None
    while "connected;" not in seen and time.monotonic() < deadline:
        seen += proc.stderr.readline()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert "connected;" in seen, seen
    modules = json.loads(out.read_text())
    assert "mailroom.accounts.collector" in modules  # it really started the collector
    loaded_others = [m for m in modules if m.startswith(OTHER_AREAS)]
    assert loaded_others == [], loaded_others
    loaded_heavy = [m for m in modules if m in HEAVY or m.startswith(tuple(h + "." for h in HEAVY))]
    assert loaded_heavy == [], loaded_heavy
