"""Fixtures of the checks' tests (docs/checks.md): a real `mailroom http serve` per module (with the
flags the module names), inboxes and delivered messages, a loopback HTTP server the link check asks,
and a real SpamAssassin spamd on a free 127.0.0.1 port."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psycopg
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))  # the HTTP tests' helpers

from checks_support import running_spamd  # noqa: E402
from http_support import HttpServer, start_http  # noqa: E402

from mailroom import testing  # noqa: E402
from mailroom.testing import as_login  # noqa: E402


@pytest.fixture(scope="module")
def db_url(pg, template_db: str) -> Iterator[str]:
    name = f"c_{uuid.uuid4().hex[:12]}"
    url = testing.create_database(pg, name, template=template_db)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT mailroom.set_setting('http.create_limit', '1000000')")
    yield url
    testing.drop_database(pg, name)


@pytest.fixture(scope="module")
def serve(db_url: str, tmp_path_factory) -> Iterator[Callable[..., HttpServer]]:
    """serve(*flags): `mailroom http serve --port 0 *flags` on this module's database."""
    servers: list[HttpServer] = []

    def popen(*args: str, env=None, **kwargs):
        merged = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
        merged.update(PYTHONUNBUFFERED="1", MAILROOM_DATABASE_URL=db_url, **(env or {}))
        return subprocess.Popen([sys.executable, "-m", "mailroom", *args], env=testing.driver_env(merged, args), **kwargs)

    def start(*flags: str) -> HttpServer:
        server = start_http(popen, tmp_path_factory.mktemp("http") / "http.log", *flags)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def inbox(serve) -> Callable[[HttpServer], tuple[str, str]]:
    def make(server: HttpServer) -> tuple[str, str]:
        created = server.request("POST", "/api/v1/mailboxes", body={"ttl_minutes": 30})
        assert created.status == 201, created.body
        doc = created.json()
        return doc["address"], doc["session_token"]

    return make


@pytest.fixture
def deliver(db_url: str) -> Callable[..., int]:
    """deliver(address, subject, text=…, html=…, raw=…): mailroom.deliver_message as the inbound role."""
    def run(address: str, subject: str, text: str | None = None, html: str | None = None, raw: bytes | None = None) -> int:
        raw = raw or f"From: App <app@example.org>\r\nSubject: {subject}\r\n\r\n{text or ''}".encode()
        with psycopg.connect(as_login(db_url, "mr_inbound"), autocommit=True) as c:
            return c.execute(
                "SELECT mailroom.deliver_message(%s, %s, 'app@example.org', %s, 'App <app@example.org>', %s, %s)",
                (address, raw, subject, text, html),
            ).fetchone()[0]

    return run


class _Target(BaseHTTPRequestHandler):
    """The link check's loopback target: /ok 200, /missing 404, /no-head (405 to HEAD, 200 to GET),
    /redirect -> /ok, /hops/N -> /hops/N-1 … /hops/0 200, /away -> 127.0.0.2 (loopback, not allowed),
    /other-port -> 127.0.0.1:9 (a port checks.link_ports does not list), /slow answers after 3 s."""

    def _answer(self) -> None:
        path = self.path.split("?", 1)[0]
        self.server.seen.append((self.command, path))  # type: ignore[attr-defined]
        if path in ("/ok", "/img.png", "/hops/0"):
            self._reply(200)
        elif path == "/no-head":
            self._reply(405 if self.command == "HEAD" else 200)
        elif path == "/redirect":
            self._reply(302, location="/ok")
        elif path.startswith("/hops/"):
            self._reply(301, location=f"/hops/{int(path.rsplit('/', 1)[1]) - 1}")
        elif path == "/away":
            self._reply(302, location=f"http://127.0.0.2:{self.server.server_address[1]}/ok")
        elif path == "/other-port":
            self._reply(302, location="http://127.0.0.1:9/ok")
        elif path == "/slow":
            time.sleep(3)
            self._reply(200)
        else:
            self._reply(404)

    def _reply(self, status: int, location: str | None = None) -> None:
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        body = b"x" * 64
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def target() -> Iterator[ThreadingHTTPServer]:
    """The loopback HTTP server on a free 127.0.0.1 port; `.seen` lists (method, path) asked."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    server.daemon_threads = True
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def spamd(tmp_path_factory) -> Iterator[str]:
    """A real spamd on a free 127.0.0.1 port (checks_support.running_spamd): host:port."""
    with running_spamd(tmp_path_factory.mktemp("spamd")) as address:
        yield address
