"""Fixtures of the MCP tests: a module's database with an API key, the real inbound SMTP server
(`mailroom inbox serve`, as mr_inbound) and the real `mailroom mcp --http-port 0` (as mr_http).

A test module shares one database and its servers (each costs a second or two to start); the tests
use inboxes of their own, and the creation rate limit is set out of their way.
"""

from __future__ import annotations

import hashlib
import secrets
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from mcp_support import mailroom_env, wait_for_log

from mailroom import testing
from mailroom.testing import as_login


@dataclass
class Server:
    port: int
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, timeout: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout)


def start(db_url: str, log_path: Path, *args: str, ready: str = r"listening on 127\.0\.0\.1:(\d+)",
          env: dict[str, str] | None = None) -> Server:
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "mailroom", *args], env=mailroom_env(db_url, args, env),
                                stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        port = int(wait_for_log(log_path, ready, proc, timeout=60).group(1))
    except AssertionError:
        proc.kill()
        proc.wait(timeout=10)
        raise
    return Server(port, proc, log_path)


@pytest.fixture(scope="module")
def db_url(pg, template_db: str) -> Iterator[str]:
    name = f"m_{uuid.uuid4().hex[:12]}"
    url = testing.create_database(pg, name, template=template_db)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT mailroom.set_setting('http.create_limit', '1000000')")
    yield url
    testing.drop_database(pg, name)


@pytest.fixture(scope="module")
def api_key(db_url: str) -> str:
    """A key of owner agent-1, made as `mailroom apikey create` makes one (only its sha256 is stored)."""
    key = "mrk_" + secrets.token_urlsafe(32)
    with psycopg.connect(as_login(db_url, "mr_admin"), autocommit=True) as c:
        c.execute("SELECT mailroom.create_api_key('agent-1', %s, 'mcp tests', %s)",
                  (hashlib.sha256(key.encode()).digest(), key[-4:]))
    return key


@pytest.fixture(scope="module")
def smtp_server(db_url: str, tmp_path_factory) -> Iterator[Server]:
    server = start(db_url, tmp_path_factory.mktemp("smtp") / "inbox.log", "inbox", "serve", "--host", "127.0.0.1",
                   "--port", "0")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mcp_http(db_url: str, tmp_path_factory) -> Iterator[Server]:
    """`mailroom mcp --http-port 0 --pool-size 2`: eight waits must not exhaust its two connections; a
    statement timeout of 2 s (the default 5 s would only make its test slower)."""
    log_path = tmp_path_factory.mktemp("mcp") / "mcp.log"
    server = start(db_url, log_path, "mcp", "--http-port", "0", "--pool-size", "2", "--statement-timeout", "2s")
    try:
        wait_for_log(log_path, r"serving \(pid", server.proc, timeout=60)
    except AssertionError:
        server.stop()
        raise
    yield server
    server.stop()
