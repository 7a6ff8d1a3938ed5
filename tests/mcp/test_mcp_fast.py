"""The stateless JSON fast path of `mailroom mcp --http-port` (mailroom.mcp.server._FastCalls): which
requests it answers itself with the SDK's own handlers, and which it hands to the SDK's transport
(with the body as it read it). In process, no database: tools/list and a refused argument make no call."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from mcp.server.transport_security import TransportSecuritySettings

from mailroom.mcp.server import Backend, McpConfig, _FastCalls, build

SECURITY = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=["127.0.0.1:*"],
                                     allowed_origins=["http://127.0.0.1:*"])


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


def _post(app: Any, message: Any, *, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    body = json.dumps(message).encode()
    fields = {"host": "127.0.0.1:8000", "accept": "application/json, text/event-stream",
              "content-type": "application/json", "content-length": str(len(body)), "authorization": "Bearer mrk_x",
              **(headers or {})}
    scope = {"type": "http", "method": "POST", "path": "/mcp", "raw_path": b"/mcp", "query_string": b"",
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
    server = build(Backend(McpConfig(database_url="host=/nonexistent dbname=none")), errors={})
    sdk = _Sdk()
    return _FastCalls(sdk, server, "/mcp", SECURITY), sdk, server


def test_tools_list_and_a_refused_argument_are_answered_without_the_sdk_transport() -> None:
    app, sdk, server = _app()
    status, answer = _post(app, {"jsonrpc": "2.0", "id": 7, "method": "tools/list"})
    assert status == 200 and answer["id"] == 7 and sdk.bodies == []
    expected = asyncio.run(server.list_tools())
    assert [t["name"] for t in answer["result"]["tools"]] == [t.name for t in expected]
    assert answer["result"]["tools"][0]["inputSchema"] == expected[0].inputSchema
    # the SDK's own argument validation (FastMCP's, through the low-level handler), before any SQL call
    status, answer = _post(app, {"jsonrpc": "2.0", "id": "a", "method": "tools/call",
                                 "params": {"name": "list_messages", "arguments": {"address": "x@y", "limit": 0}}})
    assert status == 200 and answer["id"] == "a" and sdk.bodies == []
    assert answer["result"]["isError"] is True
    assert "validation error" in answer["result"]["content"][0]["text"] and "limit" in answer["result"]["content"][0]["text"]
    # an unknown tool: the SDK's answer too
    status, answer = _post(app, {"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                                 "params": {"name": "no_such_tool", "arguments": {}}})
    assert answer["result"]["isError"] is True and "no_such_tool" in answer["result"]["content"][0]["text"]


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
    ]
    for message, headers in cases:
        status, _ = _post(app, message, headers=headers)
        assert status == 299, (message, headers)
        assert sdk.bodies[-1] == json.dumps(message).encode(), (message, headers)
    assert len(sdk.bodies) == len(cases)
