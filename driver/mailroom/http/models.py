"""The REST v1 contract's shapes, as pydantic models: what the OpenAPI document (/openapi.json) says.

SQL makes every answer (sql/29_http.sql builds the JSON, the server passes it through as text), so
these models are the documentation of those documents, never a second implementation: a route
declares its model (`response_model=`, `responses=`) and returns SQL's JSON as it is.
tests/http/test_http_api.py checks that each answer has exactly the keys its model names, so a key
added in SQL without its field here (or the reverse) fails there. docs/architecture.md ("REST v1
contract") is the prose of the same.

The original expiring-inbox service's keys come first in each model (`address`, `expires_at`; `id`,
`subject`, `from_address`, `received_at`, `is_read`; `body_text`, `body_html`, `attachments`;
`detail` in an error), mailroom's richer ones after them. Every model allows extra keys, so adding
a field later is not a breaking change for a client that validates against the document.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class Fault(_Model):
    """A fault injected at the inbox's SMTP door (sql/24_faults.sql `_fault_json`; docs/inboxes.md)."""

    scope: str = Field(description="inbox (its own) or catchall_domain (its catch-all domain's)")
    stage: str = Field(description="rcpt, data or after_data: where the inbound server answers the reply")
    reply: str = Field(description="the SMTP reply it answers, e.g. 451 4.3.0 Try again later")
    share: float = Field(description="the percentage of messages it answers (0 to 100)")
    remaining: int | None = Field(description="how many more times it answers; null: every time until cleared")
    fired: int = Field(description="how many times it answered since it was set")
    active: bool = Field(description="whether it can still answer (share above 0, remaining not 0)")
    set_at: datetime


class Mailbox(_Model):
    """An open inbox (`_http_mailbox_json`): never its session token, never its owner's id."""

    address: str = Field(description="the inbox's address, its id in every path")
    expires_at: datetime = Field(description="when it stops accepting mail and answers 404")
    created_at: datetime
    is_active: bool = Field(description="open: neither expired nor deleted (always true in an answer of an open inbox)")
    plan: str
    owner_type: str = Field(description="anonymous, api (made with an API key) or mcp (made by an agent over MCP)")
    message_count: int
    catchall: bool = Field(description="made by the first mail to an address of a catch-all domain")
    max_messages: int | None = Field(description="the plan's message count limit")
    max_message_bytes: int | None = Field(description="the plan's size limit of one message")
    max_ttl_seconds: int | None = Field(description="the plan's longest TTL from now: the bound of POST …/extend")
    mailbox_id: int = Field(description="mailroom's id of the inbox (the payload of NOTIFY mailroom_inbox)")
    fault: Fault | None = Field(description="the fault injected at its SMTP door (its own, else its catch-all "
                                            "domain's); null when none")


class CreatedMailbox(Mailbox):
    """`POST /api/v1/mailboxes`: the inbox, with its session token (anonymous inboxes only; shown once)."""

    session_token: str | None = Field(
        description="the credential of an anonymous inbox, returned only here; null for an API key's inbox")


class MessageSummary(_Model):
    """A message in a list (`_http_message_summary`), newest first: no bodies."""

    id: int
    subject: str | None
    from_address: str | None = Field(description="the From header's address, else the envelope sender")
    to_address: str = Field(description="the recipient (RCPT TO) it was delivered for")
    received_at: datetime
    is_read: bool = Field(description="true once read with GET …/messages/{id}")
    has_attachments: bool
    from_: str | None = Field(alias="from", description="the From header as written (display name included)")
    envelope_from: str | None = Field(description="the SMTP reverse path (empty for a bounce)")
    size: int = Field(description="bytes as received")
    attachment_count: int
    reply_to: str | None = Field(description="the Reply-To header as written, null without one")
    snippet: str = Field(description="the first words of the text part, whitespace folded")
    tags: list[str] = Field(description="its tags, sorted, lower case (PATCH, or plus-addressing: box+tag@domain)")


class SearchHit(MessageSummary):
    rank: float = Field(description="ts_rank of the match; higher first")


class Attachment(_Model):
    """An attachment's metadata, recorded at delivery; its bytes: GET …/attachments/{index}."""

    index: int = Field(description="its number, from 0, in …/attachments/{index}")
    filename: str | None
    content_type: str | None
    disposition: str | None = None
    size: int | None
    content_id: str | None = None
    sha256: str | None = Field(default=None, description="hex digest of the decoded part; names it in the raw bytes")


