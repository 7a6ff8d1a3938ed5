"""mailroom's own MCP server: expiring inboxes as tools and resources for AI agents (docs/mcp.md).

Thin like the HTTP face, and derived from the same declarations: every tool is an operation of
mailroom.api.operations (docs/inbox-api.md), and every tool call and resource read is ONE call of
its SQL function, the one REST calls, as role mailroom_http, in its own transaction with a
statement timeout, authorized by the sha256 digest of an API key (the key never reaches the
database). Two transports, one server: stdio (`mailroom mcp`: one agent, the key from
MAILROOM_MCP_API_KEY) and streamable HTTP (`mailroom mcp --http-port`: remote agents, each request
with `Authorization: Bearer mrk_…`).

`wait_for_message` is the HTTP face's long poll (mailroom.api.waits, docs/architecture.md "The
wait"): it holds no database connection while it waits, follows the inbox on the process's one LISTEN
(mailroom.db.hub.Hub), and the waits of one key, inbox, filter and cursor share one call
(`http_wait_look`) per wake-up; it ends at the inbox's expiry or deletion, is capped per key and in
total, and a call whose HTTP client is gone is dropped at once (CancelOnDisconnect).

Errors come back as MCP tool errors: `isError`, the text `<code>: <message>` and the structured
`{"error": {"code", "kind", "message"}}` of the REST API; the code and its kind are SQL's
(mailroom.core.errors.kind_of), never decided here. So are the errors each tool's description
lists: the codes its operation declares, with their meaning from mailroom.error_codes. Logs carry
no key, address or subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import psycopg
import psycopg.errors
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.tools import Tool
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, Resource, TextContent, ToolAnnotations
from pydantic import Field

from mailroom.api import edge, operations
from mailroom.api import sqlapi as api_sqlapi
from mailroom.api.waits import CancelOnDisconnect, LookSlots, Waits
from mailroom.core import fastpaths
from mailroom.core.credentials import key_digest
from mailroom.core.errors import Kind, describe_db_error, kind_of
from mailroom.core.log import get_logger
from mailroom.db.connect import alearn_vocabulary
from mailroom.db.hub import Hub
from mailroom.db.pool import NoConnection, async_pool, front_call

log = get_logger("mcp")

MAX_WAIT_SECONDS = 300
INSTRUCTIONS = (
    "Temporary email inboxes for signing up to services. create_inbox gives an address that expires "
    "(TTL in minutes); give it to the service, then wait_for_message until its mail arrives, then "
    "extract_link (an activation link) or extract_code (a one-time code), or read_message. delete_inbox "
    "when done. An error is a tool error whose text starts with its code; each tool's description lists "
    "the codes it may answer."
)

# a kind whose message is SQL's own and safe to show an agent; the others say what happened in general
_SHOWN_KINDS = {Kind.USAGE, Kind.NOT_FOUND, Kind.GONE, Kind.LIMIT, Kind.CONFLICT, Kind.DENIED}


@dataclass
class McpConfig:
    database_url: str
    listen_url: str | None = None
    pool_size: int = 4
    poll_interval: float = 2.0
    statement_timeout: float = 5.0
    pool_timeout: float = 3.0  # seconds a call waits for a pooled connection before "unavailable"
    metrics_port: int | None = None  # Prometheus on 127.0.0.1 (the waits: mailroom.api.waits), None: off


class ToolFailure(Exception):
    """A refusal or failure as the agent sees it: the SQLSTATE (an MR code where SQL raised one), its kind, a message."""

    def __init__(self, code: str, kind: str, message: str) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.kind = kind
        self.message = message

    def result(self) -> CallToolResult:
        return CallToolResult(
            content=[TextContent(type="text", text=str(self))],
            structuredContent={"error": {"code": self.code, "kind": self.kind, "message": self.message}},
            isError=True,
        )


def db_failure(exc: psycopg.Error) -> ToolFailure:
    kind = kind_of(exc)
    code = exc.sqlstate or ""
    if isinstance(exc, psycopg.errors.QueryCanceled):
        message = "the call was cancelled: it took longer than the statement timeout, try again"
    elif kind in _SHOWN_KINDS:
        message = exc.diag.message_primary or "refused"
        if code and exc.diag.message_detail and exc.diag.message_detail.isdigit():
            message += f" (retry in {exc.diag.message_detail}s)"  # MR243: the seconds until its window ends
    elif kind in (Kind.UNAVAILABLE, Kind.UPGRADING):
        log.warning("database unavailable: %s", describe_db_error(exc))
        message = "the database is unavailable, try again"
    else:
        log.error("database error: %s", describe_db_error(exc))
        message = "internal error"
    return ToolFailure(code, kind.value, message)


def header_credential(headers: Any) -> str | None:
    """The API key of an HTTP request: `Authorization: Bearer …`, or `X-API-Key`."""
    auth = headers.get("authorization") or ""
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return (headers.get("x-api-key") or "").strip() or None


class Backend:
    """A server process's connection pool and LISTEN hub; `call` is the one way to SQL."""

    def __init__(self, config: McpConfig) -> None:
        self.config = config
        self.pool = async_pool(config.database_url, max_size=config.pool_size, application_name="mailroom-mcp",
                               configure=alearn_vocabulary)
        self.hub = Hub(config.listen_url, poll_interval=config.poll_interval)
        # the process's waits (mailroom.api.waits, as the HTTP face's): capped, one look a group
        self.waits = Waits(self.hub, caps=self._wait_caps, refuse=self._wait_refused)
        self.look_slots = LookSlots(config.pool_size)  # the waits' looks: half the pool (api/waits.py)

    async def _wait_caps(self) -> dict[str, tuple[int, int, int]]:
        async def run(conn: psycopg.AsyncConnection) -> Any:
            return await api_sqlapi.wait_caps.arows(conn)

        rows = await self._front(run)
        return {row.kind: (row.per_credential, row.total, row.per_client) for row in rows}

    async def _wait_refused(self, kind: str, scope: str) -> None:
        await self.call(api_sqlapi.wait_refused, kind=kind, scope=scope)  # raises SQL's MR251/MR252/MR253

    async def open(self) -> None:
        await self.pool.open(wait=False)
        self.hub.start()

    async def close(self) -> None:
        await self.hub.stop()
        await self.pool.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Backend]:
        await self.open()
        try:
            yield self
        finally:
            await self.close()

    async def call(self, fn: Any, *, retry: bool = True, **kwargs: Any) -> Any:
        """One SQL call in its own transaction, under the statement timeout (mailroom.db.pool.
        bounded_transaction: SET LOCAL, or the session's own on a direct connection), with the HTTP
        face's rules (docs/architecture.md, "Faults at the front ends"): a pooled connection found
        ended before anything was sent is replaced; nothing else is retried, so a statement the server
        cancelled or terminated is answered, never run again; no connection within the pool timeout
        is unavailability. `retry` is kept for callers."""
        del retry

        async def run(conn: psycopg.AsyncConnection) -> Any:
            return await fn.avalue(conn, **kwargs)

        return await self._front(run)

    async def _front(self, run: Callable[[psycopg.AsyncConnection], Any]) -> Any:
        try:
            return await front_call(self.pool, run, pool_timeout=self.config.pool_timeout,
                                    statement_timeout=self.config.statement_timeout)
        except (TimeoutError, NoConnection):
            raise ToolFailure("", Kind.UNAVAILABLE.value, "the database is unavailable, try again") from None
        except psycopg.Error as exc:
            raise db_failure(exc) from None


