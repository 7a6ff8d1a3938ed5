"""The ASGI app of `mailroom http serve`: the REST API, the web page, live events and the SES hook.

Thin by design, like the SMTP server: every request is ONE call of a SQL function of
mailroom.http.sqlapi (sql/29_http.sql), which authorizes it (session token, or an API key's sha256
digest) and answers a JSON document that is passed through as it is. The process keeps no state
that outlives a request but its LISTEN fan-out (mailroom.http.events.Hub). The long poll and the
event streams hold no database connection while they wait: they look again (one call) when the hub
says their inbox got mail, or every poll interval while LISTEN is down.

Credentials: `Authorization: Bearer <session token | API key>` (or `X-Session-Token`, `X-API-Key`);
API keys start with `mrk_` and only their sha256 is sent to SQL. The page (`/inbox/{address}`)
takes the token once (`?token=` or its form), keeps it in an HttpOnly SameSite=Strict cookie and
sends a CSRF header with its deletes (a cookie-authorized DELETE without it is refused).
Logs never carry an address, a token or a subject: the access log names the route template.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from psycopg.types.string import TextLoader
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from mailroom.core.errors import Kind, describe_db_error, error_code, kind_of
from mailroom.core.log import get_logger
from mailroom.core.outage import Outage
from mailroom.db.connect import alearn_vocabulary
from mailroom.db.pool import NoConnection, async_pool, front_call
from mailroom.http import docs, models, page, sqlapi
from mailroom.http.events import Hub
from mailroom.http.models import errors
from mailroom.http.sns import SnsVerifier
from mailroom.inboxes.parsing import ParsePool

log = get_logger("http")

CONFIG_ENV = "MAILROOM_HTTP_CONFIG"
API_KEY_PREFIX = "mrk_"
MAX_CREDENTIAL = 256
MAX_SES_BODY = 1024 * 1024  # SNS messages are at most 256 KiB

# HTTP status of each kind of database error (mailroom.core.errors.kind_of); a code whose status says
# more than its kind (no or bad credentials 401, a too-large message 413, the creation rate limit 429,
# a long poll that timed out 408) has it in its row of mailroom.error_codes (http_status).
_KIND_STATUS = {
    Kind.USAGE: 400, Kind.CONFIG: 500, Kind.NOT_FOUND: 404, Kind.GONE: 404, Kind.LIMIT: 429,
    Kind.CONFLICT: 409, Kind.DENIED: 403, Kind.UNAVAILABLE: 503, Kind.INTERNAL: 500,
}


@dataclass
class HttpConfig:
    """Everything a server process needs; passed to uvicorn's worker processes as JSON (CONFIG_ENV)."""

    database_url: str
    listen_url: str | None = None
    pool_size: int = 8
    pool_timeout: float = 3.0  # seconds a request waits for a pooled connection before its 503
    statement_timeout: float = 5.0  # seconds: every statement of a request (SET LOCAL), then 504
    poll_interval: float = 2.0
    keepalive: float = 15.0
    cors_origins: list[str] = field(default_factory=list)
    ses_topics: list[str] = field(default_factory=list)
    sns_cert_dir: str | None = None
    sns_ca_file: str | None = None
    sns_connect_to: str | None = None
    secure_cookies: bool = False
    access_log: bool = False
    # checks of the mail itself (docs/checks.md): the link check is off unless link_check; the spam
    # check unless spamd names host:port
    link_check: bool = False
    link_check_allow: list[str] = field(default_factory=list)
    spamd: str | None = None

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> HttpConfig:
        return cls(**json.loads(os.environ[CONFIG_ENV]))


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, *, headers: dict[str, str] | None = None,
                 kind: str = "usage") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.kind = kind
        self.headers = headers or {}


# A statement the server stopped: its timeout (57014) is the caller's work taking too long, 504;
# terminated or shut down (57P01–57P03), the database is going away, 503. Neither is ever retried.
_SQLSTATE_STATUS = {"57014": 504}
RETRY_AFTER = "2"  # seconds, on every 503


def db_error(exc: psycopg.Error) -> ApiError:
    """The HTTP answer to a database error: the status of its kind (or code), the MR code and message."""
    kind = kind_of(exc)
    code = exc.sqlstate or ""
    entry = error_code(exc)
    status = entry.http_status if entry is not None and entry.http_status \
        else _SQLSTATE_STATUS.get(code) or _KIND_STATUS.get(kind, 500)
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="mailroom"'
    if status == 429 and exc.diag.message_detail and exc.diag.message_detail.isdigit():
        headers["Retry-After"] = exc.diag.message_detail
    if status == 503 and entry is not None:
        message = exc.diag.message_primary or "unavailable"  # mailroom's own: a check this server does not run
    elif status == 503:
        headers["Retry-After"] = RETRY_AFTER
        message = "the database is unavailable, try again"
    elif status == 504:
        message = "the statement took longer than the server allows (statement timeout)"
    elif status >= 500:
        log.error("database error: %s", describe_db_error(exc))
        message = "internal error"
    else:
        message = exc.diag.message_primary or "refused"
    return ApiError(status, code, message, headers=headers, kind=kind.value)