class Message(_Model):
    """`GET …/messages/{id}`: the whole message; reading marks it read."""

    id: int
    subject: str | None
    from_address: str | None
    to_address: str
    received_at: datetime
    is_read: bool
    has_attachments: bool
    body_text: str | None = Field(description="the text part")
    body_html: str | None = Field(description="the HTML part: never render it outside a sandbox (GET …/html)")
    attachments: list[Attachment]
    from_: str | None = Field(alias="from")
    envelope_from: str | None
    size: int
    attachment_count: int
    reply_to: str | None = Field(description="the Reply-To header as written, null without one")
    headers: list[list[str]] = Field(description="[name, value] pairs in order, unfolded")
    link: str | None = Field(description="the first http(s) link (as GET …/links)")
    code: str | None = Field(description="a 5-digit code (as GET …/code)")
    tags: list[str] = Field(description="its tags, sorted, lower case")


class MailboxView(_Model):
    """The inbox page's call (`http_mailbox_view`); `/events` sends its `mailbox` first."""

    mailbox: Mailbox
    messages: list[MessageSummary]


class SearchResult(_Model):
    mailbox: Mailbox
    query: str
    messages: list[SearchHit]


# a JSON string PostgreSQL can take as text (no NUL): refused here with 422, as a parameter of the wrong type
_NO_NUL = r"^[^\x00]*$"


class FaultRequest(BaseModel):
    """`PUT …/fault`: what the inbound server answers, where and how often."""

    stage: str = Field(pattern=_NO_NUL, max_length=64, description="rcpt, data or after_data (after-data accepted)")
    reply: str = Field(pattern=_NO_NUL, max_length=1000,
                       description="421, 450-452 or 550-554, an enhanced status of the same class, text")
    share: float = Field(default=100, description="the percentage of messages it answers, 0 to 100")
    count: int | None = Field(default=None, ge=-2**31, le=2**31 - 1,
                              description="only the next this many messages; null: every one")


class ReleaseRequest(BaseModel):
    """`POST …/messages/{id}/release`: where to send the message, and through which sender."""

    to: str = Field(pattern=_NO_NUL, max_length=1000, description="the address the message is sent on to")
    sender: str | None = Field(default=None, pattern=_NO_NUL, max_length=200,
                               description="a sender of GET /api/v1/release; null: its first")


class Released(_Model):
    outbound_id: int = Field(description="the outbound queue's id of the message (mailroom outbound show)")
    to: str
    sender: str


class ReleaseOptions(_Model):
    enabled: bool = Field(description="false while the setting release.senders names no sender")
    senders: list[str] = Field(description="the senders a message may be released through")


class Deleted(_Model):
    deleted: bool


class Link(_Model):
    link: str


class Code(_Model):
    code: str


class Unsubscribed(_Model):
    unsubscribed: bool
    first: bool = Field(description="false when the recipient was suppressed already")


class HtmlFeature(_Model):
    """A caniemail feature the message's HTML uses, and how many clients support it (their latest version)."""

    name: str = Field(description="caniemail's slug, e.g. html-img, css-display-flex")
    kind: str = Field(description="html or css")
    supported: int = Field(description="clients that support it")
    partial: int = Field(description="clients that support it partly")
    unsupported: int = Field(description="clients that do not support it (clients without data count in none)")
    notes: list[str] = Field(description="caniemail's notes on the support counted")
    title: str | None = None
    url: str | None = Field(default=None, description="its page on caniemail.com")
    found: int | None = Field(default=None, description="times it occurs in the message")


class HtmlCheck(_Model):
    """`GET …/checks/html` (docs/checks.md): which clients support the HTML and CSS of the message."""

    score: float = Field(description="0..100: supported (client, feature) pairs among the known ones, partial as half")
    clients: int = Field(description="clients (a family on a platform, e.g. gmail.android) in the data")
    features: list[HtmlFeature]
    source: str = Field(description="the data: caniemail and its version")
    truncated: bool | None = Field(default=None, description="the HTML or its CSS was longer than the check reads")