def _ok(doc: Any) -> CallToolResult:
    """A tool's answer: the JSON as text (what every client shows the model) and, for an object, as
    structured content too."""
    return CallToolResult(
        content=[TextContent(type="text", text=json.dumps(doc, default=str))],
        structuredContent=doc if isinstance(doc, dict) else None,
    )


async def _tool(work: Callable[[], Any]) -> CallToolResult:
    try:
        return _ok(await work())
    except ToolFailure as failure:
        return failure.result()




_TEMPLATE_ERROR = "Error creating resource from template: "


class MailroomMCP(FastMCP):
    """FastMCP whose resource list names the caller's open inboxes too (one SQL call), and whose
    resource errors are the failure's own words (the SDK prefixes a template's error twice)."""

    backend: Backend
    credential: Callable[[Context], bytes | None]
    fast_tools: dict[str, Tool]  # the tools given to the constructor, by name: what _FastCalls runs

    async def read_resource(self, uri: Any) -> Any:
        try:
            return await super().read_resource(uri)
        except ValueError as exc:
            message = str(exc)
            while message.startswith(_TEMPLATE_ERROR):
                message = message[len(_TEMPLATE_ERROR):]
            raise ValueError(message) from None

    async def list_resources(self) -> list[Resource]:
        resources = await super().list_resources()
        try:
            inboxes = await self.backend.call(operations.BY_NAME["list_mailboxes"].sql,
                                              key_digest=self.credential(self.get_context()))
        except ToolFailure as failure:
            raise ValueError(str(failure)) from None
        return resources + [
            Resource(uri=f"mailroom://inbox/{box['address']}", name=f"inbox {box['address']}",
                     description=f"inbox expiring at {box['expires_at']}: its newest messages",
                     mimeType="application/json")
            for box in inboxes
        ]


