"""The ASGI app of `mailroom http serve`: the REST API, the web page, live events and the SES hook.

Thin by design, like the SMTP server: every request is ONE call of a SQL function of
mailroom.http.sqlapi (sql/29_http.sql), which authorizes it (session token, or an API key's sha256
digest) and answers a JSON document that is passed through as it is. The process keeps no state
that outlives a request but its LISTEN fan-out (mailroom.db.hub.Hub). The long poll and the
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
import json
import re
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import parse_qs, parse_qsl, quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from psycopg.types.json import Jsonb
from pydantic import BaseModel, ValidationError
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from mailroom.api import edge, operations
from mailroom.api.waits import until_disconnected
from mailroom.core import fastpaths
from mailroom.core.log import get_logger
from mailroom.http import docs, models, page, ses, sqlapi
from mailroom.http.credentials import Credentials, csrf_token, request_credentials, sink_listing_open
from mailroom.http.models import errors
from mailroom.http.state import CONFIG_ENV, ApiError, HttpConfig, State, error_body

__all__ = ["CONFIG_ENV", "ApiError", "HttpConfig", "State", "create_app"]

log = get_logger("http")


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


def _one_click(body: bytes) -> str | None:
    """The value of the form field List-Unsubscribe in an RFC 8058 POST body (urlencoded, or the
    multipart/form-data part of that name), else None. SQL decides what it means."""
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


def _epoch(value: str | None) -> float | None:
    """An ISO timestamp of a JSON answer (an inbox's expires_at) in seconds since the epoch; None if unreadable."""
    try:
        return datetime.fromisoformat(value).timestamp() if value else None
    except ValueError:
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
        app.add_middleware(CORSMiddleware, allow_origins=config.cors_origins,
                           allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                           allow_headers=["Authorization", "X-API-Key", "X-Session-Token"])
    if config.access_log:
        app.add_middleware(_AccessLog)
    app.add_middleware(docs.SecurityHeaders)
    docs.add_routes(app)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> Response:
        return _error_response(request.url.path, err)

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
        body = await _read_body(request)
        first = await state.call(sqlapi.unsubscribe, retry=False, token=token, one_click=_one_click(body))
        return _json(json.dumps({"unsubscribed": True, "first": bool(first)}))

    @app.get("/unsubscribe/{token}", tags=["unsubscribe"], response_class=HTMLResponse, responses=errors(),
             summary="A page with the unsubscribe button (a GET never unsubscribes: link scanners follow links)")
    async def unsubscribe_page(token: str) -> Response:
        return HTMLResponse(page.unsubscribe_page(token), headers=page.PAGE_HEADERS)

    # -- the REST API ------------------------------------------------------------------------------

    @app.get(**declared("list_mailboxes"))
    async def list_mailboxes(request: Request, limit: int = 100, offset: int = 0) -> Response:
        # an inbox list is an owner's: any credential but a key is looked up as one, and SQL refuses it (MR241)
        key_digest = request_credentials(request).as_key
        return _json(await state.call(sqlapi.http_list_mailboxes, key_digest=key_digest, limit=limit, offset=offset,
                                      sink=sink_listing_open(request, state.config.sink_listing,
                                                             state.config.sink_public)))

    @app.post(**declared("create_mailbox"))
    async def create_mailbox(request: Request, ttl_minutes: int | None = None, plan: str | None = None) -> Response:
        body = await _small_json(request)
        ttl_minutes = _int(str(body["ttl_minutes"]), "ttl_minutes", None, -2**31, 2**31 - 1) \
            if body.get("ttl_minutes") is not None else ttl_minutes
        plan = str(body["plan"]) if body.get("plan") is not None else plan
        # only an API key creates inboxes for an owner: any other credential is looked up as one, and SQL
        # refuses it (MR241)
        key_digest = request_credentials(request).as_key
        doc = await state.call(sqlapi.http_create_mailbox, retry=False, key_digest=key_digest,
                               client=request.client.host if request.client else None, ttl_minutes=ttl_minutes, plan=plan,
                               **operations.BY_NAME["create_mailbox"].fixed["rest"])
        address = json.loads(doc)["address"]
        return _json(doc, 201, {"Location": f"/api/v1/mailboxes/{quote(address)}"})

    @app.get(**declared("list_messages"))
    async def list_messages(request: Request, address: str, limit: int = 50, offset: int = 0,
                            after: int | None = None, tag: str | None = None, unread: bool | None = None,
                            before_id: int | None = None) -> Response:
        return _json(await state.call(sqlapi.http_list_messages, limit=limit, offset=offset, after_id=after, tag=tag,
                                      unread=unread, before_id=before_id, **creds(request, address).sql(address)))

    @app.get("/api/v1/messages", tags=["messages"], response_model=list[models.OwnerMessageSummary],
             responses=errors(400, 401, 403, 422, 503),
             summary="An API key owner's mail across their open inboxes, newest first by id (keyset: before_id; "
                     "tag=, unread=, or q= a search query); 403 for a session token")
    async def list_all_messages(request: Request, limit: int = 50, before_id: int | None = None, q: str | None = None,
                                tag: str | None = None, unread: bool | None = None) -> Response:
        c = request_credentials(request)
        return _json(await state.call(sqlapi.http_list_all_messages, session_token=c.session_token,
                                      key_digest=c.key_digest, limit=limit, before_id=before_id, tag=tag, unread=unread,
                                      query=q))

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
             summary="The HTML part for a sandboxed frame: cid: images inline, scripts and remote loads blocked "
                     "(images=1 allows remote images)")
    async def message_html(request: Request, address: str, message_id: str, images: int = 0) -> Response:
        row = await state.call(sqlapi.http_message_frame, shape="row", message_id=_message_id(message_id),
                               **creds(request, address).sql(address))
        parts = json.loads(row.inline_parts)  # cid: references SQL lets show, cut from the raw bytes here
        payloads = await state.parser.parts(bytes(row.raw), frozenset(p["sha256"] for p in parts)) if parts else {}
        body = page.inline_images(row.html_body, parts, payloads)
        return HTMLResponse(page.sandboxed_html(body), headers=page.message_frame_headers(bool(images)))

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
        policy = state.link_policy.with_ports(row.link_ports)  # the setting checks.link_ports, read by SQL
        return JSONResponse(await links.check(row.html_body, row.text_body, policy))

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

    @app.get(**declared("wait_for_message"))
    async def wait(request: Request, address: str, subject: str | None = None, timeout: float = 30,
                   after: int | None = None) -> Response:
        if not 0 <= timeout <= 600:
            raise ApiError(400, "22023", "timeout must be between 0 and 600 seconds")
        c = creds(request, address)
        who = c.sql(address)

        async def look(last: bool) -> dict[str, Any]:
            return json.loads(await state.look(sqlapi.http_wait_look, subject_like=subject, after_id=after,
                                               last=last, **who))

        # the one wait (api/waits.py): its first look answers a message already there (and authorizes);
        # then one look per wake-up shared by the waits of this credential, inbox, filter and cursor, never
        # past the inbox's expiry; the client's disconnect cancels it at once
        # counted per credential, per client address (the proxy's X-Forwarded-For with --proxy, as the
        # creation rate limit's) and in total
        work = state.waits.wait(credential=c.fingerprint, key=(subject, after),
                                look=look, timeout=timeout, client=request.client.host if request.client else None)
        try:
            finished, found = await until_disconnected(work, request.receive)
        except ApiError as err:
            if err.kind == "gone":  # the inbox expired (MR205) or was deleted (MR206): the wait's end, 410
                raise ApiError(410, err.code, err.message, headers=err.headers, kind=err.kind) from None
            raise
        if not finished:
            return Response(status_code=499)
        return _json(json.dumps(found))

    @app.get("/api/v1/mailboxes/{address}/events", tags=["messages"], response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                              "description": "`mailbox` (a Mailbox) first, then `message` (a MessageSummary, `id:` its id) "
                                             "for each new message, `closed` (an ErrorResponse) when the inbox expires or "
                                             "is deleted"},
                        **errors(401, 403, 404, 429, 503)},
             summary="Server-Sent Events: `message` for each new message, `closed` when the inbox expires")
    async def events(request: Request, address: str) -> Response:
        c = creds(request, address)
        who = c.sql(address)
        first = json.loads(await state.look(sqlapi.http_mailbox_view, limit=1, **who))
        mailbox_id = first["mailbox"]["mailbox_id"]
        last_id = int(request.headers.get("last-event-id") or 0) if (request.headers.get("last-event-id") or "").isdigit() \
            else max([m["id"] for m in first["messages"]], default=0)
        # an event stream takes a place under the caps (events.*: 429 MR251/MR252/MR253: per credential, in
        # total, per client address), given back when it ends
        give_back = await state.waits.take("events", c.fingerprint,
                                           request.client.host if request.client else None)
        # the inbox's expiry is a wake-up too, so `closed` comes when it passes, not at the next keepalive
        expires = _epoch(first["mailbox"].get("expires_at"))
        event = state.hub.subscribe(mailbox_id)

        async def stream() -> AsyncIterator[str]:
            nonlocal last_id, expires
            try:
                yield f"retry: 2000\nevent: mailbox\ndata: {json.dumps(first['mailbox'])}\n\n"
                while True:
                    idle = config.keepalive
                    if expires is not None:
                        idle = min(idle, max(expires - time.time(), 0) + 0.05)
                        if idle < config.keepalive:
                            expires = None  # once: a look decides (an inbox extended meanwhile stays open)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(event.wait(), state.hub.wait_timeout(idle))
                    event.clear()
                    try:
                        listed = json.loads(await state.look(sqlapi.http_list_messages, limit=100, after_id=last_id,
                                                             **who))
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
                give_back()

        # given back by the stream's end, or after the response when the stream never started (a client gone
        # first): give_back is once
        return StreamingResponse(stream(), media_type="text/event-stream", background=BackgroundTask(give_back),
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    # -- fault injection and release (issue 35, items 4 and 5) -------------------------------------

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

    # -- send over HTTP (issue 44, item 9; sql/32_outbound_send.sql) --------------------------------

    @app.post("/api/v1/send", tags=["send"], response_model=models.Sent,
              responses=errors(400, 401, 403, 409, 413, 429, 503), openapi_extra=models.body(models.SendRequest),
              summary="Send a message (Mailpit's request shape) through an outbound sender granted to the API key")
    async def send_message(request: Request) -> Response:
        # an API key in a header only: never the page's cookie (a cross-site form cannot send a header)
        key_digest = request_credentials(request).header_key
        doc = await _small_json(request)
        _body(models.SendRequest, doc)  # the types (422); SQL reads the document itself, by name
        return _json(await state.call(sqlapi.http_send_message, retry=False, key_digest=key_digest,
                                      message=Jsonb(doc), idempotency_key=request.headers.get("idempotency-key")))

    # -- webhooks (docs/webhooks.md): an API key's own endpoints, their deliveries, a replay -------

    def key_only(request: Request) -> bytes | None:
        # an API key in a header only, as for send: never the page's cookie (a cross-site form, whose
        # text/plain body can look like JSON, could otherwise register an endpoint); a session token is
        # refused as an unknown key (MR241)
        return request_credentials(request).header_key

    def an_id(value: str, name: str) -> int:
        number = _int(value, name, None, 1, 2**63 - 1)
        assert number is not None
        return number

    @app.post("/api/v1/webhooks", status_code=201, tags=["webhooks"], response_model=models.CreatedWebhookEndpoint,
              responses=errors(401, 409, 503), openapi_extra=models.body(models.WebhookRequest),
              summary="Register a webhook endpoint for the API key owner's inboxes; its whsec_ secret is in this "
                      "answer only")
    async def add_webhook(request: Request) -> Response:
        body = _body(models.WebhookRequest, await _small_json(request))
        return _json(await state.call(sqlapi.http_add_webhook, retry=False, key_digest=key_only(request),
                                      url=body.url, events=body.events), status=201)

    @app.get("/api/v1/webhooks", tags=["webhooks"], response_model=list[models.WebhookEndpoint],
             responses=errors(401, 503), summary="The API key's webhook endpoints (never their secrets)")
    async def list_webhooks(request: Request) -> Response:
        return _json(await state.call(sqlapi.http_list_webhooks, key_digest=key_only(request)))

    @app.delete("/api/v1/webhooks/{webhook_id}", tags=["webhooks"], response_model=models.RemovedWebhookEndpoint,
                responses=errors(401, 404, 503), summary="Remove one of the API key's webhook endpoints")
    async def remove_webhook(request: Request, webhook_id: str) -> Response:
        return _json(await state.call(sqlapi.http_remove_webhook, retry=False, key_digest=key_only(request),
                                      id=an_id(webhook_id, "webhook id")))

    @app.get("/api/v1/webhooks/{webhook_id}/deliveries", tags=["webhooks"],
             response_model=list[models.WebhookDelivery], responses=errors(401, 404, 503),
             summary="An endpoint's deliveries, newest first, with their attempts")
    async def webhook_deliveries(request: Request, webhook_id: str, limit: int = 50) -> Response:
        return _json(await state.call(sqlapi.http_webhook_deliveries, key_digest=key_only(request),
                                      id=an_id(webhook_id, "webhook id"), limit=_int(str(limit), "limit", 50, 1, 1000)))

    @app.post("/api/v1/webhooks/deliveries/{delivery_id}/replay", tags=["webhooks"],
              response_model=models.ReplayedWebhookDelivery, responses=errors(401, 404, 409, 503),
              summary="Send a delivery again: queued, due now, the same webhook-id")
    async def replay_webhook(request: Request, delivery_id: str) -> Response:
        return _json(await state.call(sqlapi.http_replay_webhook, retry=False, key_digest=key_only(request),
                                      delivery_id=an_id(delivery_id, "delivery id")))

    # -- SES through SNS -------------------------------------------------------------------------

    @app.post("/hooks/ses", tags=["hooks"], responses=errors(400, 403, 404, 413, 503),
              summary="Amazon SNS notifications of SES receipts (SNS action)")
    async def ses_hook(request: Request) -> Response:
        if state.sns is None:
            raise ApiError(404, "", "the SES hook is off (set MAILROOM_SES_TOPICS)", kind="not_found")
        return await ses.handle(state, request, await _read_body(request))

    # -- every other operation, built from its declaration (api/operations.py) -------------------------

    for op in operations.OPERATIONS:
        if op.rest is not None and op.rest.generic:
            _generic_route(app, state, op, creds)

    # -- the page ----------------------------------------------------------------------------------

    page.add_routes(app, state)
    if fastpaths.enabled():  # MAILROOM_FAST_PATHS=off: every request through the middleware and its route
        # the hot reads, without FastAPI's per-request parameter machinery when their query is plain
        hot = {
            "messages": (list_messages, {"limit": int, "offset": int, "after": int, "tag": str, "unread": bool,
                                         "before_id": int}),
            "wait": (wait, {"subject": str, "timeout": float, "after": int}),
        }
        for tail, (endpoint, params) in hot.items():
            _fast_get(app, f"/api/v1/mailboxes/{{address}}/{tail}", endpoint, params)
        if not config.access_log and not config.cors_origins:
            # outermost (inside Starlette's error middleware): the hot reads skip the middleware stack and the
            # router too; with an access log or CORS they take the way above, through both
            app.add_middleware(_HotGets, routes=app.router.routes, endpoints=hot)
    # outermost: every request bounded and checked before anything reads it (api/edge.py)
    app.add_middleware(edge.Edge, refusals=edge.Refusals(state),
                       render=lambda scope, err: _error_response(scope["path"], err, at_edge=True))
    return app


def declared(name: str) -> dict[str, Any]:
    """A route's declaration from its operation (api/operations.py): path, summary, status, answer and
    errors; for the routes written by hand (tests/http/test_operations.py checks their parameters)."""
    rest = operations.BY_NAME[name].rest
    assert rest is not None
    model: Any = None
    if rest.model is not None:
        model = list[getattr(models, rest.model[5:-1])] if rest.model.startswith("list[") else getattr(models, rest.model)
    extra = {"openapi_extra": models.body(getattr(models, rest.body_model))} if rest.body_model else {}
    return {"path": rest.path, "summary": rest.summary, "status_code": rest.status, "tags": [rest.tag],
            "response_model": model, "responses": errors(*rest.errors), **extra}


def _generic_route(app: FastAPI, state: State, op: operations.Operation, creds: Any) -> None:
    """One route of an operation, from its declaration: its path parameters (a message id must be a
    number: 400), its query parameters typed as declared (their bounds are SQL's: 400 with its code), a
    JSON body read bounded (the edge) and checked by its model (422), the caller's credentials (a
    cookie-authorized change needs its CSRF header), ONE call of the operation's SQL function, and its
    answer: the function's JSON as it is, or a scalar as {wrap: value}."""
    import inspect

    rest = op.rest
    assert rest is not None
    in_path = {a.name for a in op.args if f"{{{a.rest_name}}}" in rest.path}
    query = [a for a in op.args if a.rest_name and not a.body and a.name not in in_path]
    body = [a for a in op.args if a.rest_name and a.body]
    body_model = getattr(models, rest.body_model) if rest.body_model else None
    unsafe = rest.method != "GET"
    params = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=str) for name in
               (a.rest_name for a in op.args if a.name in in_path)]
    params += [inspect.Parameter(a.rest_name or a.name, inspect.Parameter.KEYWORD_ONLY,
                                 annotation=a.type if a.required else a.type | None,
                                 default=inspect.Parameter.empty if a.required else a.default) for a in query]

    async def endpoint(request: Request, **given: Any) -> Response:
        address = given.pop("address")
        who = creds(request, address, unsafe=unsafe).sql(address)  # the CSRF rule before any body is read
        values = {a.name: given[a.rest_name] for a in query}
        if "message_id" in in_path:
            values["message_id"] = _message_id(given["message_id"])
        if body:
            doc = await _small_json(request)
            checked = _body(body_model, doc) if body_model is not None else None
            values.update({a.name: getattr(checked, a.rest_name) if checked is not None else doc.get(a.rest_name)
                           for a in body})
        value = await state.call(op.sql, retry=not unsafe, **operations.sql_arguments(op, "rest", values), **who)
        if op.sql.returns == "jsonb" and rest.wrap is None:
            return _json(value, rest.status)
        return JSONResponse(operations.answer(op, "rest", value), status_code=rest.status)

    endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    endpoint.__name__ = op.name
    kwargs = declared(op.name)
    app.add_api_route(kwargs.pop("path"), endpoint, methods=[rest.method], **kwargs)


