"""A started command loads its own area only: `mailroom collect` imports no other command's modules
and no help renderer (the root command loads areas lazily, driver/mailroom/cli.py), nor pydantic
(typer 0.29 coerces options through it: mailroom.cli.fast_options keeps it out of collect)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from mailroom.testing import as_login, login_for

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


# Issue 46, item 5: each worker command started alone imports its own area and no heavy module it does
# not use (typer's pydantic coercion kept out by mailroom.cli.FAST_OPTIONS); under `mailroom run` they
# fork from a parent that imported them all once (mailroom.ops.run.PRELOAD)
WORKER_PROBE = """
import atexit, json, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["mailroom", *sys.argv[2:]]
from mailroom.cli import main
main(sys.argv[1:])
"""

WORKER_COMMANDS = {
    # command: (argv, a module that proves it started, the areas it may load, the heavy modules it uses)
    "send": (["send"], "mailroom.outbound.sender", ("mailroom.outbound",), ("aiosmtplib", "prometheus_client")),
    "expire": (["expire"], "mailroom.inboxes.expiry", ("mailroom.inboxes",), ()),
    "maintain": (["maintain", "--every", "10m"], "mailroom.ops.maintain", ("mailroom.ops",), ()),
    # a group's sub-command ("inbox serve" in FAST_OPTIONS): pydantic was ~9 MiB of its memory under load
    "inbox serve": (["inbox", "serve", "--host", "127.0.0.1", "--port", "0", "--max-message-size", "100000",
                     "--idle-timeout", "30s"], "mailroom.inboxes.smtp", ("mailroom.inboxes",),
                    ("aiosmtpd", "prometheus_client", "psycopg_pool")),
}


@pytest.mark.parametrize("command", sorted(WORKER_COMMANDS))
def test_a_started_worker_imports_only_what_it_uses(db_url, tmp_path, command):
    argv, proof, own, uses = WORKER_COMMANDS[command]
    out = tmp_path / "modules.json"
    read_fd, write_fd = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env.update(MAILROOM_DATABASE_URL=as_login(db_url, login_for(argv)), PYTHONUNBUFFERED="1",
               MAILROOM_READY_FD=str(write_fd))
    proc = subprocess.Popen([sys.executable, "-c", WORKER_PROBE, str(out), *argv], env=env, pass_fds=(write_fd,),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(write_fd)
    try:
        ready, _, _ = select.select([read_fd], [], [], 30)
        assert ready and os.read(read_fd, 1) == b".", proc.stderr.read() if proc.poll() is not None else "not ready"
    finally:
        os.close(read_fd)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    modules = json.loads(out.read_text())
    assert proof in modules  # it really started
    others = [m for m in modules if m.startswith(tuple(a for a in OTHER_AREAS + ("mailroom.accounts",) if a not in own))]
    assert others == [], others
    heavy = [h for h in HEAVY if h not in uses]
    loaded_heavy = [m for m in modules if m in heavy or m.startswith(tuple(h + "." for h in heavy))]
    assert loaded_heavy == [], loaded_heavy


def test_run_preloads_the_event_loop_its_workers_take():
    """`auto` takes uvloop (a dependency): `mailroom run` imports it before it forks `inbox serve` and
    `send`, so its pages are shared (eventloop.auto_modules says it once)."""
    from mailroom.core import eventloop
    from mailroom.ops import run

    assert eventloop.auto_modules() == ("uvloop",)
    for worker in ("inbox", "send"):
        assert "uvloop" in run.PRELOAD[worker], worker