def error_catalog(database_url: str) -> dict[str, str]:
    """Every MR code's meaning in MCP's words (face_error_meanings), read once at start for the tool
    descriptions, which list the codes of their operation's SQL function (api/operations.py)."""
    from mailroom.db.connect import connect

    with connect(database_url, application_name="mailroom-mcp") as conn:
        return {row.code: row.meaning for row in api_sqlapi.face_error_meanings.rows(conn, face="mcp")}


def _signature(op: operations.Operation, overrides: dict[str, dict[str, Any]] | None = None) -> inspect.Signature:
    """A tool function's signature from its operation's MCP arguments: names, types, defaults, and each one's
    description and bounds (pydantic Field), which the SDK turns into the tool's input schema and checks
    every call against. `overrides`: per argument, MCP's own `le` or `doc`. First the call's Context (`ctx`,
    FastMCP's injection, left out of the schema): the request whose credential the call carries."""
    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
    for a in op.args:
        if a.mcp_name is None:
            continue
        more = (overrides or {}).get(a.name, {})
        kind = a.type if a.required or a.default is not None else a.type | None
        field = Field(description=more.get("doc", a.doc), ge=a.ge, le=more.get("le", a.le))
        params.append(inspect.Parameter(a.mcp_name, inspect.Parameter.KEYWORD_ONLY, annotation=Annotated[kind, field],
                                        default=inspect.Parameter.empty if a.required else a.default))
    return inspect.Signature(params, return_annotation=CallToolResult)


def _generic_tool(op: operations.Operation, call: Callable[..., Any], who: Callable[[Context], bytes | None]) -> Any:
    """The tool function of an operation: its MCP arguments (names, types, bounds, descriptions) from the
    declaration as its signature, which the SDK reads for the input schema and validates each call by;
    one SQL call, the operation's, with the API key's digest (`who` reads it from the call's Context);
    the answer as the operation gives it to MCP."""
    assert op.mcp is not None
    signature = _signature(op)
    by_mcp = {a.mcp_name: a.name for a in op.args if a.mcp_name is not None}
    inbox = op.who == operations.INBOX

    async def tool(ctx: Context, **given: Any) -> CallToolResult:
        values = {by_mcp[name]: value for name, value in given.items()}
        digest = who(ctx)
        if inbox:
            values["session_token"] = None  # MCP knows only API keys

        async def work() -> Any:
            value = await call(op.sql, retry=op.mcp.read_only, key_digest=digest,
                               **operations.sql_arguments(op, "mcp", values))
            return operations.answer(op, "mcp", value)

        return await _tool(work)

    tool.__signature__ = signature  # type: ignore[attr-defined]
    tool.__name__ = op.mcp.tool
    tool.__doc__ = op.mcp.description
    return tool


def request_credential(ctx: Context) -> bytes | None:
    """The API key's digest of an HTTP call: the key of the request in its Context (`Authorization: Bearer
    …` or `X-API-Key`), as the SDK's transport gives it to a tool or resource, and as _FastCalls gives it."""
    request = ctx.request_context.request
    return key_digest(header_credential(request.headers)) if request is not None else None


def request_client(ctx: Context) -> str | None:
    """The address of an HTTP call's client (its waits' per-client cap: wait.max_per_client), from the
    request in its Context; None without one."""
    request = ctx.request_context.request
    return request.client.host if request is not None and request.client is not None else None