def _error_response(path: str, err: ApiError, *, at_edge: bool = False) -> Response:
    """An ApiError as the face answers it: the page's HTML under /inbox and /, else the ErrorResponse.
    The edge's answers (at_edge) pass no middleware after it: they carry the security headers themselves."""
    if path.startswith("/inbox") or path == "/":
        return HTMLResponse(page.error_page(err.status, err.message, err.code), status_code=err.status,
                            headers={**err.headers, **page.PAGE_HEADERS})
    return JSONResponse(error_body(err), status_code=err.status,
                        headers={**err.headers, **_HOT_HEADERS} if at_edge else err.headers)


# A query value the fast path takes as it is; anything else (a sign, a space, an exponent, "yes", an
# empty value, a repeated name) goes the FastAPI way, whose parsing and 422 are the contract.
_PLAIN: dict[type, Any] = {
    int: re.compile(r"-?[0-9]{1,18}\Z").match,
    float: re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?\Z").match,
    bool: {"true", "false"}.__contains__,
    str: bool,
}


def _plain_query(query_string: bytes, params: dict[str, type]) -> dict[str, Any] | None:
    """The query's values the fast paths take (each plain, _PLAIN; names not declared ignored), else None."""
    query: dict[str, Any] = {}
    if not query_string:
        return query
    for name, value in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        kind = params.get(name)
        if kind is None:
            continue
        if name in query or not _PLAIN[kind](value):
            return None
        query[name] = int(value) if kind is int else float(value) if kind is float \
            else value == "true" if kind is bool else value
    return query


