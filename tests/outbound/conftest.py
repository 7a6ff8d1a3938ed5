"""Fixtures of the outbound tests: scripted SMTP servers on 127.0.0.1, stopped after each test."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from outbound_support import Handler, SmtpServer


@pytest.fixture
def smtp_server() -> Iterator[Callable[..., SmtpServer]]:
    servers: list[SmtpServer] = []

    def start(mode: str = "accept", reply: str = "250 2.0.0 Ok", delay: float = 0.0, **kw) -> SmtpServer:
        server = SmtpServer(Handler(mode=mode, reply=reply, delay=delay), **kw).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
