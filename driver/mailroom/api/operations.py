"""The inbox API, declared once: every operation of the REST API and the MCP server (docs/inbox-api.md).

One `Operation` per inbox operation: its name, the SQL function it calls (its `SqlFunction`, the very
declaration tests/db/test_contract.py checks against the migrated catalog), its arguments with their
type, bounds and one description, who may call it, the MR codes it may answer, what it answers, and
its faces: a REST method and path, an MCP tool. The faces are derived from it:

- MCP (mcp/server.py): every tool is built from its operation (its input schema, description, errors
  and annotations), and calls the operation's SQL function, the same one REST calls;
- REST (http/app.py): a `generic` route is built from its operation; a route with a body of its own
  (raw bytes, a frame, an event stream, a wait) is written by hand, its path, summary and status
  taken from here, and tests/http/test_operations.py checks its parameters against the declaration;
- docs/inbox-api.md is generated from this table (`python -m mailroom.api.operations > …`), and a test
  fails when it differs;
- tests/test_operations_story.py runs every operation over both of its faces from this table.

Adding an operation: its SQL function (sql/29_http.sql, with its pgTAP test), its entry here, the
regenerated docs/inbox-api.md and the schema snapshot (CONTRIBUTING.md, "A new inbox operation").
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from mailroom.db.contract import SqlFunction

REQUIRED: Any = ...  # an argument without a default

# who may call an operation: the credential its SQL function is given
INBOX = "inbox"  # an inbox's session token or an API key of its owner (REST); an API key (MCP)
OWNER = "owner"  # an API key (its owner's inboxes)
ANYONE = "anyone"  # anonymous (a session token is made) or an API key

_WHO = "p_address text, p_session_token text, p_key_digest bytea"
_OWNER = "p_key_digest bytea"


@dataclass(frozen=True)
class Arg:
    """One argument: `name` is the SQL function's keyword (its parameter without `p_`)."""

    name: str
    type: Any  # int, float, str, bool, list[int], list[str]
    doc: str
    default: Any = REQUIRED
    ge: float | None = None
    le: float | None = None
    rest: str | None = ""  # its REST name ("": the same; None: not on REST)
    mcp: str | None = ""  # its MCP name ("": the same; None: not on MCP)
    body: bool = False  # REST: a key of the JSON body (else a query parameter, or the path's)
    sql: bool = True  # False: the face's own (a wait's timeout), not an argument of the SQL function

    @property
    def rest_name(self) -> str | None:
        return self.name if self.rest == "" else self.rest

    @property
    def mcp_name(self) -> str | None:
        return self.name if self.mcp == "" else self.mcp

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Rest:
    method: str
    path: str
    summary: str
    model: str | None = None  # its response model in http/models.py ("list[X]": an array of X)
    status: int = 200
    errors: tuple[int, ...] = (400, 401, 403, 404, 503)
    tag: str = "messages"
    generic: bool = True  # built from the declaration (False: written by hand in http/app.py, checked)
    wrap: str | None = None  # a scalar SQL answer returned as {wrap: value}
    body_model: str | None = None  # the JSON body's model (http/models.py), for the OpenAPI document


@dataclass(frozen=True)
class Mcp:
    tool: str
    description: str
    read_only: bool = True
    destructive: bool = False
    idempotent: bool = True
    wrap: str | None = None  # a scalar SQL answer returned as {wrap: value}
    aliases: tuple[tuple[str, str], ...] = ()  # MCP-only extra keys: (new key, key of the answer), until 0.3.0
    omit: tuple[str, ...] = ()  # keys of the answer MCP leaves out (what it has no use for: a session token)
    generic: bool = True  # built from the declaration (False: written by hand in mcp/server.py, checked)


@dataclass(frozen=True)
class Operation:
    name: str
    sql: SqlFunction
    who: str
    doc: str  # what it answers (docs/inbox-api.md)
    args: tuple[Arg, ...] = ()
    rest: Rest | None = None
    mcp: Mcp | None = None
    fixed: dict[str, Any] = field(default_factory=dict)  # SQL arguments each face sets itself: face -> {name: value}

    def arg(self, name: str) -> Arg:
        return next(a for a in self.args if a.name == name)

    @property
    def errors(self) -> tuple[str, ...]:
        """The codes it may answer: the `Errors:` list of its SQL function's COMMENT (sql/29_http.sql), the
        one place they are written (no MR code is written in Python: tests/db/test_error_codes.py)."""
        return sql_errors().get(self.sql.name, ())


