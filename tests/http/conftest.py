"""Fixtures of the HTTP tests: the real `mailroom http serve` (as mr_http) on a free 127.0.0.1 port.

A test module shares one database and one server (starting a server costs a second or two): the
tests use inboxes of their own, and the creation rate limit is set out of their way here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from http_support import HttpServer, start_http

from mailroom import testing
from mailroom.testing import as_login


@pytest.fixture(scope="module")
def db_url(pg, template_db: str) -> Iterator[str]:
    name = f"h_{uuid.uuid4().hex[:12]}"
    url = testing.create_database(pg, name, template=template_db)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT mailroom.set_setting('http.create_limit', '1000000')")
    yield url
    testing.drop_database(pg, name)


@pytest.fixture(scope="module")
def server_flags() -> tuple[str, ...]:
    """Flags of the module's `mailroom http serve` (a module overrides this: the browser test turns the
    link and spam checks on)."""
    return ()


@pytest.fixture(scope="module")
def module_server(db_url: str, tmp_path_factory, server_flags: tuple[str, ...]) -> Iterator[HttpServer]:
    import os
    import subprocess
    import sys

    def popen(*args: str, env=None, **kwargs):
        merged = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
        merged.update(PYTHONUNBUFFERED="1", MAILROOM_DATABASE_URL=db_url, **(env or {}))
        return subprocess.Popen([sys.executable, "-m", "mailroom", *args], env=testing.driver_env(merged, args), **kwargs)

    server = start_http(popen, tmp_path_factory.mktemp("http") / "http.log", *server_flags)
    yield server
    server.stop()


@pytest.fixture
def start_server(cli_popen, tmp_path: Path) -> Iterator[Callable[..., HttpServer]]:
    servers: list[HttpServer] = []

    def start(*args: str, env: dict[str, str] | None = None) -> HttpServer:
        server = start_http(cli_popen, tmp_path / f"http-{len(servers)}.log", *args, env=env)
        servers.append(server)
        return server

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.stop()


@pytest.fixture
def server(module_server: HttpServer) -> HttpServer:
    assert module_server.proc.poll() is None, module_server.log()
    return module_server


@pytest.fixture
def deliver(db_url: str) -> Callable[..., int]:
    """deliver(address, subject, text=…, html=…, raw=…): mailroom.deliver_message as the inbound role."""
    def run(address: str, subject: str, text: str | None = None, html: str | None = None, raw: bytes | None = None,
            from_header: str = "App <app@example.org>", attachments: str = "[]") -> int:
        raw = raw or f"From: {from_header}\r\nSubject: {subject}\r\n\r\n{text or ''}".encode()
        with psycopg.connect(as_login(db_url, "mr_inbound"), autocommit=True) as c:
            return c.execute(
                "SELECT mailroom.deliver_message(%s, %s, 'app@example.org', %s, %s, %s, %s, %s::jsonb)",
                (address, raw, subject, from_header, text, html, attachments),
            ).fetchone()[0]

    return run
