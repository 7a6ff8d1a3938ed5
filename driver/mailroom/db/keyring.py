"""MAILROOM_SECRET_KEY is never silently ignored (issue 33, item 2).

Links are signed in the database with the keyring's active key (sql/15_keyring.sql). An operator
coming from a release that took MAILROOM_SECRET_KEY has a verifier holding that key: if it is not
the active key, every new link fails that verifier. So a command that signs (`collect`, and `send`,
which mints links at claim; `run` starts both) started with the variable set asks the database
whether that key is the active one and refuses to start, with one line naming the command that
fixes it, when it is not (exit 2). The key never travels: the command sends its fingerprint (the
first 8 bytes of sha256(key), the one `mailroom keys list` shows) to `signing_key_state_of`, which
answers the state of that one key and nothing else.

It lives in db/ because an area (`collect`), another area (`send`) and `db migrate` all read it: an area
never imports another (docs/architecture.md, Layering).
"""

from __future__ import annotations

import hashlib
import os

import psycopg

from mailroom.core.errors import ConfigError, Kind, kind_of

ENV = "MAILROOM_SECRET_KEY"
FIX = f"{ENV}=… mailroom keys import --active"


def fingerprint(key: bytes) -> str:
    """The keyring's fingerprint of a key: sha256(key), first 8 bytes, hex (mailroom_internal._key_fingerprint)."""
    return hashlib.sha256(key).digest()[:8].hex()


def env_fingerprint() -> str | None:
    """The fingerprint of MAILROOM_SECRET_KEY when it is set (ConfigError, exit 2, when it is not 64 hex
    characters); None when it is not set."""
    from mailroom.db.config import hex_key

    value = os.environ.get(ENV)
    if not value:
        return None
    key = hex_key(ENV, value)
    assert key is not None
    return fingerprint(key)


def check_at_start(url: str, command: str, fp: str | None) -> None:
    """Before the worker starts: the check on a short connection of its own, so a refusal is the only
    line the command prints. A database out of reach (or refusing the login) is left to the worker,
    which waits for it and checks once connected (check/acheck)."""
    from mailroom.db.connect import ConnectFailed, connect

    if fp is None:
        return
    try:
        conn = connect(url, application_name=f"mailroom-{command}", connect_timeout=5)
    except (ConnectFailed, psycopg.Error):
        return
    with conn:
        try:
            check(conn, command, fp)
        except psycopg.Error:
            return  # the worker meets it again, and says what it is


def refusal(command: str, fp: str, state: str | None) -> ConfigError | None:
    """The one line a command refuses to start with, or None when the key is the active one."""
    if state == "active":
        return None
    what = "not in the keyring" if state is None else f"a {state.replace('_', '-')} key of the keyring"
    return ConfigError(
        f"{command}: {ENV} (fingerprint {fp}) is {what}, not the active signing key, so a verifier holding it "
        f"would fail every new link: make it the active key with `{FIX}`, or unset {ENV}"
    )


def check(conn: psycopg.Connection, command: str, fp: str | None, log=None) -> None:  # noqa: ANN001
    """Raise the refusal when `fp` is not the active key (a no-op for None). On a schema older than the
    check (a worker started before `db migrate`) it says so in one line and goes on."""
    from mailroom.db import sqlapi

    if fp is None:
        return
    try:
        state = sqlapi.signing_key_state_of.value(conn, fingerprint=fp)
    except psycopg.Error as exc:
        if not conn.autocommit:
            conn.rollback()
        if kind_of(exc) is not Kind.UPGRADING:
            raise
        if log is not None:
            log.warning("WARN: cannot check %s against the keyring yet (the schema predates it: run "
                        "`mailroom db migrate`)", ENV)
        return
    if not conn.autocommit:
        conn.rollback()
    error = refusal(command, fp, state)
    if error is not None:
        raise error


async def acheck(conn: psycopg.AsyncConnection, command: str, fp: str | None, log=None) -> None:  # noqa: ANN001
    """check() for async workers."""
    from mailroom.db import sqlapi

    if fp is None:
        return
    try:
        state = await sqlapi.signing_key_state_of.avalue(conn, fingerprint=fp)
    except psycopg.Error as exc:
        if not conn.autocommit:
            await conn.rollback()
        if kind_of(exc) is not Kind.UPGRADING:
            raise
        if log is not None:
            log.warning("WARN: cannot check %s against the keyring yet (the schema predates it: run "
                        "`mailroom db migrate`)", ENV)
        return
    if not conn.autocommit:
        await conn.rollback()
    error = refusal(command, fp, state)
    if error is not None:
        raise error