def build(backend: Backend, credential: Callable[[Context], bytes | None] | None = None, *, host: str = "127.0.0.1",
          stateless_http: bool = True, errors: dict[str, list[tuple[str, str]]] | None = None) -> MailroomMCP:
    """The MCP server: its tools and resources over `backend`. `credential` gives the API key's digest
    of the call being served from its Context, the one source of it (stdio: the key of the environment);
    by default it is read from the HTTP request in the Context (request_credential); `errors`
    (error_catalog) the codes each tool's description lists."""
    import logging

    # the SDK logs a line per request at INFO (no key, address or subject in them, but noise); "mcp"
    # itself is this module's logger
    for name in ("mcp.server", "mcp.shared"):
        logging.getLogger(name).setLevel(logging.WARNING)
    loopback = host in ("127.0.0.1", "localhost", "::1")
    who = credential or request_credential
    meanings = errors or {}

    def describe(op: operations.Operation) -> str:
        """A tool's description: its operation's, and the errors it may answer with their meaning."""
        assert op.mcp is not None
        known = [f"{code} {meanings[code]}" for code in op.errors if code in meanings]
        return op.mcp.description + ("\nErrors: " + "; ".join(known) + "." if known else "")

    def annotations(op: operations.Operation) -> ToolAnnotations:
        assert op.mcp is not None
        return ToolAnnotations(readOnlyHint=op.mcp.read_only, destructiveHint=op.mcp.destructive,
                               idempotentHint=op.mcp.idempotent, openWorldHint=False)

    def tool(fn: Callable[..., Any], op: operations.Operation) -> Tool:
        # FastMCP's own registration (what server.tool() makes), given to its constructor: the tools
        # _FastCalls runs are the very objects the SDK's transport runs; `ctx` is the call's Context
        assert op.mcp is not None
        return Tool.from_function(fn, name=op.mcp.tool, description=describe(op), annotations=annotations(op),
                                  context_kwarg="ctx", structured_output=False)

    call = backend.call
    # every tool of an operation declared generic: built from its declaration (api/operations.py)
    tools = [tool(_generic_tool(op, call, who), op) for op in operations.OPERATIONS if op.mcp is not None and op.mcp.generic]

    wait_op = operations.BY_TOOL["wait_for_message"]

    async def wait_for_message(ctx: Context, address: str, subject_like: str | None = None,
                               timeout_seconds: float = 60, after_id: int | None = None) -> CallToolResult:
        digest = who(ctx)
        # counted per client address too over HTTP; stdio (a credential given) is one agent: not counted
        client = request_client(ctx) if credential is None else None
        return await _tool(lambda: _wait(backend, address, digest, subject_like, timeout_seconds, after_id,
                                         client))

    # its schema from the declaration too, but for MCP's own bound on the timeout (300 s, REST's 600)
    wait_for_message.__signature__ = _signature(wait_op, {"timeout": {"le": MAX_WAIT_SECONDS, "doc": (  # type: ignore[attr-defined]
        f"How long to wait, 0 to {MAX_WAIT_SECONDS} seconds.")}})
    # the one tool written by hand (the one wait, api/waits.py): its arguments are checked against its
    # declaration by tests/test_operations.py
    tools.append(tool(wait_for_message, wait_op))

    server = MailroomMCP(
        name="mailroom", instructions=INSTRUCTIONS, log_level="WARNING", host=host, stateless_http=stateless_http,
        tools=tools,
        # a tool's answer as one JSON body, not a one-event SSE stream: stateless calls send no
        # notifications, and the stream's tasks cost about a quarter of the call's overhead (docs/mcp.md)
        json_response=True,
        # a browser page must not reach a server on this machine through a rebound DNS name; behind a
        # real host name the API key is what guards it
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=loopback,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"] if loopback else [],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"] if loopback else [],
        ),
    )
    from mailroom import __version__

    # serverInfo.version: mailroom's, not the SDK's. FastMCP takes no version (its low-level server does):
    # the one reach into FastMCP's private attribute, guarded by tests/test_private_internals.py. With it
    # set, the SDK's per-request initialization options read no package metadata either.
    server._mcp_server.version = __version__  # noqa: SLF001
    server.backend = backend
    server.credential = who
    server.fast_tools = {t.name: t for t in tools}

    async def resource(fn: Any, **kwargs: Any) -> str:
        try:
            return json.dumps(await call(fn, key_digest=who(server.get_context()), **kwargs), default=str)
        except ToolFailure as failure:
            raise ValueError(str(failure)) from None

    @server.resource("mailroom://inboxes", name="inboxes", mime_type="application/json",
                     description="This API key's open inboxes, newest first (as list_inboxes).")
    async def inboxes_resource() -> str:
        return await resource(operations.BY_NAME["list_mailboxes"].sql)

    @server.resource("mailroom://inbox/{address}", name="inbox", mime_type="application/json",
                     description="An inbox and its 50 newest messages, without bodies (as list_messages).")
    async def inbox_resource(address: str) -> str:
        return await resource(api_sqlapi.http_mailbox_view, address=address, session_token=None, limit=50)

    @server.resource("mailroom://inbox/{address}/message/{message_id}", name="message", mime_type="application/json",
                     description="One message with its text, HTML, link and code (as read_message: marks it read).")
    async def message_resource(address: str, message_id: str) -> str:
        if not message_id.isdigit():
            raise ValueError("22023: a message id is a number")
        op = operations.BY_NAME["read_message"]
        doc = json.loads(await resource(op.sql, address=address, session_token=None, message_id=int(message_id)))
        return json.dumps(operations.answer(op, "mcp", doc), default=str)

    return server


