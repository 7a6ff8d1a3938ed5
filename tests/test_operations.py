"""The inbox API is declared once (driver/mailroom/api/operations.py): every face is derived from the
declaration or checked against it here, without a database.

- docs/inbox-api.md is the table's generated page, byte for byte;
- every REST route of an operation has the declared method and path; one written by hand takes exactly
  the declared query parameters (a route built from its declaration cannot differ);
- every MCP tool of an operation takes exactly the declared arguments, with their bounds;
- every operation is on both faces, and every code it declares is in mailroom's error vocabulary.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from fastapi.routing import APIRoute

from mailroom.api import operations
from mailroom.api.operations import OPERATIONS

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_page_is_the_table():
    page = (ROOT / "docs" / "inbox-api.md").read_text()
    assert page == operations.markdown(), "run: python -m mailroom.api.operations > docs/inbox-api.md"


def test_every_operation_is_on_both_faces():
    assert [op.name for op in OPERATIONS if op.rest is None or op.mcp is None] == []
    assert len({op.mcp.tool for op in OPERATIONS if op.mcp}) == len(OPERATIONS)
    assert len({(op.rest.method, op.rest.path) for op in OPERATIONS if op.rest}) == len(OPERATIONS)


def test_every_declared_code_is_in_the_vocabulary():
    known = set(re.findall(r"'(MR\d{3})',\s*'[a-z]+',", "".join(p.read_text() for p in (ROOT / "migrations").glob("*.sql"))))
    for op in OPERATIONS:
        # read from the Errors: list of its SQL function's COMMENT; every operation names its credentials'
        assert {"MR240", "MR241"} <= set(op.errors), op.name
        assert set(op.errors) <= known, (op.name, set(op.errors) - known)


def test_every_argument_is_an_argument_of_its_sql_function():
    for op in OPERATIONS:
        sql_names = {p.name for p in op.sql.params}
        declared = {a.name for a in op.args if a.sql} | set().union(*(set(v) for v in op.fixed.values()))
        assert declared <= sql_names, (op.name, declared - sql_names)
        who = {"address", "session_token", "key_digest"} if op.who == operations.INBOX else {"key_digest"}
        if op.name == "create_mailbox":
            who = {"key_digest", "client"}
        # every SQL argument without a default is given by the face: declared, or the credential
        required = {p.name for p in op.sql.params if not p.optional}
        assert required <= declared | who, (op.name, required - declared - who)


@pytest.fixture(scope="module")
def app():
    from mailroom.http.app import create_app
    from mailroom.http.state import HttpConfig

    return create_app(HttpConfig(database_url="postgresql://nowhere/none"))


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.rest], ids=lambda op: op.name)
def test_the_rest_route_is_the_declared_one(app, op):
    routes = [r for r in app.router.routes if isinstance(r, APIRoute) and r.path == op.rest.path
              and op.rest.method in r.methods]
    assert len(routes) == 1, f"{op.rest.method} {op.rest.path}"
    route = routes[0]
    assert route.summary == op.rest.summary and route.status_code in (None, op.rest.status)
    path = {p.name for p in route.dependant.path_params}
    query = {p.name for p in route.dependant.query_params}
    declared_path = {a.rest_name for a in op.args if f"{{{a.rest_name}}}" in op.rest.path}
    declared_query = {a.rest_name for a in op.args if a.rest_name and not a.body} - declared_path
    assert path == declared_path
    assert query == declared_query, f"{op.name}: the route's query parameters differ from the declaration"


@pytest.fixture(scope="module")
def tools():
    from mailroom.mcp.server import Backend, McpConfig, build

    server = build(Backend(McpConfig(database_url="postgresql://nowhere/none")), lambda ctx: b"key", errors={})
    return {t.name: t for t in asyncio.run(server.list_tools())}


@pytest.mark.parametrize("op", [op for op in OPERATIONS if op.mcp], ids=lambda op: op.name)
def test_the_mcp_tool_is_the_declared_one(tools, op):
    tool = tools[op.mcp.tool]
    schema = tool.inputSchema["properties"]
    assert set(schema) == {a.mcp_name for a in op.args if a.mcp_name}
    assert set(tool.inputSchema.get("required", [])) == {a.mcp_name for a in op.args if a.mcp_name and a.required}
    for a in op.args:
        if a.mcp_name is None:
            continue
        prop = schema[a.mcp_name]
        variants = prop.get("anyOf", [prop])
        if a.ge is not None:
            assert any(v.get("minimum") == a.ge for v in variants), (a.name, prop)
        if a.le is not None and op.mcp.generic:
            assert any(v.get("maximum") == a.le for v in variants), (a.name, prop)
        assert prop["description"] == a.doc or not op.mcp.generic
    assert tool.description.startswith(op.mcp.description)
    assert (tool.annotations.readOnlyHint, tool.annotations.destructiveHint) == (op.mcp.read_only, op.mcp.destructive)


def test_no_other_tools(tools):
    assert set(tools) == {op.mcp.tool for op in OPERATIONS if op.mcp}
