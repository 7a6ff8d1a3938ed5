"""The guard of MCP's fast path over HTTP (mailroom.mcp.server._FastCalls, built on the SDK's low-level
server and its transport's checks): the SDK's own client, on the app `mailroom mcp --http-port` serves,
has its tools/list and tools/call answered by _FastCalls when the fast paths are on, so an SDK on which
the fast path silently hands everything to the transport (a changed check, header or protocol version)
fails here; with MAILROOM_FAST_PATHS=off, the SDK's transport answers every request, alike.

In process (the app on a real database, its ASGI lifespan run here, httpx's ASGI transport under the
SDK's client), so the counts of mailroom.core.fastpaths are this process's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from mailroom.core import fastpaths
from mailroom.mcp.server import McpConfig, http_app
from mailroom.testing import as_login


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    """The ASGI lifespan protocol, as uvicorn runs it: startup before the requests, shutdown after."""
    inbox: asyncio.Queue[dict] = asyncio.Queue()
    started, stopped = asyncio.Event(), asyncio.Event()

    async def send(message: dict) -> None:
        assert not message["type"].endswith(".failed"), message
        (started if message["type"] == "lifespan.startup.complete" else stopped).set()

    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, send))
    await inbox.put({"type": "lifespan.startup"})
    await asyncio.wait_for(started.wait(), 30)
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(stopped.wait(), 30)
        await task


def test_the_sdk_client_is_answered_by_the_fast_path_exactly_when_switched_on(db_url, api_key):
    app = http_app(McpConfig(database_url=as_login(db_url, "mr_http")), host="127.0.0.1")

    async def run() -> tuple[collections.Counter, list[str], Any]:
        async with lifespan(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 1)), base_url="http://127.0.0.1:8000",
                headers={"Authorization": f"Bearer {api_key}"}) as client, \
                streamable_http_client("http://127.0.0.1:8000/mcp", http_client=client) as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()
            before = collections.Counter(fastpaths.served)
            tools = await session.list_tools()
            created = await session.call_tool("create_inbox", {})
            served = collections.Counter(fastpaths.served) - before
            return served, [t.name for t in tools.tools], created

    served, names, created = asyncio.run(run())
    assert "create_inbox" in names and "list_messages" in names
    assert not created.isError, created.content
    assert "@" in json.loads(created.content[0].text)["address"]
    assert served == (collections.Counter({"mcp.fast_calls": 2}) if fastpaths.enabled() else collections.Counter())


def test_the_initialization_options_are_built_once_exactly_when_switched_on():
    """_build_options_once replaces the low-level server's create_initialization_options (FastMCP's private
    _mcp_server), which the session manager calls for every stateless request: if it stopped calling it,
    the cache would go quiet."""
    import inspect

    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

    from mailroom.mcp.server import Backend, build

    assert "self.app.create_initialization_options()" in inspect.getsource(StreamableHTTPSessionManager)
    server = build(Backend(McpConfig(database_url="host=/nonexistent dbname=none")), errors={})
    lowlevel = server._mcp_server
    once = lowlevel.create_initialization_options() is lowlevel.create_initialization_options()
    assert once is fastpaths.enabled()
