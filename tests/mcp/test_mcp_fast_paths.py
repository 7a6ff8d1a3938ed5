"""The guard of MCP's fast path over HTTP (mailroom.mcp.server._FastCalls, a stateless JSON-RPC endpoint
on the SDK's public API: mcp.types, the Tool objects FastMCP was given, FastMCP.list_tools()):

- the SDK's own client, on the app `mailroom mcp --http-port` serves, has its tools/list and tools/call
  answered by _FastCalls when the fast paths are on, so an SDK on which the fast path silently hands
  everything to the transport (a changed check, header or protocol version) fails here; with
  MAILROOM_FAST_PATHS=off, the SDK's transport answers every request, alike;
- the same requests, on an app with the fast path and one without, get the same bytes (answers,
  refusals, tool errors, a bad key), and the fast one served each of them itself;
- the SDK's client gets the same results over stdio (`mailroom mcp`), over HTTP through the fast path
  and over HTTP through the SDK's transport.

In process (the apps on a real database, their ASGI lifespans run here, httpx's ASGI transport under the
SDK's client), so the counts of mailroom.core.fastpaths are this process's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import psycopg
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp_support import mailroom_env, stdio_session

from mailroom.core import fastpaths
from mailroom.mcp.server import McpConfig, http_app
from mailroom.testing import as_login

BASE = "http://127.0.0.1:8000"
RAW = (b"From: App <app@example.org>\r\nTo: you@example.org\r\nSubject: Hello there\r\n\r\n"
       b"Open https://app.example.org/activate?t=abc or type 48213.\r\n")


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


def _inbox(db_url: str, api_key: str) -> tuple[str, list[int]]:
    """An inbox of the key's owner (as MCP's create_inbox makes one) with three messages."""
    digest = hashlib.sha256(api_key.encode()).digest()
    parsed = json.dumps({"subject": "Hello there", "from_header": "App <app@example.org>",
                         "text_body": "Open https://app.example.org/activate?t=abc or type 48213.\n"})
    with psycopg.connect(db_url, autocommit=True) as c:
        address = c.execute("SELECT mailroom.http_create_mailbox(%s, NULL, p_face => 'mcp')",
                            (digest,)).fetchone()[0]["address"]
        ids = [c.execute("SELECT mailroom.deliver_message(%s, %s, 'app@example.org', %s::jsonb)",
                         (address, RAW, parsed)).fetchone()[0] for _ in range(3)]
    return address, ids


def _calls(address: str, ids: list[int]) -> list[tuple[str, dict[str, Any]]]:
    """Tool calls whose answers do not move with the clock: reads, extractions, refusals of SQL and of
    the tools' own argument validation."""
    return [
        ("list_messages", {"address": address}),
        ("list_messages", {"address": address, "limit": 2, "unread": True}),
        ("read_message", {"address": address, "message_id": ids[0]}),
        ("extract_link", {"address": address, "message_id": ids[0]}),
        ("extract_code", {"address": address, "message_id": ids[1]}),
        ("search_messages", {"address": address, "query": "hello"}),
        ("list_messages", {"address": "nobody@example.org"}),  # MR203
        ("read_message", {"address": address, "message_id": 999999999}),  # MR209
        ("list_messages", {"address": address, "limit": 0}),  # the tool's validation
        ("list_messages", {}),  # a required argument missing
        ("read_message", {"address": address, "message_id": "one"}),
    ]