_HOT_PATH = re.compile(r"/api/v1/mailboxes/([^/]+)/(messages|wait)\Z")
_HOT_HEADERS = {"content-security-policy": docs.API_CSP, "x-content-type-options": "nosniff", "x-frame-options": "DENY"}


class _HotGets:
    """Pure ASGI, outermost: GET …/messages and GET …/wait with a plain query (_PLAIN) answered by their
    endpoint directly, as _fast_get does, but before the middleware stack and the router (together
    about a third of the server's CPU per request on the list, docs/http.md, Measured): their route
    is set in the scope, an ApiError answered as the exception handler does (the ErrorResponse and
    its headers), the security headers (docs.SecurityHeaders) added. Anything else goes on as it came."""

    def __init__(self, app: Any, routes: list, endpoints: dict[str, tuple[Any, dict[str, type]]]) -> None:
        self.app = app
        self.endpoints = {
            tail: (endpoint, params, next(r for r in routes if isinstance(r, APIRoute)
                                          and r.path == f"/api/v1/mailboxes/{{address}}/{tail}"))
            for tail, (endpoint, params) in endpoints.items()
        }

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        match = _HOT_PATH.match(scope["path"]) if scope["type"] == "http" and scope["method"] == "GET" else None
        query = _plain_query(scope["query_string"], self.endpoints[match[2]][1]) if match else None
        if query is None:
            await self.app(scope, receive, send)
            return
        fastpaths.hit("http.hot_gets")
        endpoint, _, route = self.endpoints[match[2]]
        scope["route"] = route
        scope["path_params"] = {"address": match[1]}
        try:
            response = await endpoint(Request(scope, receive, send), match[1], **query)
        except ApiError as err:
            response = JSONResponse(error_body(err), status_code=err.status, headers=err.headers)
        for name, value in _HOT_HEADERS.items():
            response.headers.setdefault(name, value)
        await response(scope, receive, send)