async def _wait(backend: Backend, address: str, digest: bytes | None, subject_like: str | None,
                timeout: float, after_id: int | None = None, client: str | None = None) -> dict[str, Any]:
    """The REST API's long poll, for one agent (mailroom.api.waits: the same look, http_wait_look, shared
    by the waits of one key, inbox, filter and cursor, one per wake-up of the inbox's LISTEN, never past
    its expiry; capped per key and in total; no connection held between looks)."""

    async def look(last: bool) -> dict[str, Any]:
        # at most half the pool at once (LookSlots): a burst of waits never queues other calls behind it
        return await backend.look_slots.run(lambda: backend.call(
            api_sqlapi.http_wait_look, address=address, session_token=None, key_digest=digest,
            subject_like=subject_like, after_id=after_id, last=last))

    return await backend.waits.wait(credential=digest or b"", client=client, key=(subject_like, after_id), look=look,
                                    timeout=min(max(timeout, 0.0), MAX_WAIT_SECONDS))


def _serve_metrics(config: McpConfig, backend: Backend) -> None:
    """--metrics-port: the worker's standard gauges and the process's waits, on 127.0.0.1."""
    if config.metrics_port is None:
        return
    from mailroom.core.metrics import WorkerMetrics

    metrics = WorkerMetrics("mcp")
    backend.waits.register(metrics.registry)
    metrics.start(config.metrics_port, "127.0.0.1", log)


# -- the two transports ---------------------------------------------------------------------------


def check_key(database_url: str, digest: bytes | None, source: str) -> None:
    """stdio's one key judged by SQL before serving: a key SQL refuses is a ConfigError (exit 2), not
    a server that fails at its first tool call. `source` names where the key came from."""
    from mailroom.core.errors import ConfigError
    from mailroom.db.connect import connect

    with connect(database_url, application_name="mailroom-mcp") as conn:
        try:
            operations.BY_NAME["list_mailboxes"].sql.value(conn, key_digest=digest)
        except psycopg.Error as exc:
            if kind_of(exc) is not Kind.DENIED:
                raise
            raise ConfigError(f"{source}: {exc.diag.message_primary} ({exc.sqlstate})") from None


def run_stdio(config: McpConfig, api_key: str, key_source: str = "the API key") -> None:
    """Serve one agent on stdin/stdout with the key of the environment (its digest only goes to SQL)."""
    digest = key_digest(api_key)
    errors = error_catalog(config.database_url)
    check_key(config.database_url, digest, key_source)

    async def main() -> None:
        backend = Backend(config)
        server = build(backend, lambda ctx: digest, errors=errors)
        _serve_metrics(config, backend)
        async with backend.running():
            log.info("serving MCP on stdio (pid %d, pool %d, LISTEN %s)", os.getpid(), config.pool_size,
                     "on" if config.listen_url else "off (polling)")
            await server.run_stdio_async()

    asyncio.run(main())


