"""The original expiring-inbox service's own MCP server, `uncorreotemporal-mcp` 0.1.1 from PyPI, drives
a sign-up through mailroom unchanged (issue 33, item 4).

Its six tools call the original REST API (`POST /api/v1/mailboxes?ttl_minutes=`, `GET …/messages?limit=
&offset=` as a JSON array, `GET …/messages/{id}` with `body_text`/`body_html`/`attachments`, errors'
`detail`) with `Authorization: Bearer $UCT_API_KEY` against `$UCT_API_BASE`: here a mailroom API key
(`mailroom apikey create`) and `mailroom http serve` as mr_http. The package is installed, with
`mcp<2` (it imports `mcp.server.fastmcp`, gone in mcp 2), into a venv of its own, made once per
machine under the temporary directory and reused (a lock file keeps two test processes from making it
at once); when pip cannot install it (the package index out of reach included) the test fails, saying
why: a compatibility test that skips proves nothing (issue 43, item 6). Its server runs
over stdio, driven by the `mcp` SDK's client (ClientSession + stdio_client, a dev dependency of
mailroom) from this process. (Its HTTP transport accepts only the original service's `uct_` keys.)

The mail is mailroom's own, end to end: `mailroom run` (the inbound SMTP server, the collector with
--enqueue and the sender, as mr_worker) turns `create_account` into an activation mail relayed to
the inbound server; the tools find it, and the link they extract activates the account
(`consume_token` as mr_app). Then a password recovery, whose code `extract_otp_code` finds, and
`complete_signup_flow`, which makes its own inbox: the test finds it in `GET /api/v1/mailboxes` (the
key's inbox list) and signs up with it while the tool waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from mailroom import testing

UCT_PACKAGE = "uncorreotemporal-mcp==0.1.1"
MCP_PIN = "mcp<2"
VENV = Path(tempfile.gettempdir()) / "mailroom-tests-uncorreotemporal-mcp-0.1.1"
SIX_TOOLS = ["complete_signup_flow", "create_signup_inbox", "extract_otp_code", "extract_verification_link",
             "get_latest_email", "wait_for_verification_email"]
LINK_BASE = "https://app.example.test"
SENDER = "uct-ci"
# pip's words for an index it cannot reach: the failure says so (still a failure, never a skip)
_UNREACHABLE = ("NewConnectionError", "Temporary failure in name resolution", "Name or service not known",
                "Network is unreachable", "ConnectTimeoutError", "Connection refused", "ProxyError",
                "Max retries exceeded", "No matching distribution found for uncorreotemporal")


def _uct_python() -> Path:
    """The venv's python, with the package installed (made once per machine, under a lock)."""
    python = VENV / "bin" / "python"
    done = VENV / ".installed"
    with open(str(VENV) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists() and python.exists():
            return python
        # a venv without pip of its own, filled by this interpreter's pip (`--python`), without
        # compiling: about 20 s on a fresh machine where ensurepip and compiling took 45
        subprocess.run([sys.executable, "-m", "venv", "--clear", "--without-pip", str(VENV)], check=True,
                       capture_output=True, timeout=120)
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-compile", "--no-input",
             "--disable-pip-version-check", UCT_PACKAGE, MCP_PIN],
            capture_output=True, text=True, timeout=300,
        )
        if pip.returncode != 0:
            output = pip.stdout + pip.stderr
            why = "pip cannot reach the package index" if any(word in output for word in _UNREACHABLE) else "failed"
            raise AssertionError(f"pip install {UCT_PACKAGE} {MCP_PIN}: {why} (this test needs the package; "
                                 f"it fails rather than skips):\n{output[-3000:]}")
        done.write_text(UCT_PACKAGE + "\n")
        return python


@pytest.fixture(scope="module")
def uct_python() -> Path:
    return _uct_python()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mail_chain(db_url, cli_popen, tmp_path):
    """`mailroom run`: inbound SMTP, the collector (--enqueue) and the sender relaying to that server."""
    port = _free_port()
    with psycopg.connect(db_url, autocommit=True) as c:
        domain = c.execute("SELECT mailroom.setting('inbox.domain')").fetchone()[0]
        c.execute("SELECT mailroom.upsert_sender(p_name => %s, p_from_address => %s, p_host => '127.0.0.1',"
                  " p_port => %s)", (SENDER, f"noreply@{domain}", port))
        c.execute("SELECT mailroom.set_setting('collector.sender', %s)", (SENDER,))
        c.execute("SELECT mailroom.set_setting('collector.link_base_url', %s)", (LINK_BASE,))
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log:
        proc = cli_popen("run", "--inbox-port", str(port), "--no-expire", "--no-maintain", stdout=log, stderr=log,
                         env={"MAILROOM_BATCH_LIMIT": "10", "MAILROOM_BATCH_TIMEOUT": "100ms"})
    deadline = time.monotonic() + 60
    while "running:" not in log_path.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.1)
    yield domain
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)


def _app(db_url: str) -> psycopg.Connection:
    return psycopg.connect(testing.as_login(db_url, "mr_app"), autocommit=True)


def _signed(link: str) -> str:
    return parse_qs(urlsplit(link).query)["token"][0]


async def _call(session: ClientSession, tool: str, **arguments) -> dict:
    result = await session.call_tool(tool, arguments)
    assert not result.isError, result
    return json.loads(result.content[0].text)


