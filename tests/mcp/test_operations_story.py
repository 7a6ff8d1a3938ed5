"""Every inbox operation, run over both of its faces from its one declaration (api/operations.py): the same
story on REST (`mailroom http serve`) and on MCP (`mailroom mcp --http-port`), each face with an inbox of
its own made by the table's create_mailbox, the arguments taken from the declaration by name. An
operation missing on a face, an argument a face does not take, or two faces answering differently
shaped documents fails it: an operation is reachable on both, or this test fails (issue 43, item 1)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from mcp_support import http_session, mailroom_env, wait_for_log

from mailroom.api import operations
from mailroom.api.operations import OPERATIONS

# the order of the story: what deletes comes last, the inbox itself at the very end
_LAST = ["delete_message", "delete_messages", "clear_messages", "delete_mailbox"]
STORY = sorted(OPERATIONS, key=lambda op: (_LAST.index(op.name) + 1 if op.name in _LAST else 0))
_GET_FAULT = STORY.pop(STORY.index(operations.BY_NAME["get_fault"]))  # after set_fault: 404 MR270 without one
STORY.insert(STORY.index(operations.BY_NAME["set_fault"]) + 1, _GET_FAULT)

RAW = (b"From: App <app@example.org>\r\nTo: you@example.org\r\nSubject: Hello there\r\n\r\n"
       b"Open https://app.example.org/activate?t=abc or type 48213.\r\n")


def _example(name: str, ids: list[int]) -> Any:
    if name == "message_id":  # the first message; delete_message takes the second, delete_messages the third
        return ids[0]
    if name == "message_ids":
        return [ids[2]]
    return {
        "ttl_minutes": 10, "limit": 10, "offset": 0, "after_id": 0, "is_read": True, "tags": ["story"],
        "ttl_seconds": 1800, "query": "hello", "timeout": 1, "stage": "rcpt", "reply": "451 4.7.1 Later", "share": 100,
    }.get(name)


def _deliver(db_url: str, address: str) -> list[int]:
    parsed = json.dumps({"subject": "Hello there", "from_header": "App <app@example.org>",
                         "text_body": "Open https://app.example.org/activate?t=abc or type 48213.\n"})
    with psycopg.connect(db_url, autocommit=True) as c:
        return [c.execute("SELECT mailroom.deliver_message(%s, %s, 'app@example.org', %s::jsonb)",
                          (address, RAW, parsed)).fetchone()[0] for _ in range(3)]


@pytest.fixture(scope="module")
def http_server(db_url, tmp_path_factory):
    """`mailroom http serve` beside the module's MCP server, on the same database (its port: `.port`)."""
    args = ("http", "serve", "--host", "127.0.0.1", "--port", "0")
    log_path = tmp_path_factory.mktemp("http") / "http.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "mailroom", *args], env=mailroom_env(db_url, args),
                                stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        port = int(wait_for_log(log_path, r"listening on 127\.0\.0\.1:(\d+)", proc, timeout=60).group(1))
        yield SimpleNamespace(port=port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _shape(value: Any) -> Any:
    if isinstance(value, dict):
        return sorted(value)
    if isinstance(value, list):
        return ["list", _shape(value[0]) if value else None]
    return type(value).__name__


def test_every_operation_on_both_faces(db_url, api_key, http_server, mcp_http):
    answers: dict[str, dict[str, Any]] = {"rest": {}, "mcp": {}}
    client = httpx.Client(base_url=f"http://127.0.0.1:{http_server.port}", timeout=30,
                          headers={"Authorization": f"Bearer {api_key}"})

    def rest(op: operations.Operation, values: dict[str, Any]) -> Any:
        path = op.rest.path
        query, body = {}, {}
        for a in op.args:
            if a.rest_name is None or a.name not in values:
                continue
            if f"{{{a.rest_name}}}" in path:
                path = path.replace(f"{{{a.rest_name}}}", quote(str(values[a.name]), safe="@"))
            elif a.body:
                body[a.rest_name] = values[a.name]
            elif values[a.name] is not None:
                query[a.rest_name] = values[a.name]
        answer = client.request(op.rest.method, path, params=query, json=body or None)
        assert answer.status_code == op.rest.status, (op.name, answer.status_code, answer.text)
        return answer.json()

    async def mcp(session: Any, op: operations.Operation, values: dict[str, Any]) -> Any:
        arguments = {a.mcp_name: values[a.name] for a in op.args if a.mcp_name and a.name in values}
        result = await session.call_tool(op.mcp.tool, arguments)
        assert not result.isError, (op.name, result.content[0].text)
        return json.loads(result.content[0].text)

    async def story() -> None:
        async with http_session(mcp_http.port, api_key) as session:
            for face in ("rest", "mcp"):
                ids: list[int] = []
                address = ""
                for op in STORY:
                    values = {a.name: _example(a.name, ids) for a in op.args if _example(a.name, ids) is not None}
                    if op.name == "delete_message":
                        values["message_id"] = ids[1]
                    if "address" in {a.name for a in op.args}:
                        values["address"] = address
                    answer = rest(op, values) if face == "rest" else await mcp(session, op, values)
                    answers[face][op.name] = answer
                    if op.name == "create_mailbox":
                        address = answer["address"]
                        ids = _deliver(db_url, address)

    asyncio.run(story())
    client.close()
    for op in STORY:
        rest_answer, mcp_answer = answers["rest"][op.name], answers["mcp"][op.name]
        if op.mcp.aliases or op.mcp.omit:
            mcp_answer = {k: v for k, v in mcp_answer.items() if k not in dict(op.mcp.aliases)}
            rest_answer = {k: v for k, v in rest_answer.items() if k not in op.mcp.omit}
        assert _shape(rest_answer) == _shape(mcp_answer), op.name
    # the answers are the operation's, not merely shaped alike: the same values where the inboxes agree
    assert answers["rest"]["extract_code"] == answers["mcp"]["extract_code"] == {"code": "48213"}
    assert answers["rest"]["extract_link"] == {"link": "https://app.example.org/activate?t=abc"}
    assert answers["rest"]["create_mailbox"]["owner_type"] == "api"
    assert answers["mcp"]["create_mailbox"]["owner_type"] == "mcp"
    assert answers["rest"]["delete_mailbox"] == answers["mcp"]["delete_mailbox"] == {"deleted": True}
    assert [len(answers[f]["list_messages"]) for f in ("rest", "mcp")] == [3, 3]