class LinkResult(_Model):
    url: str
    kind: str = Field(description="link (a href, or a URL of the text part) or image (img src)")
    status: int | None = Field(description="the last HTTP status (after redirects); null when none came")
    ok: bool = Field(description="a 2xx or 3xx status at the end of the redirects")
    error: str | None = Field(description="why not ok: HTTP status, timeout, refused by the SSRF guard, ...")
    redirects: int


class LinkCheck(_Model):
    """`GET …/checks/links` (docs/checks.md): does every link and image answer (HEAD, then GET)."""

    links: list[LinkResult]
    checked: int
    skipped: int = Field(description="URLs past the check's bound of 50")


class SpamRule(_Model):
    name: str
    score: float
    description: str


class SpamCheck(_Model):
    """`GET …/checks/spam` (docs/checks.md): SpamAssassin's (spamd's) verdict on the raw message."""

    score: float
    threshold: float = Field(description="spamd's required score")
    is_spam: bool
    rules: list[SpamRule] = Field(description="the rules hit, highest score first")


class ErrorInfo(_Model):
    code: str = Field(description="the SQLSTATE: mailroom's (a row of mailroom.error_codes) or a standard one; empty at the edge")
    kind: str = Field(description="usage, config, not_found, gone, limit, conflict, denied, unavailable, internal")
    message: str


class ErrorResponse(_Model):
    """Every error of the API: FastAPI's `detail` (the message), beside mailroom's code and kind."""

    detail: str = Field(description="the message, as FastAPI services answer it")
    error: ErrorInfo


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` of a route: these statuses answer an ErrorResponse, and so do 422 (a parameter of
    the wrong type: app.py's handler), in place of FastAPI's default HTTPValidationError, and the edge's
    400 and 413 (api/edge.py: any request, before its route)."""
    statuses = tuple(sorted({*statuses, 400, 413, 422}))
    # the codes of each status: docs/http.md (no MR code is written in Python: tests/db/test_error_codes.py)
    described = {
        400: "bad input (the edge: a NUL or malformed path or query, a JSON body nested too deep)",
        401: "no credentials, or an unknown or revoked API key",
        403: "not this inbox's credential, a plan that needs an API key, a cookie request without its CSRF header, "
             "a release that is off or not allowed, the all-mail list with a session token, a send through a sender "
             "not granted to the key or to a recipient not allowed",
        404: "no such inbox, expired or deleted; no such message, link, code, attachment or fault",
        408: "the long poll's time passed", 410: "the inbox expired or was deleted during the long poll",
        409: "a released or sent message's address is on the suppression list; a search page's last message is "
             "gone (search again from the first page)",
        413: "body over its route's bound (the edge); a released or sent message over outbound.max_message_bytes",
        422: "a parameter of the wrong type",
        429: "the creation rate limit, a rate of release, send or the checks, too many waits for a credential or in total "
             "(Retry-After)",
        502: "the service a check asks (spamd) failed",
        503: "the database is unavailable; a check this server does not run (docs/checks.md)",
    }
    return {s: {"model": ErrorResponse, "description": described[s]} for s in statuses}


def json_errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """errors() for a route whose own answer is not JSON (an HTML frame, raw bytes, a download): its
    refusals are still ErrorResponse JSON, so they are declared as application/json explicitly
    (FastAPI would give a `model` the route's media type)."""
    return {s: {"description": d["description"],
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
            for s, d in errors(*statuses).items()}


# -- issue 35 item 1: marks, deletes, extending, an owner's all mail ---------------------------------


class OwnerMessageSummary(MessageSummary):
    """`GET /api/v1/messages`: a message of any of the API key owner's open inboxes."""

    mailbox: str = Field(description="the address of the inbox it is in")


class DeletedCount(_Model):
    deleted: int = Field(description="how many messages were deleted")


class MessagePatch(_Model):
    """`PATCH …/messages/{id}`: a field left out (or null) is left as it is."""

    is_read: bool | None = Field(default=None, description="mark it read (true) or unread (false)")
    tags: list[str] | None = Field(
        default=None, description="the new tag set (replaces it): at most 20 tags of 1-64 characters a-z 0-9 . _ - "
                                  "(stored lower case, sorted)")


class DeleteMessages(_Model):
    """`POST …/messages/delete`."""

    ids: list[Annotated[int, Field(ge=1, le=2**63 - 1)]] = Field(description="1 to 500 message ids")


class Extend(_Model):
    """`POST …/extend`."""

    ttl_seconds: int = Field(ge=-2**31, le=2**31 - 1,
                             description="expires_at becomes now + ttl_seconds, clamped to the plan's max_ttl_seconds, "
                                         "never earlier than it was; positive")


def body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra=` of a route that reads its JSON body itself (bounded, app._small_json): the body's
    schema in the OpenAPI document."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


