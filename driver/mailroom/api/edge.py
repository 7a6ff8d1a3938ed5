"""The edge of the HTTP faces (issue 43, item 3): every request of `mailroom http serve` (REST, the page,
the hooks) and of `mailroom mcp --http-port` passes it first, before any route, credential check or
body parse, and is refused here when

- its body is over its route's bound (BODY_BOUNDS, the one table of them): a declared Content-Length
  over it is refused before a byte of the body is read; a body without one (chunked) is counted as
  it streams and cut at the bound (413);
- its path or query holds a NUL (`%00`), or is not UTF-8 once percent-decoded (400): no text of
  PostgreSQL can hold either, and SQL never sees them;
- its JSON body nests deeper than JSON_DEPTH or holds a `\\u0000` (400): a linear scan before any
  `json.loads` (whose recursion would end in RecursionError); a form body is checked for NUL and UTF-8.

The edge decides; SQL words the refusal: `mailroom.edge_refusal` (sql/04_edge.sql) raises its MR code
and message, whose row of mailroom.error_codes gives the HTTP status (asked once per process and
refusal, then kept). Without a database the edge still refuses, with the status below and no code.
Pure ASGI (public interface only); the answer is the REST ErrorResponse (`detail` and `error`), or
what the face renders for it (the page's HTML).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

import psycopg
from starlette.responses import JSONResponse, Response

from mailroom.api.errors import ApiError, db_error, error_body
from mailroom.db import sqlapi
from mailroom.db.pool import NoConnection, front_call

JSON_DEPTH = 64  # arrays and objects, one inside another: no body of either face needs more than 8


@dataclass(frozen=True)
class BodyBound:
    """A route's body: its method, its path (a regular expression the whole path matches), its bound
    in bytes and its shape (json: nesting and NUL scanned; form: NUL and UTF-8 checked; raw: counted)."""

    method: str
    path: str
    max_bytes: int
    shape: str


_SEG = "[^/]+"
KIB = 1024
# Every route that reads a body. Any other request's body is read by no route: DEFAULT_BOUND.
BODY_BOUNDS: tuple[BodyBound, ...] = (
    BodyBound("POST", "/api/v1/mailboxes", 16 * KIB, "json"),
    BodyBound("POST", f"/api/v1/mailboxes/{_SEG}/messages/delete", 64 * KIB, "json"),
    BodyBound("POST", f"/api/v1/mailboxes/{_SEG}/extend", 16 * KIB, "json"),
    BodyBound("PATCH", f"/api/v1/mailboxes/{_SEG}/messages/{_SEG}", 16 * KIB, "json"),
    BodyBound("PUT", f"/api/v1/mailboxes/{_SEG}/fault", 16 * KIB, "json"),
    BodyBound("POST", f"/api/v1/mailboxes/{_SEG}/messages/{_SEG}/release", 16 * KIB, "json"),
    BodyBound("POST", "/api/v1/webhooks", 16 * KIB, "json"),
    BodyBound("POST", "/hooks/ses", 1024 * KIB, "json"),  # SNS messages are at most 256 KiB
    BodyBound("POST", "/api/v1/send", 4096 * KIB, "json"),  # a message with its attachments, base64
    BodyBound("POST", f"/unsubscribe/{_SEG}", 4 * KIB, "form"),  # RFC 8058: a few bytes
    BodyBound("POST", "/inbox", 4 * KIB, "form"),  # the page's forms
    BodyBound("POST", f"/inbox/{_SEG}/login", 4 * KIB, "form"),
    BodyBound("POST", "/mail/login", 4 * KIB, "form"),
    BodyBound("POST", "/mcp/?", 1024 * KIB, "json"),  # MCP over HTTP: one JSON-RPC message
)
DEFAULT_BOUND = BodyBound("*", ".*", 16 * KIB, "raw")
_BOUNDS = [(b.method, re.compile(b.path), b) for b in BODY_BOUNDS]

# the status of each refusal when the database cannot word it (its row of error_codes says the same)
_WITHOUT_DB = {"body_too_large": (413, "limit"), "nul": (400, "usage"), "malformed": (400, "usage"),
               "json_depth": (400, "usage")}


def bound_of(method: str, path: str) -> BodyBound:
    for m, rx, bound in _BOUNDS:
        if m == method and rx.fullmatch(path):
            return bound
    return DEFAULT_BOUND


_HIGH_ESCAPE = re.compile(rb"%[89a-fA-F]")


def _text_refusal(raw: bytes) -> str | None:
    """'nul' or 'malformed' for a percent-encoded path, query or form, else None (decoded only when it
    holds a byte over 0x7f, raw or escaped: the usual path and query cost two scans)."""
    if b"\x00" in raw or b"%00" in raw:
        return "nul"
    if raw.isascii() and not _HIGH_ESCAPE.search(raw):
        return None
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return "malformed"
    return None


def url_refusal(scope: dict) -> str | None:
    """'nul' or 'malformed' for the path or query; 'nul' for a cookie whose quoted value would unquote to
    a NUL (the octal escape \\000, which Starlette's cookie parser decodes), else None."""
    raw_path = scope.get("raw_path")
    refusal = _text_refusal(raw_path) if raw_path else ("nul" if "\x00" in scope["path"] else None)
    refusal = refusal or _text_refusal(scope.get("query_string") or b"")
    if refusal is None and any(k.lower() == b"cookie" and b"\\000" in v for k, v in scope.get("headers", ())):
        return "nul"
    return refusal


# a JSON string (escapes included); what is left outside strings holds the structure. A string never
# closed runs to the end of the body (a trailing lone backslash too): a failed match from every quote,
# each scanning to the end, would be quadratic (the attacker review of issue 45)
_STRING = re.compile(rb'"(?:[^"\\]++|\\.?)*+(?:"|\Z)', re.S)
# \u0000 where its backslash is not itself escaped (an odd run of backslashes)
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*+\\u0000")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_AS_SQUARE = bytes.maketrans(b"{}", b"[]")


def json_refusal(body: bytes, depth: int = JSON_DEPTH) -> str | None:
    """'nul' or 'json_depth' for a JSON body, else None (whether it is JSON at all is the route's to
    say). Linear: two regular expressions over the body, then at most `depth` passes over its brackets
    outside strings, each removing every innermost pair (a pair left after them is nested deeper)."""
    if b"\x00" in body or (b"\\u0000" in body and _NUL_ESCAPE.search(body)):
        return "nul"
    if body.count(b"[") + body.count(b"{") <= depth:
        return None  # (brackets in strings counted too: no deeper, whatever they are)
    brackets = _STRING.sub(b"", body).translate(_AS_SQUARE, _NOT_BRACKETS)
    for _ in range(depth):
        fewer = brackets.replace(b"[]", b"")
        if len(fewer) == len(brackets):
            break
        brackets = fewer
    # a pair left is nested deeper; so are opening brackets never closed (a parser descends them too)
    return "json_depth" if b"[]" in brackets or brackets.count(b"[") > depth else None


class Refusals:
    """The edge's refusals as SQL words them (mailroom.edge_refusal), asked on `backend`'s pool (anything
    with `pool` and `config.pool_timeout`/`statement_timeout`: the HTTP State, the MCP Backend)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._known: dict[tuple[str, int | None], ApiError] = {}

    async def error(self, refusal: str, bound: int | None = None) -> ApiError:
        known = self._known.get((refusal, bound))
        if known is not None:
            return known

        async def ask(conn: psycopg.AsyncConnection) -> None:
            await sqlapi.edge_refusal.avalue(conn, refusal=refusal, bound=bound)

        config = self.backend.config
        try:
            await front_call(self.backend.pool, ask, pool_timeout=config.pool_timeout,
                             statement_timeout=config.statement_timeout)
        except psycopg.Error as exc:
            err = db_error(exc)
            if err.status < 500:
                self._known[(refusal, bound)] = err
                return err
        except (TimeoutError, NoConnection):
            pass
        status, kind = _WITHOUT_DB[refusal]
        about = refusal.replace("_", " ") + (f" (bound {bound})" if bound is not None else "")
        return ApiError(status, "", f"refused at the edge: {about}", kind=kind)


class _Cut(Exception):
    """A streamed body passed its bound: what the app was reading is cut."""


def json_answer(scope: dict, err: ApiError) -> Response:
    del scope
    return JSONResponse(error_body(err), status_code=err.status, headers=err.headers)


class Edge:
    """Pure ASGI, outermost: every HTTP request checked as the module says, then passed on as it came
    (a body the edge read whole, json and form, is given to the app as read)."""

    def __init__(self, app: Any, refusals: Refusals,
                 render: Callable[[dict, ApiError], Response] = json_answer) -> None:
        self.app = app
        self.refusals = refusals
        self.render = render

    async def refuse(self, scope: dict, receive: Any, send: Any, refusal: str, bound: int | None = None) -> None:
        response = self.render(scope, await self.refusals.error(refusal, bound))
        await response(scope, receive, send)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = url_refusal(scope)
        if refusal is not None:
            await self.refuse(scope, receive, send, refusal)
            return
        bound = bound_of(scope["method"], scope["path"])
        declared = next((v for k, v in scope.get("headers", ()) if k.lower() == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > bound.max_bytes:
            await self.refuse(scope, receive, send, "body_too_large", bound.max_bytes)
            return
        if bound.shape == "raw":
            if scope["method"] in ("GET", "HEAD"):
                await self.app(scope, receive, send)  # no route reads a GET's body (the hot reads' way)
            else:
                await self._counted(scope, receive, send, bound.max_bytes)
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client is gone before its body came: nobody to answer
            body += message.get("body", b"")
            if len(body) > bound.max_bytes:
                await self.refuse(scope, receive, send, "body_too_large", bound.max_bytes)
                return
            if not message.get("more_body", False):
                break
        data = bytes(body)
        refusal = json_refusal(data) if bound.shape == "json" else _text_refusal(data)
        if refusal is not None:
            await self.refuse(scope, receive, send, refusal, JSON_DEPTH if refusal == "json_depth" else None)
            return
        await self.app(scope, replay(data, receive), send)

    async def _counted(self, scope: dict, receive: Any, send: Any, limit: int) -> None:
        seen = 0
        cut = started = False

        async def counted() -> dict:
            nonlocal seen, cut
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    cut = True
                    raise _Cut
            return message

        async def guarded(message: dict) -> None:
            nonlocal started
            if cut:
                return  # whatever the app answers a cut body, the refusal is the answer
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, guarded)
        except _Cut:
            pass
        if cut and not started:
            await self.refuse(scope, receive, send, "body_too_large", limit)


def replay(body: bytes, receive: Any) -> Any:
    """An ASGI receive that gives `body` (read whole already), then the connection's own (its disconnect):
    the edge's and MCP's fast path's, each after reading a body whole."""
    sent = False

    async def replayed() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