class _RequireKey:
    """Pure ASGI middleware: an HTTP request without any API key is refused before the transport (401 and
    WWW-Authenticate) with the code and words SQL gives a call without a key (_mcp_key's: asked
    once, then kept; no database, no code); a key that is there is SQL's to judge."""

    def __init__(self, app: Any, path: str, backend: Backend | None = None) -> None:
        self.app = app
        self.path = path
        self.backend = backend
        self.refusal: ToolFailure | None = None

    async def _no_key(self) -> ToolFailure:
        # the code and words SQL gives MCP's call without a key (create_inbox's: _mcp_key, before anything
        # is made), asked once, then kept
        if self.refusal is None and self.backend is not None:
            op = operations.BY_NAME["create_mailbox"]
            try:
                await self.backend.call(op.sql, retry=False, key_digest=None, **op.fixed["mcp"])
            except ToolFailure as failure:
                if failure.code:
                    self.refusal = failure
        return self.refusal or ToolFailure("", Kind.DENIED.value, "an API key is required: Authorization: Bearer mrk_…")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") == self.path:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            if header_credential(headers) is None:
                failure = await self._no_key()
                error = {"code": failure.code, "kind": failure.kind, "message": failure.message}
                body = json.dumps({"detail": failure.message, "error": error}).encode()
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b'Bearer realm="mailroom"'),
                    (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


_FAST_BODY_MAX = 1024 * 1024
_JSONRPC_KEYS = frozenset({"jsonrpc", "id", "method", "params"})


class _FastCalls:
    """Pure ASGI: a small stateless JSON-RPC endpoint for the two requests an agent makes all the time,
    `tools/call` and `tools/list`, on the SDK's public API only (no private name of it): the request read
    with `mcp.types` (JSONRPCRequest, CallToolRequestParams, PaginatedRequestParams), the tools FastMCP
    was given (`server.fast_tools`, the Tool objects of its constructor: their own argument validation and
    result conversion, `Tool.run`) and `FastMCP.list_tools()`, the answer a `JSONRPCResponse` or
    `JSONRPCError` built as the low-level server and its session build theirs. It saves the SDK's
    per-request ServerSession, memory streams and task group (about 3 ms of CPU a call, docs/mcp.md).

    The transport's checks come first, by its own rules (TransportSecurityMiddleware's DNS rebinding and
    Content-Type check, Accept, Content-Type, MCP-Protocol-Version against SUPPORTED_PROTOCOL_VERSIONS);
    anything else goes to the SDK's app with the body as read, so its answer is the SDK's own: a check
    that fails, initialize, notifications, batches, resources, a GET or DELETE, a body of unknown length,
    a request the SDK's models refuse, an unknown tool, task-augmented calls.

    The call's credential is its request, given to the tool as the SDK gives it: in the Context FastMCP
    injects (`ctx.request_context.request`), the one place tools and resources read it from."""

    def __init__(self, app: Any, server: MailroomMCP, path: str) -> None:
        from mcp.server.transport_security import TransportSecurityMiddleware
        from mcp.shared.version import SUPPORTED_PROTOCOL_VERSIONS

        if not (server.settings.stateless_http and server.settings.json_response):
            # a session's requests carry its id, which the SDK checks; an SSE answer is a stream
            raise ValueError("the fast path serves a stateless server answering JSON only")
        self.app = app
        self.server = server
        self.path = path
        self.security = TransportSecurityMiddleware(server.settings.transport_security)
        self.versions = frozenset(SUPPORTED_PROTOCOL_VERSIONS)
        # a tool with an output schema is validated against it by the low-level server: the SDK's to answer
        self.tools = {name: t for name, t in server.fast_tools.items() if t.output_schema is None}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        from starlette.requests import Request

        request = Request(scope, receive)
        headers = request.headers
        accept = [part.strip() for part in headers.get("accept", "").split(",")]
        content_type = [part.strip() for part in headers.get("content-type", "").split(";")[0].split(",")]
        version = headers.get("mcp-protocol-version")
        declared = headers.get("content-length")
        if (not any(part.startswith("application/json") for part in accept)  # json_response: JSON alone
                or "application/json" not in content_type
                or (version is not None and version not in self.versions)  # none: the default, supported
                or declared is None or not declared.isdigit() or int(declared) > _FAST_BODY_MAX
                or await self.security.validate_request(request, is_post=True) is not None):
            await self.app(scope, receive, send)  # the SDK answers (or refuses) it as it does
            return
        body = await request.body()
        answer = await self._answer(body, request)
        if answer is None:
            await self.app(scope, edge.replay(body, receive), send)
            return
        fastpaths.hit("mcp.fast_calls")
        data = answer.model_dump_json(by_alias=True, exclude_none=True).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    async def _answer(self, body: bytes, request: Any) -> Any:
        """The JSONRPCResponse or JSONRPCError of a request this endpoint serves, else None (the SDK's)."""
        from mcp import types
        from mcp.shared.context import RequestContext
        from mcp.shared.exceptions import McpError
        from pydantic import ValidationError

        try:
            raw = json.loads(body)
            if not isinstance(raw, dict) or not raw.keys() <= _JSONRPC_KEYS:
                return None
            message = types.JSONRPCRequest.model_validate(raw)
            if message.method == "tools/list":
                params: Any = types.PaginatedRequestParams.model_validate(message.params or {})
            elif message.method == "tools/call" and message.params is not None:
                params = types.CallToolRequestParams.model_validate(message.params)
            else:
                return None
        except (ValueError, ValidationError):
            return None
        if params.task is not None:
            return None  # task-augmented execution: the SDK's
        if message.method == "tools/list":
            result: Any = types.ListToolsResult(tools=await self.server.list_tools())
        else:
            tool = self.tools.get(params.name)
            if tool is None:
                return None
            # the Context FastMCP.call_tool would give the tool, with this request in it
            ctx = Context(request_context=RequestContext(request_id=message.id, meta=params.meta, session=None,
                                                         lifespan_context=None, request=request),
                          fastmcp=self.server)
            try:
                result = _call_result(await tool.run(params.arguments or {}, context=ctx, convert_result=True))
            except McpError as err:  # as the low-level server's request loop answers it
                return types.JSONRPCError(jsonrpc="2.0", id=message.id, error=err.error)
            except Exception as exc:  # noqa: BLE001 - the low-level handler's: any failure is a tool error
                result = CallToolResult(content=[TextContent(type="text", text=str(exc))], isError=True)
        return types.JSONRPCResponse(jsonrpc="2.0", id=message.id,
                                     result=result.model_dump(by_alias=True, mode="json", exclude_none=True))


def _call_result(results: Any) -> CallToolResult:
    """A tool's converted result (`Tool.run(…, convert_result=True)`) as the low-level server's call_tool
    handler makes it a CallToolResult: as it is, or content and structured content (a pair), or structured
    content with its JSON as text (a dict), or content alone (an iterable of content blocks)."""
    if isinstance(results, CallToolResult):
        return results
    if isinstance(results, tuple) and len(results) == 2:
        content, structured = results
    elif isinstance(results, dict):
        content, structured = [TextContent(type="text", text=json.dumps(results, indent=2))], results
    else:
        content, structured = results, None
    return CallToolResult(content=list(content), structuredContent=structured, isError=False)


def http_app(config: McpConfig, *, host: str, fast: bool | None = None) -> Any:
    """The ASGI app of `mailroom mcp --http-port`: the streamable HTTP transport at /mcp, stateless
    (any request may reach any process), behind the key check; its lifespan opens the pool and LISTEN.
    `fast`: whether _FastCalls answers tools/call and tools/list (default: the fast paths' switch)."""
    backend = Backend(config)
    server = build(backend, host=host, errors=error_catalog(config.database_url))
    app = server.streamable_http_app()
    _serve_metrics(config, backend)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        async with backend.running(), server.session_manager.run():
            log.info("serving (pid %d, pool %d, LISTEN %s)", os.getpid(), config.pool_size,
                     "on" if config.listen_url else "off (polling)")
            yield

    app.router.lifespan_context = lifespan
    path = server.settings.streamable_http_path
    if fastpaths.enabled() if fast is None else fast:  # MAILROOM_FAST_PATHS=off: every request the SDK's
        app = _FastCalls(app, server, path)
    app = CancelOnDisconnect(app, path)  # a call whose client went is cancelled (its wait leaves at once)
    # the edge first (mailroom.api.edge): the body bounded and its nesting checked before the key check
    return edge.Edge(_RequireKey(app, path, backend), refusals=edge.Refusals(backend))


def run_http(config: McpConfig, *, host: str, port: int) -> None:
    """Serve remote agents over streamable HTTP on host:port (one socket bound here, so `--http-port 0`
    logs the port it got)."""
    import logging

    import uvicorn

    from mailroom.core.sockets import listening_socket

    sock = listening_socket(host, port)
    log.info("listening on %s:%d (MCP streamable HTTP at /mcp)", host, sock.getsockname()[1])
    logging.getLogger("uvicorn.access").disabled = True  # its lines would carry nothing useful, ours none
    app = http_app(config, host=host)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                           timeout_graceful_shutdown=5, server_header=False))
    server.run(sockets=[sock])  # on uvloop when it is installed (uvicorn's loop="auto"), as `http serve`