def test_the_original_mcp_server_signs_up_through_mailroom(uct_python, server, cli, db_url, mail_chain):
    started = time.monotonic()
    made = cli("apikey", "create", "agent-owner", "--label", "uct-mcp", "--json")
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)["api_key"]
    params = StdioServerParameters(
        command=str(uct_python), args=["-m", "uncorreotemporal_mcp.server"],
        env={"PATH": os.environ.get("PATH", ""), "UCT_API_BASE": server.base, "UCT_API_KEY": key,
             "UCT_MCP_TRANSPORT": "stdio"},
    )
    login = f"agent{uuid.uuid4().hex[:8]}"

    async def story() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            assert sorted(t.name for t in (await session.list_tools()).tools) == SIX_TOOLS

            # 1. an inbox for the sign-up (POST /api/v1/mailboxes?ttl_minutes=)
            inbox = await _call(session, "create_signup_inbox", service_name="mailroom-ci", ttl_minutes=10)
            address = inbox["email"]
            assert inbox["inbox_id"] == address and address.endswith("@" + mail_chain) and inbox["expires_at"]
            # nothing yet: the list is an empty JSON array (the tool's own answer, not "Expected list")
            empty = await _call(session, "get_latest_email", inbox_id=address)
            assert (empty["error"], empty["status_code"]) == ("no_messages", 404), empty
            # mailroom's errors reach it through `detail`
            missing = await _call(session, "get_latest_email", inbox_id="nobody@" + mail_chain)
            assert (missing["error"], missing["status_code"], missing["detail"]) == ("api_error", 404, "mailbox not found")

            # 2. sign up with it: mailroom's collector, sender and inbound server deliver the activation mail
            with _app(db_url) as app:
                account = app.execute("SELECT mailroom.create_account(%s, %s)", (address, login)).fetchone()[0]
            waited = await _call(session, "wait_for_verification_email", inbox_id=address, timeout_seconds=30,
                                 poll_interval_seconds=1, subject_contains="activate")
            assert waited["status"] == "received" and waited["subject"] == "Activate your account", waited
            assert waited["from_address"] == f"noreply@{mail_chain}"
            link = await _call(session, "extract_verification_link", inbox_id=address, message_id=str(waited["message_id"]),
                               preferred_domains=["app.example.test"])
            assert link["verification_link"].startswith(f"{LINK_BASE}/activate?token="), link
            latest = await _call(session, "get_latest_email", inbox_id=address)
            assert latest["message_id"] == str(waited["message_id"]) and link["verification_link"] in latest["body_text"]
            assert "<a href=" in latest["body_html"] and latest["has_attachments"] is False
            with _app(db_url) as app:
                consumed = app.execute("SELECT account, outcome FROM mailroom.consume_token(%s)",
                                       (_signed(link["verification_link"]),)).fetchone()
                assert consumed == (account, "consumed")
                assert app.execute("SELECT mailroom.account_status(%s)", (account,)).fetchone()[0] == "active"

            # 3. a password recovery: the link and its code
            with _app(db_url) as app:
                app.execute("SELECT mailroom.request_password_recovery(%s)", (address,))
            recovery = await _call(session, "wait_for_verification_email", inbox_id=address, timeout_seconds=30,
                                   poll_interval_seconds=1, subject_contains="reset")
            assert recovery["status"] == "received", recovery
            mid = str(recovery["message_id"])
            otp = await _call(session, "extract_otp_code", inbox_id=address, message_id=mid)
            body = (await _call(session, "get_latest_email", inbox_id=address))["body_text"]
            code = re.search(r"enter the code (\d{5})", body).group(1)
            assert otp["otp_code"] == code, (otp, body)
            reset = await _call(session, "extract_verification_link", inbox_id=address, message_id=mid)
            assert reset["verification_link"].startswith(f"{LINK_BASE}/recover?token="), reset
            with _app(db_url) as app:
                used = app.execute("SELECT account, outcome FROM mailroom.consume_token(%s, %s)",
                                   (_signed(reset["verification_link"]), otp["otp_code"])).fetchone()
                assert used == (account, "consumed")

            # 4. complete_signup_flow: its own inbox, found in the key's inbox list while the tool waits
            flow = asyncio.create_task(_call(session, "complete_signup_flow", service_name="second-service",
                                             timeout_seconds=40, poll_interval_seconds=1, subject_contains="activate",
                                             preferred_domains=["app.example.test"], ttl_minutes=10))
            second = None
            deadline = time.monotonic() + 20
            while second is None and time.monotonic() < deadline and not flow.done():
                boxes = server.request("GET", "/api/v1/mailboxes", token=key).json()
                second = next((b["address"] for b in boxes if b["address"] != address), None)
                await asyncio.sleep(0.2)
            assert second is not None, "complete_signup_flow's inbox never showed in GET /api/v1/mailboxes"
            with _app(db_url) as app:
                other = app.execute("SELECT mailroom.create_account(%s, %s)", (second, login + "b")).fetchone()[0]
            done = await asyncio.wait_for(flow, 60)
            assert (done["status"], done["email"]) == ("success", second), done
            assert done["verification_message"]["subject"] == "Activate your account"
            with _app(db_url) as app:
                assert app.execute("SELECT account FROM mailroom.consume_token(%s)",
                                   (_signed(done["verification_link"]),)).fetchone() == (other,)
                assert app.execute("SELECT mailroom.account_status(%s)", (other,)).fetchone()[0] == "active"

    asyncio.run(story())
    # the agent's calls leave no key in the server's log
    assert key not in server.log()
    print(f"uncorreotemporal-mcp story: {time.monotonic() - started:.1f}s")
