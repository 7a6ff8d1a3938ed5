"""Connections: one place that opens psycopg connections and turns failures into one-line errors."""

from __future__ import annotations

import psycopg

from mailroom.errors import UserError, describe_db_error


def connect(url: str, *, autocommit: bool = True, application_name: str = "mailroom") -> psycopg.Connection:
    """Open a connection or raise UserError naming what went wrong (no password echoed)."""
    try:
        return psycopg.connect(url, autocommit=autocommit, application_name=application_name)
    except psycopg.Error as exc:
        raise UserError(f"cannot connect to the database: {describe_db_error(exc)}") from None


async def connect_async(
    url: str, *, autocommit: bool = True, application_name: str = "mailroom"
) -> psycopg.AsyncConnection:
    """Async twin of connect()."""
    try:
        return await psycopg.AsyncConnection.connect(
            url, autocommit=autocommit, application_name=application_name
        )
    except psycopg.Error as exc:
        raise UserError(f"cannot connect to the database: {describe_db_error(exc)}") from None