def _fast_get(app: FastAPI, path: str, endpoint: Any, params: dict[str, type]) -> None:
    """Serve GET `path` by calling `endpoint(request, **path_params, **query)` directly when every
    query value is plain (_PLAIN), else by its FastAPI route as declared. The route stays what the
    OpenAPI document, the router (its match, scope["route"]) and the exception handlers see: only
    FastAPI's per-request solving of parameters is skipped (about a third of the server's CPU per
    request on the list, docs/http.md, Measured). Names the endpoint does not take are ignored, as
    FastAPI ignores them."""
    route = next(r for r in app.router.routes if isinstance(r, APIRoute) and r.path == path and "GET" in r.methods)
    declared = route.app

    async def fast(scope: dict, receive: Any, send: Any) -> None:
        query = _plain_query(scope["query_string"], params)
        if query is None:
            await declared(scope, receive, send)
            return
        fastpaths.hit("http.fast_get")
        response = await endpoint(Request(scope, receive, send), **scope["path_params"], **query)
        await response(scope, receive, send)

    route.app = fast


async def _read_body(request: Request) -> bytes:
    """The request's body, bounded before the route by the edge (api/edge.py: BODY_BOUNDS, the
    one table of the bounds; a JSON body's nesting checked there too)."""
    return await request.body()


async def _small_json(request: Request) -> dict[str, Any]:
    body = await _read_body(request)
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
