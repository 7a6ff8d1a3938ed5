"""Fixtures for the inbox tests: the real `mailroom inbox serve` on a free 127.0.0.1 port."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from inbox_support import InboxServer, Mailbox, wait_for_log


@pytest.fixture
def make_mailbox(conn: psycopg.Connection) -> Callable[..., Mailbox]:
    def make(ttl: int | None = None, plan: str = "free", owner_type: str = "anonymous",
             owner_id: str | None = None) -> Mailbox:
        row = conn.execute(
            "SELECT mailbox_id, address, expires_at, session_token FROM mailroom.create_mailbox(%s, %s, %s, %s)",
            (ttl, plan, owner_type, owner_id),
        ).fetchone()
        return Mailbox(*row)

    return make


@pytest.fixture
def start_server(cli_popen, tmp_path: Path) -> Iterator[Callable[..., InboxServer]]:
    servers: list[InboxServer] = []

    def start(*extra: str, env: dict[str, str] | None = None) -> InboxServer:
        log_path = tmp_path / f"serve-{len(servers)}.log"
        log_file = open(log_path, "w")  # noqa: SIM115 - the child writes to it
        proc = cli_popen("inbox", "serve", "--host", "127.0.0.1", "--port", "0", *extra,
                         env=env, stdout=subprocess.DEVNULL, stderr=log_file)
        log_file.close()
        match = wait_for_log(log_path, r"listening on 127\.0\.0\.1:(\d+)", proc)
        server = InboxServer("127.0.0.1", int(match.group(1)), proc, log_path)
        servers.append(server)
        return server

    yield start
    for server in servers:
        try:
            server.stop()
        except subprocess.TimeoutExpired:
            server.proc.kill()


@pytest.fixture
def server(start_server) -> InboxServer:
    return start_server()
