"""One-line errors for the CLI and the one map from SQLSTATE to what an error means.

Every driver asks `kind_of(exc)` what a database error means (bad input, not found, a rule that
refused, a lost connection, a schema being upgraded) instead of keeping its own list of
SQLSTATEs; the CLI turns a kind into an exit code. mailroom's own codes (MRnnn) are not listed
here: their kind, meaning and SMTP reply are rows of mailroom.error_codes, learned when a process
connects. Standard SQLSTATE classes (08 and 57 connection and shutdown, 42883 while an upgrade
runs, …) are classified here, once.

Kind.UPGRADING is what a worker meets when the schema changes under it (docs/upgrading.md): a
function it calls is missing or its signature changed (42883 and kin, below). A running worker
never exits for it: it retries with UpgradeBackoff (one log line when it starts waiting, one when
it resumes); collect, send, inbox serve and expire all do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

T = TypeVar("T")


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
    UPGRADING = "upgrading"  # the schema changed under the call (db migrate): retry with backoff
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
    http_status: int | None = None  # what the HTTP face answers where the kind's status says less


# mailroom's own SQLSTATEs are data in SQL (mailroom.error_codes, sql/04_error_codes.sql): a process
# learns them from the database when it first connects (mailroom.db.connect) and keeps no list of its
# own. A code it has not learned (an older schema, a code newer than the database) is USAGE.
_ERROR_CODES: dict[str, ErrorCode] = {}


def learn_error_codes(rows: Iterable[tuple[str, str, str, str | None, int | None]]) -> None:
    """Take (code, kind, meaning, smtp_reply, http_status) rows of mailroom.error_codes()."""
    for code, kind, meaning, smtp_reply, http_status in rows:
        try:
            known = Kind(kind)
        except ValueError:  # a kind this driver does not know yet
            known = Kind.USAGE
        _ERROR_CODES[code] = ErrorCode(known, meaning, smtp_reply, http_status)


def meanings() -> dict[str, str]:
    """Every learned MRnnn code with its meaning (mailroom.error_codes)."""
    return {code: entry.meaning for code, entry in _ERROR_CODES.items()}


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
    if is_upgrade_condition(exc):
        return Kind.UPGRADING
    if not sqlstate:
        # no SQLSTATE: a client-side connection failure (OperationalError / InterfaceError), or no
        # pooled connection within the wait (psycopg_pool's PoolTimeout): the database is unavailable
        name = type(exc).__name__
        return Kind.UNAVAILABLE if name in ("OperationalError", "InterfaceError", "ConnectionTimeout", "PoolTimeout") \
            else Kind.INTERNAL
    return _CLASS_KINDS.get(sqlstate[:2], Kind.INTERNAL)


# What a call meets while `db migrate` changes the schema it uses, or when the schema is older or
# newer than the caller (a worker of the previous release after a contract step, a new worker
# before the migrate). One transaction per migrate makes these rare; expand/contract (CONTRIBUTING)
# makes them a bug of the migration; a worker still only waits and retries.
UPGRADE_SQLSTATES: dict[str, str] = {
    "42883": "undefined_function",  # dropped, or its signature changed (a new argument, a new type)
    "42725": "ambiguous_function",  # an old and a new overload both match the call
    "42P01": "undefined_table",  # a relation a function reads was replaced
    "42704": "undefined_object",  # a type a call casts to was replaced
    "42703": "undefined_column",  # a result column the call names was renamed
}
# The same conditions, met by a statement planned against the old catalog and run against the new
# one: a function dropped and re-created between parse and execution, a cached plan whose result
# changed. PostgreSQL reports them with generic SQLSTATEs: recognised by their message.
UPGRADE_MESSAGES: dict[str, str] = {
    "XX000": "cache lookup failed for ",  # internal_error: the OID it resolved is gone
    "0A000": "cached plan must not change result type",  # feature_not_supported
}


def is_upgrade_condition(exc: BaseException) -> bool:
    """Whether `exc` is the schema changing under the call (Kind.UPGRADING): wait and retry."""
    sqlstate = getattr(exc, "sqlstate", None) or ""
    if sqlstate in UPGRADE_SQLSTATES:
        return True
    prefix = UPGRADE_MESSAGES.get(sqlstate)
    if prefix is None:
        return False
    diag = getattr(exc, "diag", None)
    primary = (getattr(diag, "message_primary", None) if diag is not None else None) or str(exc)
    return primary.startswith(prefix)


class UpgradeBackoff:
    """How long a worker waits before retrying a call that met Kind.UPGRADING, and its log lines.

    One per worker process, shared by its tasks: `delay(exc)` logs one line when the first call
    meets the condition and returns the next wait (FIRST doubling up to CAP seconds, then a
    reminder every REMIND seconds while it lasts); `resumed()` after a call succeeds logs one line
    if there was a wait, and resets."""

    FIRST = 0.2
    CAP = 5.0
    REMIND = 300.0

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.retries = 0
        self.next_wait = self.FIRST
        self.since = 0.0
        self.reminded = 0.0

    @property
    def waiting(self) -> bool:
        return self.retries > 0

    def delay(self, exc: BaseException) -> float:
        now = time.monotonic()
        if not self.retries:
            self.since = self.reminded = now
            self.log.warning("WARN: the schema changed under a call (%s): a `db migrate` is running or this "
                             "worker and the schema are of different releases; retrying with backoff",
                             describe_db_error(exc))
        elif now - self.reminded >= self.REMIND:
            self.reminded = now
            self.log.warning("WARN: still retrying after %.0fs: %s (run `mailroom db status`)", now - self.since,
                             describe_db_error(exc))
        self.retries += 1
        wait, self.next_wait = self.next_wait, min(self.next_wait * 2, self.CAP)
        return wait

    def resumed(self) -> None:
        if self.retries:
            self.log.info("schema available again: resumed after %d retr%s in %.1fs", self.retries,
                          "y" if self.retries == 1 else "ies", time.monotonic() - self.since)
        self.retries = 0
        self.next_wait = self.FIRST

    async def call(self, fn: Callable[[], Awaitable[T]], *, within: float = 30.0) -> T:
        """`await fn()` again while it fails with Kind.UPGRADING, for up to `within` seconds (then
        the last error is raised, for a caller that must answer someone: an SMTP client)."""
        deadline = time.monotonic() + within
        waited = False
        while True:
            try:
                result = await fn()
            except Exception as exc:
                if not is_upgrade_condition(exc) or time.monotonic() >= deadline:
                    raise
                waited = True
                await asyncio.sleep(min(self.delay(exc), max(0.0, deadline - time.monotonic())))
                continue
            if waited:  # (another call's success says nothing about the function this one waited for)
                self.resumed()
            return result


def describe_db_error(exc: BaseException) -> str:
    """A one-line description of a psycopg error: SQLSTATE and primary message, the role a refused
    call needs (mailroom.db.contract asks the catalog), 'database unreachable' for a connection
    that could not be made or was lost."""
    sqlstate = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = primary or str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = " ".join(text.split())
    if not sqlstate and kind_of(exc) is Kind.UNAVAILABLE:
        text = f"database unreachable: {text}"
    hints = [h for h in (getattr(diag, "message_hint", None) if diag is not None else None,
                         getattr(exc, "mailroom_hint", None)) if h]
    described = f"{text} (SQLSTATE {sqlstate})" if sqlstate else text
    return "; ".join([described, *(" ".join(h.split()) for h in hints)])


def db_user_error(exc: BaseException, prefix: str = "") -> UserError:
    """The UserError a CLI raises for a database error: its one line and the kind's exit code."""
    return UserError(f"{prefix}{describe_db_error(exc)}", kind_of(exc).exit_code)