def unavailable(reason: str = "the database is unavailable, try again") -> ApiError:
    return ApiError(503, "", reason, headers={"Retry-After": RETRY_AFTER}, kind=Kind.UNAVAILABLE.value)


def error_body(err: ApiError) -> dict[str, Any]:
    # REST v1 ErrorResponse: FastAPI's `detail` (what the original service's clients read) beside
    # mailroom's code and kind
    return {"detail": err.message, "error": {"code": err.code, "kind": err.kind, "message": err.message}}


@dataclass
class Credentials:
    session_token: str | None
    key_digest: bytes | None
    raw: str | None
    from_cookie: bool

    def sql(self, address: str) -> dict[str, Any]:
        return {"address": address, "session_token": self.session_token, "key_digest": self.key_digest}


def cookie_name(address: str) -> str:
    return "mailroom_" + hashlib.sha256(address.strip().lower().encode()).hexdigest()[:16]


def csrf_token(credential: str) -> str:
    """The CSRF value of a page: derived from its credential, so only a reader of the page knows it."""
    return hashlib.sha256(b"mailroom-csrf:" + credential.encode()).hexdigest()[:32]


def split_credential(value: str | None, *, from_cookie: bool = False) -> Credentials:
    if not value:
        return Credentials(None, None, None, from_cookie)
    value = value.strip()
    if len(value) > MAX_CREDENTIAL or value.startswith(API_KEY_PREFIX):
        # a credential too long for a session token can only be refused as a key: SQL answers (MR241)
        return Credentials(None, hashlib.sha256(value.encode()).digest(), value, from_cookie)
    return Credentials(value, None, value, from_cookie)


def request_credentials(request: Request, address: str | None = None) -> Credentials:
    auth = request.headers.get("authorization", "")
    value = auth[7:] if auth[:7].lower() == "bearer " else None
    value = value or request.headers.get("x-api-key") or request.headers.get("x-session-token")
    if value:
        return split_credential(value)
    # the page's cookies: the inbox's own, else an API key's owner's (page.KEY_COOKIE, the /mail view)
    cookie = request.cookies.get(cookie_name(address)) if address is not None else None
    return split_credential(cookie or request.cookies.get(page.KEY_COOKIE), from_cookie=True)


def _jsonb_as_text(conn: psycopg.AsyncConnection) -> None:
    # the SQL functions answer JSON documents: passed through as text, never parsed and re-dumped
    conn.adapters.register_loader("jsonb", TextLoader)


