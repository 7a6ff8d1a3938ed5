"""The stateless JSON fast path of `mailroom mcp --http-port` (mailroom.mcp.server._FastCalls): which
requests it answers itself with the tools FastMCP was given (their own argument validation) and
FastMCP.list_tools(), and which it hands to the SDK's transport (with the body as it read it). In
process, no database: tools/list and a refused argument make no call."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import ListToolsResult

from mailroom.mcp.server import Backend, McpConfig, _FastCalls, build


class _Sdk:
    """Stands where the SDK's app is: records what reaches it and the body it reads."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def _post(app: Any, message: Any, *, headers: dict[str, str | None] | None = None, path: str = "/mcp") -> tuple[int, Any]:
    body = json.dumps(message).encode()
    fields = {"host": "127.0.0.1:8000", "accept": "application/json, text/event-stream",
              "content-type": "application/json", "content-length": str(len(body)), "authorization": "Bearer mrk_x",
              **(headers or {})}
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(k.encode(), v.encode()) for k, v in fields.items() if v is not None],
             "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1),
             "root_path": ""}
    sent: list[dict] = []
    given = False

    async def receive() -> dict:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    text = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], json.loads(text) if text else None


def _app() -> tuple[_FastCalls, _Sdk, Any]:
    # host 127.0.0.1: the SDK's DNS-rebinding check is on (Host and Origin of loopback names only)
    server = build(Backend(McpConfig(database_url="host=/nonexistent dbname=none")), errors={}, host="127.0.0.1")
    sdk = _Sdk()
    return _FastCalls(sdk, server, "/mcp"), sdk, server


def test_tools_list_and_a_refused_argument_are_answered_without_the_sdk_transport() -> None:
    app, sdk, server = _app()
    status, answer = _post(app, {"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
    assert status == 200 and answer["id"] == 7 and sdk.bodies == []
    # FastMCP.list_tools(), as the low-level server's handler answers it
    expected = ListToolsResult(tools=asyncio.run(server.list_tools()))
    assert answer["result"] == expected.model_dump(by_alias=True, mode="json", exclude_none=True)
    status, answer = _post(app, {"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {"cursor": "x"}})
    assert status == 200 and answer["id"] == 9 and sdk.bodies == []
    # the tool's own argument validation (FastMCP's), before any SQL call: the error FastMCP.call_tool
    # raises, as the low-level server answers it (a tool error whose text is the exception's)
    arguments = {"address": "x@y", "limit": 0}
    status, answer = _post(app, {"jsonrpc": "2.0", "id": "a", "method": "tools/call",
                                 "params": {"name": "list_messages", "arguments": arguments}})
    assert status == 200 and answer["id"] == "a" and sdk.bodies == []
    with pytest.raises(ToolError) as refused:
        asyncio.run(server.call_tool("list_messages", arguments))
    assert answer["result"] == {"content": [{"type": "text", "text": str(refused.value)}], "isError": True}
    assert "validation error" in str(refused.value) and "limit" in str(refused.value)


def test_everything_else_goes_to_the_sdk_transport_with_its_body() -> None:
    app, sdk, _ = _app()
    cases = [
        ({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}, {}),
        ({"jsonrpc": "2.0", "method": "notifications/initialized"}, {}),
        ([{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}], {}),  # a batch
        ({"jsonrpc": "2.0", "id": 1, "method": "resources/list"}, {}),
        ({"jsonrpc": "2.0", "id": True, "method": "tools/list"}, {}),  # an id that is not one
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"host": "evil.example:80"}),  # DNS rebinding
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"origin": "http://evil.example"}),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"accept": "text/event-stream"}),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"content-type": "text/plain"}),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"mcp-protocol-version": "1999-01-01"}),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"content-length": None}),  # chunked
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "result": {}}, {}),  # not a request alone
        ({"jsonrpc": "2.0", "id": 1.5, "method": "tools/list"}, {}),
        ({"jsonrpc": "1.0", "id": 1, "method": "tools/list"}, {}),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}, {}),  # no params: the SDK's refusal
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {}}}, {}),  # no name
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "no_such_tool"}}, {}),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/call",  # task-augmented
          "params": {"name": "list_inboxes", "task": {"ttl": 1000}}}, {}),
        ({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": []}, {}),
    ]
    for message, headers in cases:
        status, _ = _post(app, message, headers=headers)
        assert status == 299, (message, headers)
        assert sdk.bodies[-1] == json.dumps(message).encode(), (message, headers)
    # a path the SDK's router answers otherwise (a redirect) is its own too
    status, _ = _post(app, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, path="/mcp/")
    assert status == 299
    assert len(sdk.bodies) == len(cases) + 1


def test_the_fast_path_serves_only_a_stateless_json_server() -> None:
    """A server with sessions checks each request's session id in the SDK's transport: never bypassed."""
    server = build(Backend(McpConfig(database_url="host=/nonexistent dbname=none")), errors={}, stateless_http=False)
    with pytest.raises(ValueError, match="stateless"):
        _FastCalls(_Sdk(), server, "/mcp")