# -- issue 44 item 9: send over HTTP ----------------------------------------------------------------


class SendAddress(BaseModel):
    """An address of a send request: Mailpit's `{"Email", "Name"}` (the Name is checked, not written)."""

    Email: str = Field(max_length=1000)
    Name: str | None = Field(default=None, max_length=1000)


class SendAttachment(BaseModel):
    """An attachment of a send request (Mailpit's; inline parts, `ContentID`, are refused)."""

    Content: str = Field(description="the file's bytes, base64 (a data: URL's prefix is dropped)")
    Filename: str = Field(max_length=1000, description="1-255 characters, no path separator")
    ContentType: str | None = Field(default=None, max_length=200,
                                    description="type/subtype; none or empty: application/octet-stream")
    ContentID: str | None = Field(default=None, max_length=1000, description="not supported: must be left out")


class SendRequest(BaseModel):
    """`POST /api/v1/send`: Mailpit's request shape and `Sender`. SQL (http_send_message) reads it by name
    and refuses a field it does not know, so extra keys pass this model to be named there."""

    model_config = ConfigDict(extra="allow")

    Sender: str | None = Field(default=None, max_length=1000,
                               description="the outbound sender (granted to the key) to send through; default: the "
                                           "granted sender whose address is From.Email, else the key's only one")
    From: SendAddress | str | None = Field(default=None, description="the sender's address (its From line is the "
                                                                     "sender's from_address)")
    To: list[SendAddress | str] | None = None
    Cc: list[SendAddress | str] | None = None
    Bcc: list[str] | None = Field(default=None, description="addresses (Mailpit's Bcc: strings)")
    ReplyTo: list[SendAddress | str] | None = Field(default=None, description="written as the Reply-To header")
    Subject: str | None = Field(default=None, description="at most 998 characters, no line break")
    Text: str | None = None
    HTML: str | None = None
    Headers: dict[str, str] | None = Field(default=None, description="extra headers (not From, To, Subject, …)")
    Attachments: list[SendAttachment] | None = Field(default=None, description="at most 20")


class Sent(_Model):
    """`POST /api/v1/send`: the queued message (Mailpit's `ID`, and mailroom's keys)."""

    ID: str = Field(description="the outbound queue's id, as a string (Mailpit's key)")
    outbound_id: int = Field(description="the same id as a number (mailroom outbound show)")
    message_id: str = Field(description="its Message-ID header, generated once: how to find it where it arrives")
    sender: str = Field(description="the sender it goes through")

# -- webhooks (sql/38_outbound_webhooks.sql, docs/webhooks.md) ------------------------------------


class WebhookRequest(BaseModel):
    """`POST /api/v1/webhooks`: the endpoint and the events of the key owner's inboxes it wants."""

    url: str = Field(pattern=_NO_NUL, max_length=2000, description="an http or https URL")
    events: list[str] = Field(min_length=1, max_length=8,
                              description="message.received and/or inbox.expired (the key owner's inboxes)")


class WebhookEndpoint(_Model):
    id: int
    url: str
    events: list[str]
    created_at: datetime
    queued: int = Field(description="its deliveries queued or being delivered")


class CreatedWebhookEndpoint(WebhookEndpoint):
    secret: str = Field(description="the whsec_ signing secret (Standard Webhooks): shown in this answer only")


class RemovedWebhookEndpoint(_Model):
    id: int
    removed: bool


class WebhookDelivery(_Model):
    id: int = Field(description="the delivery's id (its outbound queue id): replay it by this")
    event: str
    webhook_id: str = Field(description="the webhook-id header, the same on every attempt")
    status: str
    attempts: int
    possibly_sent: bool = Field(description="an attempt's answer was lost: the endpoint may have it twice")
    last_status: int | None = Field(description="the last HTTP status answered")
    next_retry_at: datetime | None
    created_at: datetime
    sent_at: datetime | None
    attempt_log: str | None = Field(description="one line per attempt (redacted)")


class ReplayedWebhookDelivery(_Model):
    id: int
    status: str