class State:
    """A server process's connection pool, LISTEN hub and SNS verifier."""

    def __init__(self, config: HttpConfig) -> None:
        self.config = config
        self.pool = async_pool(config.database_url, max_size=config.pool_size, application_name="mailroom-http",
                               configure=_configure)
        self.outage = Outage(log)  # the database unreachable: one line, reminders, one line when it is back
        self.hub = Hub(config.listen_url, poll_interval=config.poll_interval, indexer=self._index)
        # large messages are parsed in these processes (started on first use), never on the loop
        self.parser = ParsePool()
        self.sns: SnsVerifier | None = None
        # the checks' edge (docs/checks.md): None is off, and SQL refuses the check (MR280, MR281)
        from mailroom.checks.links import LinkPolicy
        from mailroom.checks.spam import Spamd

        self.link_policy = LinkPolicy.parse(config.link_check_allow) if config.link_check else None
        self.spamd = Spamd.parse(config.spamd) if config.spamd else None
        if config.ses_topics:
            connect_to = None
            if config.sns_connect_to:
                host, _, port = config.sns_connect_to.rpartition(":")
                connect_to = (host, int(port))
            self.sns = SnsVerifier(
                frozenset(config.ses_topics), cert_dir=Path(config.sns_cert_dir) if config.sns_cert_dir else None,
                ca_file=config.sns_ca_file, connect_to=connect_to,
            )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        from mailroom.core.ready import notify_ready
        from mailroom.db import heartbeat

        await self.pool.open(wait=False)
        self.hub.start()
        log.info("serving (pid %d, pool %d, LISTEN %s, SES hook %s)", os.getpid(), self.config.pool_size,
                 "on" if self.config.listen_url else "off (polling)", "on" if self.sns else "off")
        # listed by `mailroom status` like every worker (kind http); `mailroom run` waits for the ready byte
        beat = heartbeat.Heartbeat(heartbeat.worker_name(), "http", log)
        beat.serves = os.environ.get(heartbeat.SERVES_ENV)
        beats = asyncio.create_task(heartbeat.abeat_every(beat, self.pool.connection, lambda: self.hub.listening))
        notify_ready()
        try:
            yield
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
            await beat.astop(self.config.database_url)
            await self.hub.stop()
            await self.pool.close()
            await self.parser.close()

    async def _index(self, ids: list[int]) -> None:
        async with self.pool.connection() as conn:
            await sqlapi.index_messages.acall(conn, message_ids=ids)

    async def call(self, fn: Any, *, shape: str = "value", retry: bool = True, **kwargs: Any) -> Any:
        """One SQL call on a pooled connection, in a transaction whose statement timeout is the
        server's (--statement-timeout, SET LOCAL: the runtime roles are group roles, and a pooler
        drops startup options, so a login's or a URL's setting cannot be relied on).

        A pooled connection the server ended while it was idle (found before anything is sent) is
        replaced by the next one; nothing else is retried: a statement the server cancelled or
        terminated, or a connection lost under it, is answered (504, 503) and never run again.
        No connection within --pool-timeout: 503 with Retry-After. `retry` is kept for callers
        and means nothing more than that."""
        del retry

        async def run(conn: psycopg.AsyncConnection) -> Any:
            if shape == "rows":
                return await fn.arows(conn, **kwargs)
            if shape == "row":
                return await fn.arow(conn, **kwargs)
            return await fn.avalue(conn, **kwargs)

        try:
            result = await front_call(self.pool, run, pool_timeout=self.config.pool_timeout,
                                      statement_timeout=self.config.statement_timeout)
        except TimeoutError:
            self.outage.delay("no answer from the database")
            raise unavailable() from None
        except NoConnection as exc:
            if exc.cause is not None:
                self.outage.delay(exc.cause)
            raise unavailable() from None
        except psycopg.Error as exc:
            if kind_of(exc) is Kind.UNAVAILABLE and not exc.sqlstate:
                self.outage.delay(exc)  # the connection was lost: one line for the outage
            raise db_error(exc) from None
        self.outage.resumed()
        return result


def _configure(conn: psycopg.AsyncConnection) -> Any:
    async def configure() -> None:
        _jsonb_as_text(conn)
        await alearn_vocabulary(conn)  # once a process: each MR code's kind and HTTP status (mailroom.error_codes)

    return configure()


