"""The catalog probes of `mailroom doctor`: what the server, its roles and its settings say.

These read PostgreSQL's own catalogs and settings (pg_roles, pg_settings, backend pids, session
state, LISTEN/NOTIFY), not mailroom's API, so they are plain SQL text, kept here in one place; every
call of mailroom's API goes through a declared mailroom.db.contract.SqlFunction.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql


def _one(conn: psycopg.Connection, query: str, params: tuple = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def server_version(conn: psycopg.Connection) -> tuple[int, str]:
    """server_version_num and the version text."""
    return int(_one(conn, "SELECT current_setting('server_version_num')")), str(_one(conn, "SHOW server_version"))


def existing_roles(conn: psycopg.Connection, names: list[str]) -> set[str]:
    return {r for (r,) in conn.execute("SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)", (names,))}


def login_role(conn: psycopg.Connection) -> tuple[str, bool, bool, list[str]]:
    """The login role: its name, superuser, whether it can act as mailroom_owner, its mailroom_* groups."""
    return conn.execute(
        "SELECT r.rolname, r.rolsuper, pg_has_role(current_user, 'mailroom_owner', 'MEMBER'),"
        " array(SELECT g.rolname FROM pg_roles AS g WHERE g.rolname LIKE 'mailroom\\_%%'"
        "       AND g.rolname <> 'mailroom_owner' AND pg_has_role(current_user, g.oid, 'MEMBER') ORDER BY 1)"
        " FROM pg_roles AS r WHERE r.rolname = current_user"
    ).fetchone()


def backend_pid(conn: psycopg.Connection) -> int:
    return _one(conn, "SELECT pg_backend_pid()")


def set_session_value(conn: psycopg.Connection, value: str) -> None:
    """Session state a transaction pooler would carry to another client (mailroom.doctor_probe)."""
    _one(conn, "SELECT set_config('mailroom.doctor_probe', %s, false)", (value,))


def session_value(conn: psycopg.Connection) -> str | None:
    return _one(conn, "SELECT current_setting('mailroom.doctor_probe', true)")


LOG_SETTINGS = ("log_statement", "log_min_duration_statement", "log_min_duration_sample", "log_parameter_max_length",
                "log_parameter_max_length_on_error")


def log_settings(conn: psycopg.Connection) -> dict[str, str]:
    """The logging settings of this session (database and role settings applied)."""
    return dict(conn.execute("SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (list(LOG_SETTINGS),)))


def may_pin_clock(conn: psycopg.Connection) -> bool | None:
    """Whether the session user is a member of mailroom_timekeeper (None when the role is missing)."""
    return _one(conn, "SELECT pg_has_role(session_user, r.oid, 'MEMBER') FROM pg_roles AS r"
                      " WHERE r.rolname = 'mailroom_timekeeper'")


def listen(conn: psycopg.Connection, channel: str) -> None:
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


def notify(conn: psycopg.Connection, channel: str, payload: str) -> None:
    conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


def cron_expiry_jobs(conn: psycopg.Connection) -> list[str] | None:
    """The active pg_cron jobs this login can see that run inbox expiry (run_expiry, expire_mailboxes), by
    name or id; None when pg_cron is not installed in this database. (pg_cron shows a login its own jobs
    only, a superuser all of them.)"""
    if not _one(conn, "SELECT to_regclass('cron.job') IS NOT NULL"):
        return None
    try:
        with conn.transaction():
            rows = conn.execute(
                "SELECT coalesce(jobname, jobid::text) FROM cron.job"
                " WHERE active AND command ~* '(run_expiry|expire_mailboxes)' ORDER BY jobid").fetchall()
    except psycopg.errors.InsufficientPrivilege:
        return []
    return [r[0] for r in rows]
