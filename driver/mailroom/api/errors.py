"""The faces' one error shape (REST, the page, MCP over HTTP, the edge): a database error as an HTTP
answer, from its row of mailroom.error_codes (its status) or its kind, and the REST v1 ErrorResponse
body (`detail`, which the original service's clients read, beside mailroom's code and kind)."""

from __future__ import annotations

from typing import Any

import psycopg

from mailroom.core.errors import Kind, describe_db_error, error_code, kind_of
from mailroom.core.log import get_logger

log = get_logger("http")

# HTTP status of each kind of database error (mailroom.core.errors.kind_of); a code whose status says
# more than its kind (no or bad credentials 401, a too-large message 413, the creation rate limit 429,
# a long poll that timed out 408) has it in its row of mailroom.error_codes (http_status).
_KIND_STATUS = {
    Kind.USAGE: 400, Kind.CONFIG: 500, Kind.NOT_FOUND: 404, Kind.GONE: 404, Kind.LIMIT: 429,
    Kind.CONFLICT: 409, Kind.DENIED: 403, Kind.UNAVAILABLE: 503, Kind.INTERNAL: 500,
}


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