_COMMENT = re.compile(r"COMMENT ON FUNCTION mailroom\.(\w+)\([^)]*\) IS\s*((?:'(?:[^']|'')*'\s*)+);")
_ERRORS = re.compile(r"Errors: ((?:MR\d{3}(?:, )?)+)\.")


@functools.cache
def sql_errors() -> dict[str, tuple[str, ...]]:
    """Each function's `Errors:` list, read from the SQL the package carries (db/files.py), as it is read
    without a database: the faces build their tool descriptions and docs/inbox-api.md at import."""
    from mailroom.db.files import schema_files

    found: dict[str, tuple[str, ...]] = {}
    for f in schema_files().sql_files():
        for m in _COMMENT.finditer(f.read_text()):
            listed = _ERRORS.search(m.group(2).replace("'\n'", "").replace("''", "'"))
            if listed:
                found[m.group(1)] = tuple(listed.group(1).split(", "))
    return found

ADDRESS = Arg("address", str, "The inbox address, as create_inbox or list_inboxes gave it.")
MESSAGE_ID = Arg("message_id", int, "The message id, from wait_for_message or list_messages.", ge=1)


def _returns_json(name: str, params: str) -> SqlFunction:
    return SqlFunction(name, params, returns="jsonb")


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "create_mailbox",
        SqlFunction("http_create_mailbox",
                    f"{_OWNER}, p_client text, p_ttl_minutes integer = default, p_plan text = default,"
                    " p_face text = default", returns="jsonb"),
        ANYONE,
        "`201` `CreatedMailbox`: `address`, `expires_at`, `session_token` (anonymous), `plan`, limits. Anonymous "
        "callers get `http.anonymous_plan` (free); other plans need an API key (403). Rate limited per key "
        "or client (429). Over MCP the inbox's owner type is `mcp`.",
        args=(
            Arg("ttl_minutes", int, "Minutes until the inbox expires (default: the plan's; more than the plan's "
                "maximum is cut to it).", default=None, ge=-2**31, le=2**31 - 1),
            Arg("plan", str, "Plan of the inbox (default: free). Plans set TTL and limits.", default=None),
        ),
        rest=Rest("POST", "/api/v1/mailboxes", "Create an inbox (anonymous: the default plan; other plans need an "
                  "API key)", "CreatedMailbox", status=201, errors=(400, 401, 403, 413, 422, 429, 503),
                  tag="mailboxes", generic=False),
        mcp=Mcp("create_inbox", "Create a temporary email inbox. Returns {address, expires_at, plan, max_messages, "
                "max_message_bytes, …}. The address receives mail at once and until expires_at (its TTL); then it "
                "refuses mail and reads of it fail as expired. Too many creations: the error's message says in how "
                "many seconds to retry.", read_only=False, idempotent=False, omit=("session_token",)),
        fixed={"mcp": {"face": "mcp", "client": None}, "rest": {"face": "rest"}},
    ),
    Operation(
        "list_mailboxes",
        SqlFunction("http_list_mailboxes",
                    f"{_OWNER}, p_limit integer = default, p_offset integer = default, p_sink boolean = default",
                    returns="jsonb"),
        OWNER,
        "an API key's open inboxes (owner types `api` and `mcp`), newest first: a JSON array of `Mailbox`",
        args=(
            Arg("limit", int, "At most this many (1 to 500).", default=100, ge=1, le=500),
            Arg("offset", int, "Skip this many (paging).", default=0, ge=0, mcp=None),
        ),
        rest=Rest("GET", "/api/v1/mailboxes", "The API key's open inboxes (owner types api and mcp), newest first",
                  "list[Mailbox]", errors=(400, 401, 422, 503), tag="mailboxes", generic=False),
        mcp=Mcp("list_inboxes", "List this API key's open inboxes (those created over MCP and over the REST API), "
                "newest first: [{address, expires_at, message_count, plan, …}]."),
        fixed={"mcp": {"sink": False}},
    ),
    Operation(
        "get_mailbox",
        _returns_json("http_get_mailbox", _WHO),
        INBOX,
        "`Mailbox`: `address`, `expires_at`, `is_active`, plan, `message_count`, limits, `fault` (its injected "
        "fault, or `null`)",
        args=(ADDRESS,),
        rest=Rest("GET", "/api/v1/mailboxes/{address}", "An open inbox (404 once expired or deleted)", "Mailbox",
                  errors=(401, 403, 404, 503), tag="mailboxes"),
        mcp=Mcp("get_inbox", "One open inbox: {address, expires_at, message_count, plan, max_messages, fault, …}."),
    ),
    Operation(
        "delete_mailbox",
        SqlFunction("http_delete_mailbox", _WHO, returns="boolean"),
        INBOX,
        "`{\"deleted\": true}` (false if it was deleted already); it refuses mail at once",
        args=(ADDRESS,),
        rest=Rest("DELETE", "/api/v1/mailboxes/{address}", "Delete an inbox (it refuses mail at once)", "Deleted",
                  errors=(401, 403, 404, 503), tag="mailboxes", wrap="deleted"),
        mcp=Mcp("delete_inbox", "Delete an inbox: it refuses mail at once and its messages go. {deleted: true}, or "
                "false if it was deleted already.", read_only=False, destructive=True, wrap="deleted"),
    ),
    Operation(
        "extend_mailbox",
        _returns_json("http_extend_mailbox", f"{_WHO}, p_ttl_seconds integer"),
        INBOX,
        "`Mailbox` after: `expires_at` becomes now + `ttl_seconds`, clamped (not refused) to the plan's longest "
        "TTL (`max_ttl_seconds`); never earlier than it was",
        args=(ADDRESS, Arg("ttl_seconds", int, "The inbox expires this many seconds from now (cut to the plan's "
                           "max_ttl_seconds; never earlier than it would have).", ge=1, le=2**31 - 1, body=True)),
        rest=Rest("POST", "/api/v1/mailboxes/{address}/extend", "Extend the inbox: expires_at = now + ttl_seconds, "
                  "clamped to the plan's max_ttl_seconds, never earlier than it was", "Mailbox",
                  errors=(400, 401, 403, 404, 413, 503), tag="mailboxes", body_model="Extend"),
        mcp=Mcp("extend_inbox", "Keep an inbox open longer: expires_at = now + ttl_seconds within its plan's limit. "
                "The inbox after: {address, expires_at, max_ttl_seconds, …}.", read_only=False),
    ),
    Operation(
        "list_messages",
        _returns_json("http_list_messages",
                      f"{_WHO}, p_limit integer = default, p_offset integer = default, p_after_id bigint = default,"
                      " p_tag text = default, p_unread boolean = default, p_before_id bigint = default"),
        INBOX,
        "a page of its messages, newest first, as a JSON array of `MessageSummary` (`after`: only those delivered "
        "after that message; `tag`: with that tag; `unread`: unread only, or read only)",
        args=(
            ADDRESS,
            Arg("limit", int, "At most this many (1 to 500).", default=50, ge=1, le=500),
            Arg("offset", int, "Skip this many (paging).", default=0, ge=0),
            Arg("after_id", int, "Only messages whose id is greater than this one's.", default=None, ge=0,
                rest="after"),
            Arg("tag", str, "Only messages with this tag.", default=None),
            Arg("unread", bool, "true: unread only; false: read only.", default=None),
            Arg("before_id", int, "Keyset paging: only messages whose id is less than this one's (the last id of "
                "the previous page).", default=None, ge=0),
        ),
        rest=Rest("GET", "/api/v1/mailboxes/{address}/messages",
                  "Messages, newest first by id (limit/offset, or keyset: before_id= the last id of the previous "
                  "page; tag= a tag, unread=true/false): a JSON array",
                  "list[MessageSummary]", errors=(400, 401, 403, 404, 422, 503), generic=False),
        mcp=Mcp("list_messages", "List an inbox's messages, newest first: [{id, received_at, from, subject, snippet, "
                "is_read, tags, …}] (no bodies: read_message)."),
    ),
    Operation(
        "read_message",
        _returns_json("http_read_message", f"{_WHO}, p_message_id bigint"),
        INBOX,
        "`Message`: the summary's keys but `snippet`, and `body_text`, `body_html`, `attachments` (metadata), "
        "`headers` (`[name, value]` pairs), the extracted `link` and `code`; marks it read. Over MCP also `to`, "
        "`text`, `html` (aliases until 0.3.0)",
        args=(ADDRESS, MESSAGE_ID),
        rest=Rest("GET", "/api/v1/mailboxes/{address}/messages/{message_id}",
                  "One message: body_text, body_html, attachments' metadata, headers, the extracted link and code; "
                  "marks it read", "Message"),
        mcp=Mcp("read_message", "Read one message and mark it read: {id, from, to_address, subject, received_at, "
                "body_text, body_html, headers, attachments (metadata), link (the first http(s) link or null), code "
                "(a 5-digit code or null), tags}.", read_only=False,
                aliases=(("to", "to_address"), ("text", "body_text"), ("html", "body_html"))),
    ),
    Operation(
        "update_message",
        _returns_json("http_update_message",
                      f"{_WHO}, p_message_id bigint, p_is_read boolean = default, p_tags text[] = default"),
        INBOX,
        "mark it read or unread and/or replace its tag set (a key left out or null: unchanged); the "
        "`MessageSummary` after. Tags: at most 20, each 1–64 characters of `a-z 0-9 . _ -`, "
        "stored lower case. Mail to `box+tag@domain` arrives in `box@domain` already tagged",
        args=(ADDRESS, MESSAGE_ID,
              Arg("is_read", bool, "true: mark it read; false: unread. Default: unchanged.", default=None, body=True),
              Arg("tags", list[str], "The message's new tag set (replaces it): at most 20 tags of 1-64 characters "
                  "a-z 0-9 . _ - (stored lower case). Default: unchanged.", default=None, body=True)),
        rest=Rest("PATCH", "/api/v1/mailboxes/{address}/messages/{message_id}",
                  "Mark a message read or unread and/or replace its tags (a field left out: unchanged)",
                  "MessageSummary", errors=(400, 401, 403, 404, 413, 503), body_model="MessagePatch"),
        mcp=Mcp("mark_message", "Mark a message read or unread and/or set its tags: the message summary after "
                "({id, subject, is_read, tags, …}). Mail sent to box+tag@domain arrives in box@domain already tagged "
                "with tag.", read_only=False),
    ),
    Operation(
        "mark_all_read",
        _returns_json("http_mark_all_read", f"{_WHO}, p_is_read boolean = default"),
        INBOX,
        "every message of the inbox marked read (or, with `is_read` false, unread): `{\"marked\": n}`, the "
        "messages it changed",
        args=(ADDRESS, Arg("is_read", bool, "true: mark every message read; false: unread.", default=True,
                           body=True)),
        rest=Rest("POST", "/api/v1/mailboxes/{address}/messages/read", "Mark every message of the inbox read "
                  "(is_read false: unread)", errors=(400, 401, 403, 404, 413, 503)),
        mcp=Mcp("mark_all_read", "Mark every message of an inbox read (is_read false: unread): {marked: n}, the "
                "messages it changed.", read_only=False),
    ),
    Operation(
        "delete_message",
        SqlFunction("http_delete_message", f"{_WHO}, p_message_id bigint"),
        INBOX,
        "`{\"deleted\": true}`: one message deleted (it frees a place under the plan's count)",
        args=(ADDRESS, MESSAGE_ID),
        rest=Rest("DELETE", "/api/v1/mailboxes/{address}/messages/{message_id}", "Delete one message", "Deleted",
                  wrap="deleted"),
        mcp=Mcp("delete_message", "Delete one message of an inbox: {deleted: true}.", read_only=False,
                destructive=True, wrap="deleted"),
    ),
    Operation(
        "delete_messages",
        _returns_json("http_delete_messages", f"{_WHO}, p_message_ids bigint[]"),
        INBOX,
        "delete the selected messages (1 to 500 ids; ids not of this inbox are skipped, not counted): "
        "`{\"deleted\": n}`",
        args=(ADDRESS, Arg("message_ids", list[int], "The ids of the messages to delete (1 to 500).", rest="ids",
                           mcp="ids", body=True)),
        rest=Rest("POST", "/api/v1/mailboxes/{address}/messages/delete",
                  "Delete the messages of these ids (1 to 500; ids not in the inbox are not counted)", "DeletedCount",
                  errors=(400, 401, 403, 404, 413, 503), body_model="DeleteMessages"),
        mcp=Mcp("delete_messages", "Delete the messages of these ids from an inbox (ids not in it are skipped): "
                "{deleted: n}.", read_only=False, destructive=True),
    ),
    Operation(
        "clear_messages",
        _returns_json("http_clear_messages", _WHO),
        INBOX,
        "delete every message of the inbox, which stays open with its address: `{\"deleted\": n}`",
        args=(ADDRESS,),
        rest=Rest("DELETE", "/api/v1/mailboxes/{address}/messages", "Delete every message of the inbox (the inbox "
                  "stays)", "DeletedCount"),
        mcp=Mcp("clear_inbox", "Delete every message of an inbox; the inbox stays open and keeps its address: "
                "{deleted: n}.", read_only=False, destructive=True),
    ),
    Operation(
        "extract_link",
        SqlFunction("http_extract_link", f"{_WHO}, p_message_id bigint, p_url_like text = default", returns="text"),
        INBOX,
        "`{\"link\": …}`: the first http(s) link (text, else HTML part), LIKE `like` if given",
        args=(ADDRESS, MESSAGE_ID,
              Arg("url_like", str, "Only a link LIKE this (SQL LIKE), e.g. '%/activate%'. Default: the first http(s) "
                  "link.", default=None, rest="like")),
        rest=Rest("GET", "/api/v1/mailboxes/{address}/messages/{message_id}/links",
                  "The first http(s) link of a message (like= a LIKE pattern)", "Link", tag="extract", wrap="link"),
        mcp=Mcp("extract_link", "The first http(s) link of a message (text, else HTML part): {link}.", wrap="link"),
    ),
    Operation(
        "extract_code",
        SqlFunction("http_extract_code", f"{_WHO}, p_message_id bigint, p_pattern text = default", returns="text"),
        INBOX,
        "`{\"code\": …}`: a 5-digit word, or the match of a PostgreSQL regular expression (text, else the HTML's "
        "visible text)",
        args=(ADDRESS, MESSAGE_ID,
              Arg("pattern", str, "A PostgreSQL regular expression for the code, e.g. '\\m[A-Z0-9]{6}\\M'. Default: a "
                  "5-digit word.", default=None)),
        rest=Rest("GET", "/api/v1/mailboxes/{address}/messages/{message_id}/code",
                  "The code in a message (default: a 5-digit word; pattern= a regular expression)", "Code",
                  tag="extract", wrap="code"),
        mcp=Mcp("extract_code", "A one-time code in a message (text, else the HTML's visible text): {code}.",
                wrap="code"),
    ),
    Operation(
        "search_messages",
        _returns_json("http_search_messages",
                      f"{_WHO}, p_query text, p_limit integer = default, p_before_id bigint = default"),
        INBOX,
        "full-text search (subject, from, text), best first: `{\"query\", \"total\", \"messages\"}`",
        args=(ADDRESS,
              Arg("query", str, "What to find: words (as prefixes), \"phrases\", -not, or, and the qualifiers "
                  "from: to: subject: is: has: tag: before: after: (docs/inboxes.md).", rest="q"),
              Arg("limit", int, "At most this many (1 to 1000).", default=50, ge=1, le=1000),
              Arg("before_id", int, "Paging: the results after this message, the last of the previous page (best "
                  "first, then by id); the conflict error when it is gone: search again from the first page.",
                  default=None, ge=0)),
        rest=Rest("GET", "/api/v1/mailboxes/{address}/search", "Full-text search (subject, from, text), best first "
                  "(paged: before_id= the last id of the previous page)", "SearchResult",
                  errors=(400, 401, 403, 404, 409, 422, 503)),
        mcp=Mcp("search_messages", "Full-text search of an inbox's messages (subject, from, text), best first: "
                "{query, total, messages: [{id, subject, snippet, …}]}."),
    ),
    Operation(
        "wait_for_message",
        _returns_json("http_wait_look",
                      f"{_WHO}, p_subject_like text = default, p_after_id bigint = default,"
                      " p_last boolean = default"),
        INBOX,
        "the one wait (docs/http.md, The wait): the newest message whose subject is LIKE `subject` and, with "
        "`after`, whose id is greater, a `MessageSummary`, as soon as it is committed; the timeout's error after "
        "it (REST at most 600 s, MCP 300 s); expired or deleted as soon as the inbox is; the caps' errors over "
        "the server's caps",
        args=(ADDRESS,
              Arg("subject_like", str, "Only a message whose subject is LIKE this (SQL LIKE: % any text, _ one "
                  "character), e.g. 'Activate%'. Default: any message.", default=None, rest="subject"),
              Arg("timeout", float, "How long to wait, in seconds.", default=60, ge=0, le=600,
                  mcp="timeout_seconds", sql=False),
              Arg("after_id", int, "Only a message whose id is greater than this one's: pass the id of the message "
                  "you have (e.g. the first code's) to wait for the next one (a resent code). Default: any message.",
                  default=None, ge=0, rest="after")),
        rest=Rest("GET", "/api/v1/mailboxes/{address}/wait",
                  "Long poll: the newest message whose subject is LIKE subject= (and whose id is greater than "
                  "after=), within timeout= seconds; 410 when the inbox expires or is deleted meanwhile",
                  "MessageSummary", errors=(400, 401, 403, 404, 408, 410, 422, 429, 503), generic=False),
        mcp=Mcp("wait_for_message", "Wait until the inbox holds a message (matching subject_like, and newer than "
                "after_id, if given) and return the newest such one: {id, received_at, subject, from, envelope_from, "
                "snippet, …}; at once if one is there already. Then read_message, extract_link or extract_code with "
                "its id. Holds no database connection while it waits. When nothing arrived within timeout_seconds "
                "(0 to 300) it answers the no-message error: call it again to keep waiting. An inbox that expires or "
                "is deleted during the wait ends it at once with that error.", generic=False),
    ),
    Operation(
        "get_fault",
        _returns_json("http_inbox_fault", _WHO),
        INBOX,
        "the fault injected at the inbox's SMTP door, its own or its catch-all domain's; 404 when none",
        args=(ADDRESS,),
        rest=Rest("GET", "/api/v1/mailboxes/{address}/fault", "The fault injected at the inbox's SMTP door (its own, "
                  "else its catch-all domain's); 404 when none", "Fault", errors=(401, 403, 404, 503), tag="faults"),
        mcp=Mcp("get_inbox_fault", "Fault injection: the fault the inbox's SMTP server answers, {scope, stage, reply, "
                "share, remaining, fired, active, set_at}; the no-fault error when it has none."),
    ),
    Operation(
        "set_fault",
        _returns_json("http_set_inbox_fault",
                      f"{_WHO}, p_stage text, p_reply text, p_share numeric = default, p_count integer = default"),
        INBOX,
        "set (or replace) the inbox's fault: the inbound SMTP server answers the inbox `reply` at `stage` for "
        "`share` % of messages, only the next `count` if given; the fault JSON",
        args=(ADDRESS,
              Arg("stage", str, "Where the inbound SMTP server answers the reply: rcpt (the recipient is refused), data "
                  "(the message is refused, nothing stored) or after_data (stored, then the error: a retry "
                  "duplicates it).", body=True),
              Arg("reply", str, "The SMTP reply: 421, 450-452 or 550-554, an enhanced status code of the same class "
                  "and text, e.g. '451 4.3.0 Try again later'.", body=True),
              Arg("share", float, "The percentage of messages it answers, 0 to 100.", default=100, ge=0, le=100,
                  body=True),
              Arg("count", int, "Only the next this many messages (default: every one).", default=None, ge=1,
                  body=True)),
        rest=Rest("PUT", "/api/v1/mailboxes/{address}/fault", "Make the inbound SMTP server answer this inbox a "
                  "chosen 4xx/5xx reply at rcpt, data or after_data (every message, a share of them, or the next "
                  "count)", "Fault", errors=(400, 401, 403, 404, 413, 503), tag="faults", body_model="FaultRequest"),
        mcp=Mcp("set_inbox_fault", "Fault injection: make the inbox's SMTP server answer an error on purpose, to test "
                "an application's retries and bounce handling. Replaces the inbox's fault. Returns {scope, stage, "
                "reply, share, remaining, fired, active, set_at}; the inbox's JSON shows it as `fault`.",
                read_only=False),
    ),
    Operation(
        "clear_fault",
        SqlFunction("http_clear_inbox_fault", _WHO, returns="boolean"),
        INBOX,
        "`{\"deleted\": bool}`: the inbox's own fault cleared (its catch-all domain's stays); mail is accepted again",
        args=(ADDRESS,),
        rest=Rest("DELETE", "/api/v1/mailboxes/{address}/fault", "Clear the inbox's own fault (its catch-all "
                  "domain's stays); deleted false if it had none", "Deleted", errors=(401, 403, 404, 503),
                  tag="faults", wrap="deleted"),
        mcp=Mcp("clear_inbox_fault", "Fault injection: stop the inbox's own fault (mail is accepted again). "
                "{deleted: true}, or false if it had none.", read_only=False, wrap="deleted"),
    ),
)

