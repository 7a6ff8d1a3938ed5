"""docs/mcp.md's walkthrough "From nothing to an agent's first mail" works as written (issue 44, item 6):
its shell blocks run as they stand, in a fresh directory with no MAILROOM_ variable set (an embedded
cluster of their own), and the client configuration it shows, filled in with what they printed, starts
`mailroom mcp` through the SDK's own stdio client, which makes an inbox and waits for a mail sent to
it over SMTP. Before, the doc named a login (`mailroom_web`) that existed nowhere and never said that
mail needs `mailroom run`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import smtplib
import socket
import subprocess
import sys
import tempfile
import time
from email.message import EmailMessage
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp_support import doc

DOC = (Path(__file__).resolve().parents[2] / "docs" / "mcp.md").read_text()


def block(name: str) -> str:
    match = re.search(rf"<!-- walkthrough: {name} -->\n```\w+\n(.*?)```", DOC, re.S)
    assert match, f"docs/mcp.md has no walkthrough block {name!r}"
    return match.group(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_walkthrough_from_nothing():
    # a fresh directory the cluster's user can reach (pytest's tmp_path is private to root)
    tmp_path = Path(tempfile.mkdtemp(prefix="mailroom-walkthrough-", dir=os.environ.get("MAILROOM_TEST_TMP", "/tmp")))
    tmp_path.chmod(0o755)
    bindir = str(Path(sys.executable).parent)
    assert shutil.which("mailroom", path=bindir), "the mailroom command sits beside the test's python"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env["PATH"] = f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}"
    setup = subprocess.run(["bash", "-euo", "pipefail", "-c", block("setup")], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=180)
    try:
        assert setup.returncode == 0, setup.stdout + setup.stderr
        key = re.search(r"api_key: (mrk_\S+)", setup.stdout).group(1)
        url = subprocess.run(["mailroom", "db", "url"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=60, check=True).stdout.strip()
        _agent_story(tmp_path, env, url, key)
    finally:
        subprocess.run(["mailroom", "db", "down"], cwd=tmp_path, env=env, capture_output=True, timeout=120)
        shutil.rmtree(tmp_path, ignore_errors=True)


def _agent_story(tmp_path: Path, env: dict[str, str], url: str, key: str) -> None:
    # step 2 as written; only its ports moved off the defaults, by their environment variables, so
    # parallel tests do not collide (the block itself is unchanged)
    smtp_port = free_port()
    run_env = dict(env, MAILROOM_DATABASE_URL=url, MAILROOM_RUN_INBOX_PORT=str(smtp_port))
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log:
        run = subprocess.Popen(["bash", "-c", "exec " + block("run").strip()], cwd=tmp_path, env=run_env,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "running: inbox" not in log_path.read_text():
            assert run.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        config = json.loads(block("client"))["mcpServers"]["mailroom"]
        server_env = {name: value.replace("<the output of mailroom db url>", url).replace("<the api_key of step 1>", key)
                      for name, value in config["env"].items()}
        assert "<" not in "".join(server_env.values()), server_env
        params = StdioServerParameters(command=config["command"], args=config["args"],
                                       env=dict(env, **server_env), cwd=str(Path.home()))
        asyncio.run(_create_and_wait(params, smtp_port))
    finally:
        os.killpg(run.pid, signal.SIGTERM)
        try:
            run.wait(timeout=60)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)


async def _create_and_wait(params: StdioServerParameters, smtp_port: int) -> None:
    async with stdio_client(params, errlog=sys.stderr) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        address = doc(await session.call_tool("create_inbox", {}))["address"]
        assert address.endswith("@mailroom.test"), address
        waiting = asyncio.create_task(session.call_tool("wait_for_message", {"address": address,
                                                                             "timeout_seconds": 60}))
        mail = EmailMessage()
        mail["From"], mail["To"], mail["Subject"] = "signup@app.example", address, "Your code is 424242"
        mail.set_content("Welcome!")
        await asyncio.to_thread(_send, smtp_port, mail)
        found = doc(await asyncio.wait_for(waiting, 90))
        assert found["subject"] == "Your code is 424242", found


def _send(port: int, mail: EmailMessage) -> None:
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as smtp:
        smtp.send_message(mail)
