"""One-line errors for the CLI and the one map from SQLSTATE to what an error means.

Every driver asks `kind_of(exc)` what a database error means (bad input, not found, a rule that
refused, a lost connection) instead of keeping its own list of SQLSTATEs; the CLI turns a kind
into an exit code, the inbound server into an SMTP reply.
"""

from __future__ import annotations

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


# mailroom's own SQLSTATEs (docs/<area>.md lists their messages). Unlisted MR codes are USAGE.
_MR_KINDS: dict[str, Kind] = {
    # foundation
    "MR001": Kind.USAGE, "MR002": Kind.CONFIG, "MR003": Kind.USAGE, "MR004": Kind.CONFIG, "MR005": Kind.DENIED,
    # accounts and tokens
    "MR102": Kind.CONFLICT, "MR103": Kind.CONFLICT, "MR105": Kind.NOT_FOUND, "MR106": Kind.CONFLICT,
    "MR107": Kind.CONFLICT, "MR108": Kind.CONFLICT, "MR111": Kind.DENIED, "MR112": Kind.NOT_FOUND,
    "MR113": Kind.GONE, "MR114": Kind.GONE, "MR116": Kind.GONE, "MR117": Kind.GONE,
    "MR118": Kind.CONFLICT, "MR120": Kind.CONFIG,
    # inboxes
    "MR203": Kind.NOT_FOUND, "MR204": Kind.DENIED, "MR205": Kind.GONE, "MR206": Kind.GONE,
    "MR207": Kind.LIMIT, "MR208": Kind.LIMIT, "MR209": Kind.NOT_FOUND,
    "MR212": Kind.NOT_FOUND, "MR213": Kind.USAGE, "MR214": Kind.USAGE, "MR215": Kind.NOT_FOUND,
    # outbound
    "MR301": Kind.NOT_FOUND, "MR304": Kind.LIMIT, "MR306": Kind.LIMIT, "MR314": Kind.CONFIG,
    "MR315": Kind.CONFIG, "MR318": Kind.CONFLICT, "MR340": Kind.NOT_FOUND, "MR341": Kind.CONFLICT,
    "MR323": Kind.CONFIG, "MR372": Kind.NOT_FOUND, "MR373": Kind.CONFLICT,
    # collector
    "MR401": Kind.CONFIG, "MR402": Kind.CONFIG, "MR404": Kind.CONFIG,
}

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
        return _MR_KINDS.get(sqlstate, Kind.USAGE)
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