def test_the_fast_path_answers_byte_for_byte_as_the_sdk_transport(db_url, api_key):
    address, ids = _inbox(db_url, api_key)
    config = McpConfig(database_url=as_login(db_url, "mr_http"))
    fast, sdk = http_app(config, host="127.0.0.1", fast=True), http_app(config, host="127.0.0.1", fast=False)
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
               "MCP-Protocol-Version": "2025-06-18"}
    requests: list[tuple[dict, dict[str, str], bool]] = [  # (message, headers, served by the fast path)
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"Authorization": f"Bearer {api_key}"}, True),
        ({"jsonrpc": "2.0", "id": "x", "method": "tools/call", "params": {"name": "list_inboxes"}},
         {"Authorization": "Bearer mrk_not_a_key"}, True),  # MR241: the request's own key reaches the tool
        ({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": {"name": "list_messages", "arguments": {"address": address}}}, {"X-API-Key": api_key}, True),
        ({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "no_such_tool", "arguments": {}}},
         {"Authorization": f"Bearer {api_key}"}, False),  # the SDK's answer on both
    ]
    requests += [({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": name, "arguments": arguments}},
                  {"Authorization": f"Bearer {api_key}"}, True)
                 for n, (name, arguments) in enumerate(_calls(address, ids), start=10)]

    async def run() -> list[tuple[httpx.Response, httpx.Response, int]]:
        async with lifespan(fast), lifespan(sdk), \
                httpx.AsyncClient(transport=httpx.ASGITransport(app=fast, client=("127.0.0.1", 1)), base_url=BASE,
                                  headers=headers) as on, \
                httpx.AsyncClient(transport=httpx.ASGITransport(app=sdk, client=("127.0.0.1", 1)), base_url=BASE,
                                  headers=headers) as off:
            for message, more, _ in requests:  # once before: what a read marks read is read for both
                await off.post("/mcp", json=message, headers=more)
            answers = []
            for message, more, _ in requests:
                before = fastpaths.served["mcp.fast_calls"]
                body = json.dumps(message).encode()
                answer_on = await on.post("/mcp", content=body, headers=more)
                served = fastpaths.served["mcp.fast_calls"] - before
                answers.append((answer_on, await off.post("/mcp", content=body, headers=more), served))
            return answers

    for (message, _, by_fast), (on, off, served) in zip(requests, asyncio.run(run()), strict=True):
        assert (on.status_code, on.headers["content-type"]) == (off.status_code, off.headers["content-type"]) \
            == (200, "application/json"), (message, on.text, off.text)
        assert on.content == off.content, (message, on.text, off.text)
        assert served == int(by_fast), message


def test_the_sdk_client_gets_the_same_results_over_stdio_and_both_http_paths(db_url, api_key, tmp_path):
    address, ids = _inbox(db_url, api_key)
    config = McpConfig(database_url=as_login(db_url, "mr_http"))
    env = mailroom_env(db_url, ("mcp",), {"MAILROOM_MCP_API_KEY": api_key})

    async def through(session: ClientSession) -> list[Any]:
        results: list[Any] = [(await session.list_tools()).model_dump()]
        for name, arguments in _calls(address, ids):
            results.append((await session.call_tool(name, arguments)).model_dump())
        return results

    async def http(fast: bool) -> tuple[list[Any], int]:
        app = http_app(config, host="127.0.0.1", fast=fast)
        async with lifespan(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 1)), base_url=BASE,
                headers={"Authorization": f"Bearer {api_key}"}) as client, \
                streamable_http_client(f"{BASE}/mcp", http_client=client) as (read, write, _), \
                ClientSession(read, write) as session:
            await session.initialize()
            before = fastpaths.served["mcp.fast_calls"]
            results = await through(session)
            return results, fastpaths.served["mcp.fast_calls"] - before

    async def stdio() -> list[Any]:
        with open(tmp_path / "stdio.log", "w") as errlog:
            async with stdio_session(env, errlog) as session:
                return await through(session)

    asyncio.run(http(False))  # once before: what a read marks read is read for the three alike
    over_sdk, served_sdk = asyncio.run(http(False))
    over_fast, served_fast = asyncio.run(http(True))
    over_stdio = asyncio.run(stdio())
    assert (served_fast, served_sdk) == (len(over_fast), 0)
    assert over_fast == over_sdk
    assert over_stdio == over_sdk
    assert [r["isError"] for r in over_sdk[1:7]] == [False] * 6, over_sdk[1:7]
    assert [r["isError"] for r in over_sdk[7:]] == [True] * 5
