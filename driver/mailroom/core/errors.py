"""One-line errors for the CLI and the one map from SQLSTATE to what an error means.

Every driver asks `kind_of(exc)` what a database error means (bad input, not found, a rule that
refused, a lost connection) instead of keeping its own list of SQLSTATEs; the CLI turns a kind
into an exit code. mailroom's own codes (MRnnn) are not listed here: their kind, meaning and SMTP
reply are rows of mailroom.error_codes, learned when a process connects. Standard SQLSTATE classes
(08 and 57 connection and shutdown, 42883 while an upgrade runs, …) are classified here, once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum


class UserError(Exception):
    """An error the operator can act on; printed as one line, exits with `exit_code`."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ConfigError(UserError):
    """Bad flag, environment variable or configuration value (exit code 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=2)


class Kind(Enum):
    """What a database error means to a caller."""

    USAGE = "usage"  # the caller passed something invalid: fix the input (exit 2)
    CONFIG = "config"  # a key or setting is missing or wrong: fix the configuration (exit 2)
    NOT_FOUND = "not_found"  # the thing named does not exist (or no longer does)
    GONE = "gone"  # it existed but is closed: expired, deleted, used, revoked
    LIMIT = "limit"  # a size, count or rate limit refused it
    CONFLICT = "conflict"  # it already exists, or its state forbids the change
    DENIED = "denied"  # the role or the credentials do not allow it
    UNAVAILABLE = "unavailable"  # the connection or the server failed: retry later
    INTERNAL = "internal"  # anything else: a bug or an unexpected server error

    @property
    def exit_code(self) -> int:
        return 2 if self in (Kind.USAGE, Kind.CONFIG) else 1


@dataclass(frozen=True)
class ErrorCode:
    """One of mailroom's own SQLSTATEs (MRnnn), as mailroom.error_codes describes it."""

    kind: Kind
    meaning: str
    smtp_reply: str | None  # what the inbound SMTP server answers for it, where it refuses mail


# mailroom's own SQLSTATEs are data in SQL (mailroom.error_codes, sql/04_error_codes.sql): a process
# learns them from the database when it first connects (mailroom.db.connect) and keeps no list of its
# own. A code it has not learned (an older schema, a code newer than the database) is USAGE.
_ERROR_CODES: dict[str, ErrorCode] = {}


def learn_error_codes(rows: Iterable[tuple[str, str, str, str | None]]) -> None:
    """Take (code, kind, meaning, smtp_reply) rows of mailroom.error_codes()."""
    for code, kind, meaning, smtp_reply in rows:
        try:
            known = Kind(kind)
        except ValueError:  # a kind this driver does not know yet
            known = Kind.USAGE
        _ERROR_CODES[code] = ErrorCode(known, meaning, smtp_reply)


def error_code(exc: BaseException) -> ErrorCode | None:
    """The vocabulary entry of an error's MRnnn SQLSTATE, if it has one that was learned."""
    return _ERROR_CODES.get(getattr(exc, "sqlstate", None) or "")


def smtp_reply_of(exc: BaseException) -> str | None:
    """The SMTP reply mailroom.error_codes gives an error's MRnnn SQLSTATE (None: not a refusal of mail)."""
    entry = error_code(exc)
    return entry.smtp_reply if entry is not None else None


# Standard SQLSTATE classes (first two characters).
_CLASS_KINDS: dict[str, Kind] = {
    "08": Kind.UNAVAILABLE,  # connection exception
    "57": Kind.UNAVAILABLE,  # operator intervention (admin shutdown, terminated backend)
    "53": Kind.UNAVAILABLE,  # insufficient resources
    "40": Kind.UNAVAILABLE,  # serialization failure, deadlock: a retry can succeed
    "22": Kind.USAGE,  # data exception
    "23": Kind.CONFLICT,  # integrity constraint violation
    "28": Kind.DENIED,  # invalid authorization
    "42": Kind.USAGE,  # syntax error or access rule violation (42501 below)
    "3D": Kind.CONFIG,  # invalid catalog name: no such database
    "3F": Kind.CONFIG,  # invalid schema name: mailroom is not installed
}


def kind_of(exc: BaseException) -> Kind:
    """What a psycopg error means: by mailroom's MR code, else by SQLSTATE class."""
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if sqlstate.startswith("MR"):
        entry = _ERROR_CODES.get(sqlstate)
        return entry.kind if entry is not None else Kind.USAGE
    if sqlstate == "42501":
        return Kind.DENIED
    if sqlstate in ("42883", "42P01"):  # undefined function / table: not installed or not migrated
        return Kind.CONFIG
    if not sqlstate:
        # no SQLSTATE: a client-side connection failure (OperationalError / InterfaceError)
        name = type(exc).__name__
        return Kind.UNAVAILABLE if name in ("OperationalError", "InterfaceError", "ConnectionTimeout") else Kind.INTERNAL
    return _CLASS_KINDS.get(sqlstate[:2], Kind.INTERNAL)


def describe_db_error(exc: BaseException) -> str:
    """A one-line description of a psycopg error: SQLSTATE and primary message."""
    sqlstate = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = primary or str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{text} (SQLSTATE {sqlstate})" if sqlstate else text


def db_user_error(exc: BaseException, prefix: str = "") -> UserError:
    """The UserError a CLI raises for a database error: its one line and the kind's exit code."""
    return UserError(f"{prefix}{describe_db_error(exc)}", kind_of(exc).exit_code)