def _json(text: str | None, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(content=text if text is not None else "null", status_code=status, media_type="application/json",
                    headers=headers)


def _int(value: str | None, name: str, default: int | None, low: int, high: int) -> int | None:
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ApiError(400, "22023", f"{name} must be an integer") from None
    if not low <= number <= high:
        raise ApiError(400, "22023", f"{name} must be between {low} and {high}")
    return number


_UNSUBSCRIBE_BODY_MAX = 4096


def _one_click(body: bytes) -> str | None:
    """The value of the form field List-Unsubscribe in an RFC 8058 POST body (urlencoded, or the
    multipart/form-data part of that name), else None. SQL decides what it means."""
    from urllib.parse import parse_qs

    text = body.decode("utf-8", "replace")
    values = parse_qs(text).get("List-Unsubscribe")
    if values:
        return values[0]
    marker = 'name="List-Unsubscribe"'
    at = text.find(marker)
    if at >= 0:
        rest = text[at + len(marker):].split("\r\n\r\n", 1)
        if len(rest) == 2:
            return rest[1].split("\r\n", 1)[0]
    return None


def _message_id(value: str) -> int:
    number = _int(value, "message id", None, 1, 2**63 - 1)
    assert number is not None
    return number


class _AccessLog:
    """Pure ASGI middleware: one line per request naming the route template (never the address)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [0]

        async def capture(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope.get("route")
            log.info("%s %s %d %.1fms", scope["method"], getattr(route, "path", "-"), status[0],
                     (time.perf_counter() - started) * 1000)


def create_app(config: HttpConfig | None = None) -> FastAPI:  # noqa: PLR0915 - the routes, one place
    config = config or HttpConfig.from_env()
    state = State(config)
    app = FastAPI(
        title="mailroom HTTP API",
        version="1",
        summary="Expiring inboxes over HTTP: create, read, wait for, search and delete mail.",
        lifespan=state.lifespan,
        docs_url=None,  # http/docs.py: Swagger UI from a package, under a CSP
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.mailroom = state
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins,
                           allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                           allow_headers=["Authorization", "X-API-Key", "X-Session-Token"])
    if config.access_log:
        app.add_middleware(_AccessLog)
    app.add_middleware(docs.SecurityHeaders)
    docs.add_routes(app)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> Response:
        if request.url.path.startswith("/inbox") or request.url.path == "/":
            return HTMLResponse(page.error_page(err.status, err.message, err.code), status_code=err.status,
                                headers={**err.headers, **page.PAGE_HEADERS})
        return JSONResponse(error_body(err), status_code=err.status, headers=err.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # the router's own refusals (no such route 404, a method a path lacks 405) in the same
        # ErrorResponse: not mailroom's, so no code
        kind = "not_found" if exc.status_code == 404 else "usage"
        return JSONResponse(error_body(ApiError(exc.status_code, "", str(exc.detail), kind=kind)),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        detail = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors())
        return JSONResponse(error_body(ApiError(422, "22023", detail)), status_code=422)

    def creds(request: Request, address: str, *, unsafe: bool = False) -> Credentials:
        c = request_credentials(request, address)
        if unsafe and c.from_cookie and c.raw is not None and request.headers.get("x-csrf-token") != csrf_token(c.raw):
            # not mailroom's refusal but the edge's: the standard SQLSTATE of insufficient privilege
            raise ApiError(403, "42501", "a request authorized by the page's cookie needs its X-CSRF-Token",
                           kind="denied")
        return c

    # -- one-click unsubscribe (RFC 8058; docs/deliverability.md) ---------------------------------

    @app.post("/unsubscribe/{token}", tags=["unsubscribe"], response_model=models.Unsubscribed,
              responses=errors(400, 404, 413, 422),
              summary="One-click unsubscribe (RFC 8058): the body List-Unsubscribe=One-Click")
    async def unsubscribe(request: Request, token: str) -> Response:
        # the mail client's POST: form-encoded or multipart, a few bytes; SQL checks the token's
        # signature and the field's value (MR380, MR384) and suppresses the recipient once
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _UNSUBSCRIBE_BODY_MAX:
                raise ApiError(413, "22023", "an unsubscribe request is a few bytes", kind="usage")
        first = await state.call(sqlapi.unsubscribe, retry=False, token=token, one_click=_one_click(body))
        return _json(json.dumps({"unsubscribed": True, "first": bool(first)}))

    @app.get("/unsubscribe/{token}", tags=["unsubscribe"], response_class=HTMLResponse, responses=errors(),
             summary="A page with the unsubscribe button (a GET never unsubscribes: link scanners follow links)")
    async def unsubscribe_page(token: str) -> Response:
        return HTMLResponse(page.unsubscribe_page(token), headers=page.PAGE_HEADERS)

    # -- the REST API ------------------------------------------------------------------------------

    @app.get("/api/v1/mailboxes", tags=["mailboxes"], response_model=list[models.Mailbox], responses=errors(400, 401, 422, 503),
             summary="The API key's open inboxes (owner types api and mcp), newest first")
    async def list_mailboxes(request: Request, limit: int = 100, offset: int = 0) -> Response:
        c = request_credentials(request)
        # an inbox list is an owner's: any credential but a key is looked up as one, and SQL refuses it (MR241)
        key_digest = c.key_digest if c.raw is None or c.key_digest is not None \
            else hashlib.sha256(c.raw.encode()).digest()
        return _json(await state.call(sqlapi.http_list_mailboxes, key_digest=key_digest, limit=limit, offset=offset))

    @app.post("/api/v1/mailboxes", status_code=201, tags=["mailboxes"], response_model=models.CreatedMailbox,
              responses=errors(400, 401, 403, 413, 422, 429, 503),
              summary="Create an inbox (anonymous: the default plan; other plans need an API key)")
    async def create_mailbox(request: Request, ttl_minutes: int | None = None, plan: str | None = None) -> Response:
        body = await _small_json(request)
        ttl_minutes = _int(str(body["ttl_minutes"]), "ttl_minutes", None, -2**31, 2**31 - 1) \
            if body.get("ttl_minutes") is not None else ttl_minutes
        plan = str(body["plan"]) if body.get("plan") is not None else plan
        c = request_credentials(request)
        # only an API key creates inboxes for an owner: any other credential is looked up as one, and SQL
        # refuses it (MR241)
        key_digest = c.key_digest if c.raw is None or c.key_digest is not None \
            else hashlib.sha256(c.raw.encode()).digest()
        doc = await state.call(sqlapi.http_create_mailbox, retry=False, key_digest=key_digest,
                               client=request.client.host if request.client else None, ttl_minutes=ttl_minutes, plan=plan)
        address = json.loads(doc)["address"]
        return _json(doc, 201, {"Location": f"/api/v1/mailboxes/{quote(address)}"})

    @app.get("/api/v1/mailboxes/{address}", tags=["mailboxes"], response_model=models.Mailbox,
             responses=errors(401, 403, 404, 503),
             summary="An open inbox (404 once expired or deleted)")
    async def get_mailbox(request: Request, address: str) -> Response:
        return _json(await state.call(sqlapi.http_get_mailbox, **creds(request, address).sql(address)))

    @app.delete("/api/v1/mailboxes/{address}", tags=["mailboxes"], response_model=models.Deleted,
                responses=errors(401, 403, 404, 503), summary="Delete an inbox (it refuses mail at once)")
    async def delete_mailbox(request: Request, address: str) -> Response:
        deleted = await state.call(sqlapi.http_delete_mailbox, retry=False,
                                   **creds(request, address, unsafe=True).sql(address))
        return JSONResponse({"deleted": bool(deleted)})

    @app.get("/api/v1/mailboxes/{address}/messages", tags=["messages"], response_model=list[models.MessageSummary],
             responses=errors(400, 401, 403, 404, 422, 503),
             summary="Messages, newest first (paged; tag= a tag, unread=true/false): a JSON array")
    async def list_messages(request: Request, address: str, limit: int = 50, offset: int = 0,
                            after: int | None = None, tag: str | None = None, unread: bool | None = None) -> Response:
        return _json(await state.call(sqlapi.http_list_messages, limit=limit, offset=offset, after_id=after, tag=tag,
                                      unread=unread, **creds(request, address).sql(address)))

    @app.delete("/api/v1/mailboxes/{address}/messages", tags=["messages"], response_model=models.DeletedCount,
                responses=errors(401, 403, 404, 503), summary="Delete every message of the inbox (the inbox stays)")
    async def clear_messages(request: Request, address: str) -> Response:
        return _json(await state.call(sqlapi.http_clear_messages, retry=False,
                                      **creds(request, address, unsafe=True).sql(address)))

    @app.post("/api/v1/mailboxes/{address}/messages/delete", tags=["messages"], response_model=models.DeletedCount,
              responses=errors(400, 401, 403, 404, 413, 503), openapi_extra=models.body(models.DeleteMessages),
              summary="Delete the messages of these ids (1 to 500; ids not in the inbox are not counted)")
    async def delete_messages(request: Request, address: str) -> Response:
        who = creds(request, address, unsafe=True).sql(address)  # the CSRF rule before the body is read
        body = _body(models.DeleteMessages, await _small_json(request, 64 * 1024))
        return _json(await state.call(sqlapi.http_delete_messages, retry=False, message_ids=body.ids, **who))

    @app.post("/api/v1/mailboxes/{address}/extend", tags=["mailboxes"], response_model=models.Mailbox,
              responses=errors(400, 401, 403, 404, 413, 503), openapi_extra=models.body(models.Extend),
              summary="Extend the inbox: expires_at = now + ttl_seconds, clamped to the plan's max_ttl_seconds, "
                      "never earlier than it was")
    async def extend_mailbox(request: Request, address: str) -> Response:
        who = creds(request, address, unsafe=True).sql(address)
        body = _body(models.Extend, await _small_json(request))
        return _json(await state.call(sqlapi.http_extend_mailbox, retry=False, ttl_seconds=body.ttl_seconds, **who))

    @app.get("/api/v1/messages", tags=["messages"], response_model=list[models.OwnerMessageSummary],
             responses=errors(400, 401, 403, 422, 503),
             summary="An API key owner's mail across their open inboxes, newest first by id (keyset: before_id; "
                     "tag=, unread=); 403 for a session token")
    async def list_all_messages(request: Request, limit: int = 50, before_id: int | None = None,
                                tag: str | None = None, unread: bool | None = None) -> Response:
        c = request_credentials(request)
        return _json(await state.call(sqlapi.http_list_all_messages, session_token=c.session_token,
                                      key_digest=c.key_digest, limit=limit, before_id=before_id, tag=tag, unread=unread))

    @app.get("/api/v1/mailboxes/{address}/messages/{message_id}", tags=["messages"], response_model=models.Message,
             responses=errors(400, 401, 403, 404, 503),
             summary="One message: body_text, body_html, attachments' metadata, headers, the extracted link and code; "
                     "marks it read")
    async def read_message(request: Request, address: str, message_id: str) -> Response:
        return _json(await state.call(sqlapi.http_read_message, message_id=_message_id(message_id),
                                      **creds(request, address).sql(address)))

    @app.patch("/api/v1/mailboxes/{address}/messages/{message_id}", tags=["messages"],
               response_model=models.MessageSummary, responses=errors(400, 401, 403, 404, 413, 503),
               openapi_extra=models.body(models.MessagePatch),
               summary="Mark a message read or unread and/or replace its tags (a field left out: unchanged)")
    async def update_message(request: Request, address: str, message_id: str) -> Response:
        who = creds(request, address, unsafe=True).sql(address)
        body = _body(models.MessagePatch, await _small_json(request))
        return _json(await state.call(sqlapi.http_update_message, retry=False, message_id=_message_id(message_id),
                                      is_read=body.is_read, tags=body.tags, **who))

    @app.delete("/api/v1/mailboxes/{address}/messages/{message_id}", tags=["messages"], response_model=models.Deleted,
                responses=errors(400, 401, 403, 404, 503), summary="Delete one message")
    async def delete_message(request: Request, address: str, message_id: str) -> Response:
        await state.call(sqlapi.http_delete_message, retry=False, message_id=_message_id(message_id),
                         **creds(request, address, unsafe=True).sql(address))
        return JSONResponse({"deleted": True})

    @app.get("/api/v1/mailboxes/{address}/messages/{message_id}/raw", tags=["messages"], response_class=Response,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                              "description": "the bytes as received, never rendered"},
                        **models.json_errors(400, 401, 403, 404, 422, 503)},
             summary="The message as received (message/rfc822)")
    async def message_raw(request: Request, address: str, message_id: str) -> Response:
        raw = await state.call(sqlapi.http_message_raw, message_id=_message_id(message_id),
                               **creds(request, address).sql(address))
        return Response(bytes(raw), media_type="text/plain; charset=utf-8",
                        headers={"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"})

    @app.get("/api/v1/mailboxes/{address}/messages/{message_id}/html", tags=["messages"], response_class=HTMLResponse,
             responses=models.json_errors(400, 401, 403, 404, 422, 503),
             summary="The HTML part for a sandboxed frame: scripts and remote loads blocked (images=1 allows images)")
    async def message_html(request: Request, address: str, message_id: str, images: int = 0) -> Response:
        doc = json.loads(await state.call(sqlapi.http_read_message, message_id=_message_id(message_id),
                                          **creds(request, address).sql(address)))
        return HTMLResponse(page.sandboxed_html(doc.get("body_html")), headers=page.message_frame_headers(bool(images)))

    @app.get("/api/v1/mailboxes/{address}/messages/{message_id}/attachments/{index}", tags=["messages"],
             response_class=Response,
             responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
                              "description": "the decoded part, as a download"},
                        **models.json_errors(400, 401, 403, 404, 422, 503)},
             summary="Attachment n (from 0), as a download")
    async def attachment(request: Request, address: str, message_id: str, index: int) -> Response:
        row = await state.call(sqlapi.http_message_attachment, shape="row", message_id=_message_id(message_id),
                               index=index, **creds(request, address).sql(address))
        meta = json.loads(row.attachment)
        data = await state.parser.part(bytes(row.raw), meta.get("sha256", ""))
        if data is None:
            # the stored bytes no longer parse to that part: the standard SQLSTATE of no data
            raise ApiError(404, "P0002", "the attachment cannot be read from the message", kind="not_found")
        return Response(data, media_type=page.download_type(meta.get("content_type")),
                        headers=page.download_headers(meta.get("filename") or f"attachment-{index}"))

    @app.get("/api/v1/mailboxes/{address}/messages/{message_id}/links", tags=["extract"], response_model=models.Link,
             responses=errors(400, 401, 403, 404, 503),
             summary="The first http(s) link of a message (like= a LIKE pattern)")
    async def links(request: Request, address: str, message_id: str, like: str | None = None) -> Response:
        link = await state.call(sqlapi.http_extract_link, message_id=_message_id(message_id), url_like=like,
                                **creds(request, address).sql(address))
        return JSONResponse({"link": link})

    @app.get("/api/v1/mailboxes/{address}/messages/{message_id}/code", tags=["extract"], response_model=models.Code,
             responses=errors(400, 401, 403, 404, 503),
             summary="The code in a message (default: a 5-digit word; pattern= a regular expression)")
    async def code(request: Request, address: str, message_id: str, pattern: str | None = None) -> Response:
        value = await state.call(sqlapi.http_extract_code, message_id=_message_id(message_id), pattern=pattern,
                                 **creds(request, address).sql(address))
        return JSONResponse({"code": value})

    # -- checks of the mail itself (docs/checks.md): one SQL call, then the check at this edge -----

    def check_source(request: Request, address: str, message_id: str, check: str, enabled: bool = True) -> Any:
        return state.call(sqlapi.http_message_check, shape="row", message_id=_message_id(message_id), check=check,
                          enabled=enabled, **creds(request, address).sql(address))

    @app.get("/api/v1/mailboxes/{address}/messages/{message_id}/checks/html", tags=["checks"],
             response_model=models.HtmlCheck, responses=errors(400, 401, 403, 404, 503),
             summary="HTML check: which email clients support the HTML and CSS the message uses (caniemail's data)")
    async def check_html(request: Request, address: str, message_id: str) -> Response:
        from mailroom.checks import html

        row = await check_source(request, address, message_id, "html")
        return JSONResponse(await asyncio.to_thread(html.check, row.html_body or ""))

    @app.get("/api/v1/mailboxes/{address}/messages/{message_id}/checks/links", tags=["checks"],
             response_model=models.LinkCheck, responses=errors(400, 401, 403, 404, 503),
             summary="Link check: does every link and image answer (off unless --link-check; bounded, SSRF-guarded)")
    async def check_links(request: Request, address: str, message_id: str) -> Response:
        from mailroom.checks import links

        row = await check_source(request, address, message_id, "links", enabled=state.link_policy is not None)
        assert state.link_policy is not None  # SQL refused the check otherwise (MR280)
        return JSONResponse(await links.check(row.html_body, row.text_body, state.link_policy))

    @app.get("/api/v1/mailboxes/{address}/messages/{message_id}/checks/spam", tags=["checks"],
             response_model=models.SpamCheck, responses=errors(400, 401, 403, 404, 502, 503),
             summary="Spam score: SpamAssassin's (spamd's) score, threshold and rules hit (off unless --spamd)")
    async def check_spam(request: Request, address: str, message_id: str) -> Response:
        from mailroom.checks import spam

        row = await check_source(request, address, message_id, "spam", enabled=state.spamd is not None)
        assert state.spamd is not None  # SQL refused the check otherwise (MR281)
        try:
            return JSONResponse(await spam.check(bytes(row.raw), state.spamd))
        except spam.SpamdFailed as exc:
            # not mailroom's refusal but the edge's: no code, like the SES hook's
            raise ApiError(502, "", str(exc), kind="unavailable") from None

    @app.get("/api/v1/mailboxes/{address}/search", tags=["messages"], response_model=models.SearchResult,
             responses=errors(400, 401, 403, 404, 422, 503), summary="Full-text search (subject, from, text), best first")
    async def search(request: Request, address: str, q: str, limit: int = 50) -> Response:
        return _json(await state.call(sqlapi.http_search_messages, query=q, limit=limit,
                                      **creds(request, address).sql(address)))

    @app.get("/api/v1/mailboxes/{address}/wait", tags=["messages"], response_model=models.MessageSummary,
             responses=errors(400, 401, 403, 404, 408, 422, 503),
             summary="Long poll: the newest message whose subject is LIKE subject=, within timeout= seconds")
    async def wait(request: Request, address: str, subject: str | None = None, timeout: float = 30) -> Response:
        if not 0 <= timeout <= 600:
            raise ApiError(400, "22023", "timeout must be between 0 and 600 seconds")
        who = creds(request, address).sql(address)
        deadline = time.monotonic() + timeout
        mailbox = json.loads(await state.call(sqlapi.http_get_mailbox, **who))
        event = state.hub.subscribe(mailbox["mailbox_id"])
        try:
            while True:
                event.clear()
                left = deadline - time.monotonic()
                # the last look (the deadline passed) is refused by SQL when nothing came: MR212, 408
                found = await state.call(sqlapi.http_check_message, subject_like=subject, last=left <= 0, **who)
                if found is not None:
                    return _json(found)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), state.hub.wait_timeout(left))
                if await request.is_disconnected():
                    return Response(status_code=499)
        finally:
            state.hub.unsubscribe(mailbox["mailbox_id"], event)

    @app.get("/api/v1/mailboxes/{address}/events", tags=["messages"], response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                              "description": "`mailbox` (a Mailbox) first, then `message` (a MessageSummary, `id:` its id) "
                                             "for each new message, `closed` (an ErrorResponse) when the inbox expires or "
                                             "is deleted"},
                        **errors(401, 403, 404, 503)},
             summary="Server-Sent Events: `message` for each new message, `closed` when the inbox expires")
    async def events(request: Request, address: str) -> Response:
        who = creds(request, address).sql(address)
        first = json.loads(await state.call(sqlapi.http_mailbox_view, limit=1, **who))
        mailbox_id = first["mailbox"]["mailbox_id"]
        last_id = int(request.headers.get("last-event-id") or 0) if (request.headers.get("last-event-id") or "").isdigit() \
            else max([m["id"] for m in first["messages"]], default=0)
        event = state.hub.subscribe(mailbox_id)

        async def stream() -> AsyncIterator[str]:
            nonlocal last_id
            try:
                yield f"retry: 2000\nevent: mailbox\ndata: {json.dumps(first['mailbox'])}\n\n"
                while True:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(event.wait(), state.hub.wait_timeout(config.keepalive))
                    event.clear()
                    try:
                        listed = json.loads(await state.call(sqlapi.http_list_messages, limit=100, after_id=last_id, **who))
                    except ApiError as err:
                        if err.status in (401, 403, 404):
                            yield f"event: closed\ndata: {json.dumps(error_body(err))}\n\n"
                            return
                        yield ": database unavailable, retrying\n\n"
                        continue
                    messages = list(reversed(listed))
                    for m in messages:
                        last_id = max(last_id, m["id"])
                        yield f"id: {m['id']}\nevent: message\ndata: {json.dumps(m)}\n\n"
                    if not messages:
                        yield ": keepalive\n\n"
            finally:
                state.hub.unsubscribe(mailbox_id, event)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    # -- fault injection and release (issue 35, items 4 and 5) -------------------------------------

    @app.get("/api/v1/mailboxes/{address}/fault", tags=["faults"], response_model=models.Fault,
             responses=errors(401, 403, 404, 503),
             summary="The fault injected at the inbox's SMTP door (its own, else its catch-all domain's); 404 when none")
    async def get_fault(request: Request, address: str) -> Response:
        return _json(await state.call(sqlapi.http_inbox_fault, **creds(request, address).sql(address)))

    @app.put("/api/v1/mailboxes/{address}/fault", tags=["faults"], response_model=models.Fault,
             responses=errors(400, 401, 403, 404, 503),
             summary="Make the inbound SMTP server answer this inbox a chosen 4xx/5xx reply at rcpt, data or after_data "
                     "(every message, a share of them, or the next count)")
    async def set_fault(request: Request, address: str, body: models.FaultRequest) -> Response:
        return _json(await state.call(sqlapi.http_set_inbox_fault, retry=False, stage=body.stage, reply=body.reply,
                                      share=body.share, count=body.count,
                                      **creds(request, address, unsafe=True).sql(address)))

    @app.delete("/api/v1/mailboxes/{address}/fault", tags=["faults"], response_model=models.Deleted,
                responses=errors(401, 403, 404, 503),
                summary="Clear the inbox's own fault (its catch-all domain's stays); deleted false if it had none")
    async def clear_fault(request: Request, address: str) -> Response:
        deleted = await state.call(sqlapi.http_clear_inbox_fault, retry=False,
                                   **creds(request, address, unsafe=True).sql(address))
        return JSONResponse({"deleted": bool(deleted)})

    @app.get("/api/v1/release", tags=["release"], response_model=models.ReleaseOptions, responses=errors(503),
             summary="Whether captured messages may be released, and through which senders")
    async def release_options() -> Response:
        return _json(await state.call(sqlapi.release_options))

    @app.post("/api/v1/mailboxes/{address}/messages/{message_id}/release", tags=["release"],
              response_model=models.Released, responses=errors(400, 401, 403, 404, 409, 413, 503),
              summary="Send a captured message on to an address, as received with Resent- headers, through a sender "
                      "and the outbound queue")
    async def release_message(request: Request, address: str, message_id: str, body: models.ReleaseRequest) -> Response:
        return _json(await state.call(sqlapi.http_release_message, retry=False, message_id=_message_id(message_id),
                                      to=body.to, sender=body.sender,
                                      **creds(request, address, unsafe=True).sql(address)))

    # -- SES through SNS -------------------------------------------------------------------------

    @app.post("/hooks/ses", tags=["hooks"], responses=errors(400, 403, 404, 413, 503),
              summary="Amazon SNS notifications of SES receipts (SNS action)")
    async def ses_hook(request: Request) -> Response:
        if state.sns is None:
            raise ApiError(404, "", "the SES hook is off (set MAILROOM_SES_TOPICS)", kind="not_found")
        from mailroom.http import ses

        return await ses.handle(state, request, await _read_body(request, MAX_SES_BODY))

    # -- the page ----------------------------------------------------------------------------------

    page.add_routes(app, state)
    return app


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "", f"body over {limit} bytes", kind="limit")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, "", f"body over {limit} bytes", kind="limit")
    return bytes(body)


async def _small_json(request: Request, limit: int = 16 * 1024) -> dict[str, Any]:
    body = await _read_body(request, limit)
    if not body.strip():
        return {}
    try:
        doc = json.loads(body)
    except ValueError:
        raise ApiError(400, "22023", "the body is not JSON") from None
    if not isinstance(doc, dict):
        raise ApiError(400, "22023", "the body must be a JSON object")
    return doc


_B = TypeVar("_B", bound=BaseModel)


def _body(model: type[_B], doc: dict[str, Any]) -> _B:
    """A request body read by _small_json (bounded), checked against its model (the OpenAPI document's
    requestBody, models.body): a field of the wrong type is 422, as FastAPI answers a parameter's."""
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors())
        raise ApiError(422, "22023", detail) from None
