"""One-line errors for the CLI: raise UserError, never let a traceback reach the operator."""

from __future__ import annotations


class UserError(Exception):
    """An error the operator can act on; printed as one line, exits with `exit_code`."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class ConfigError(UserError):
    """Bad flag, environment variable or configuration value (exit code 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=2)


def describe_db_error(exc: BaseException) -> str:
    """A one-line description of a psycopg error: SQLSTATE and primary message."""
    sqlstate = getattr(exc, "sqlstate", None)
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = primary or str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{text} (SQLSTATE {sqlstate})" if sqlstate else text