BY_NAME: dict[str, Operation] = {op.name: op for op in OPERATIONS}
BY_TOOL: dict[str, Operation] = {op.mcp.tool: op for op in OPERATIONS if op.mcp is not None}


def sql_arguments(op: Operation, face: str, values: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of the operation's SQL call from a face's values (by the SQL names), with the
    arguments the face sets itself."""
    return {**values, **op.fixed.get(face, {})}


def answer(op: Operation, face: str, value: Any) -> Any:
    """The face's answer from the SQL function's: a scalar wrapped (`wrap`: a void function's answer is
    true, a boolean's its value), MCP's aliases added and its omitted keys left out."""
    spec = op.rest if face == "rest" else op.mcp
    if spec is not None and spec.wrap is not None:
        if op.sql.returns == "void":
            value = True
        elif op.sql.returns == "boolean":
            value = bool(value)
        return {spec.wrap: value}
    if face == "mcp" and op.mcp is not None and isinstance(value, dict):
        if op.mcp.aliases:
            value = {**value, **{new: value.get(old) for new, old in op.mcp.aliases}}
        if op.mcp.omit:
            value = {k: v for k, v in value.items() if k not in op.mcp.omit}
    return value


# -- docs/inbox-api.md, generated ------------------------------------------------------------------


def _rest_call(op: Operation) -> str:
    assert op.rest is not None
    query = [a.rest_name for a in op.args if a.rest_name and not a.body and f"{{{a.name}}}" not in op.rest.path]
    body = [a.rest_name for a in op.args if a.rest_name and a.body]
    text = f"{op.rest.method} {op.rest.path}"
    if query:
        text += "?" + "&".join(f"{q}=" for q in query)
    if body:
        text += " {" + ", ".join(f'"{b}"' for b in body) + "}"
    return f"`{text}`"


def _mcp_call(op: Operation) -> str:
    assert op.mcp is not None
    names = [(a.mcp_name or "") + ("" if a.required else "?") for a in op.args if a.mcp_name]
    return f"`{op.mcp.tool}({', '.join(names)})`"


def markdown() -> str:
    """docs/inbox-api.md: the table of every operation on both faces (tests/test_operations.py compares)."""
    lines = [
        "# The inbox API: every operation on REST and MCP",
        "",
        "Generated from `driver/mailroom/api/operations.py` (`python -m mailroom.api.operations > "
        "docs/inbox-api.md`); a test fails when this page and the table differ. Each operation is one SQL "
        "function of schema `mailroom`, called by both faces with the same arguments: REST authorizes it with a "
        "session token or an API key ([http.md](http.md)), MCP with an API key ([mcp.md](mcp.md)). Every "
        "operation's errors are the `Errors:` list of its SQL function's COMMENT; their meanings are in "
        "[inboxes.md](inboxes.md#errors) and [http.md](http.md).",
        "",
        "| operation | REST | MCP tool | SQL function | answers | errors |",
        "|---|---|---|---|---|---|",
    ]
    for op in OPERATIONS:
        rest = _rest_call(op) if op.rest else "—"
        mcp = _mcp_call(op) if op.mcp else "—"
        errors = ", ".join(f"`{c}`" for c in op.errors) or "—"
        lines.append(f"| `{op.name}` | {rest} | {mcp} | `{op.sql.name}` | {op.doc} | {errors} |")
    lines += ["", "## Arguments", ""]
    for op in OPERATIONS:
        if not op.args:
            continue
        lines += [f"**`{op.name}`**", "", "| argument | REST | MCP | type | default | bounds | what |",
                  "|---|---|---|---|---|---|---|"]
        for a in op.args:
            type_name = getattr(a.type, "__name__", None) if not hasattr(a.type, "__args__") else str(a.type)
            bounds = " ".join(x for x in (f"≥ {a.ge:g}" if a.ge is not None else "",
                                          f"≤ {a.le:g}" if a.le is not None else "") if x) or ""
            default = "required" if a.required else ("null" if a.default is None else f"`{a.default}`")
            lines.append(f"| `{a.name}` | {a.rest_name or '—'}{' (body)' if a.body else ''} | {a.mcp_name or '—'} "
                         f"| {type_name} | {default} | {bounds} | {a.doc} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
