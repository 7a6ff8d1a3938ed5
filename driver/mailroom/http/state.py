"""A server process of the HTTP face: its configuration, its State (pool, LISTEN hub, SNS verifier,
parsers, heartbeat) and the one error of a request (ApiError) with the HTTP answer to a database error.

app.py (the REST routes), page.py (the inbox page) and ses.py (the SES hook) all import this module;
it imports none of them, so http/ has no import circle (tests/http/test_imports.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from fastapi import FastAPI
from psycopg.types.string import TextLoader

from mailroom.api.errors import ApiError, db_error, error_body, unavailable  # noqa: F401 (the faces' one error shape)
from mailroom.api.waits import LookSlots, Waits
from mailroom.checks.links import LinkPolicy
from mailroom.checks.spam import Spamd
from mailroom.core.errors import Kind, kind_of
from mailroom.core.log import get_logger
from mailroom.core.ready import notify_ready
from mailroom.db.connect import alearn_vocabulary
from mailroom.db.heartbeat import SERVES_ENV
from mailroom.db.hub import Hub
from mailroom.db.pool import NoConnection, async_pool, front_call
from mailroom.db.worker import Worker
from mailroom.http import sqlapi
from mailroom.http.sns import SnsVerifier
from mailroom.inboxes.parsing import ParsePool

log = get_logger("http")

CONFIG_ENV = "MAILROOM_HTTP_CONFIG"

@dataclass
class HttpConfig:
    """Everything a server process needs; passed to uvicorn's worker processes as JSON (CONFIG_ENV)."""

    database_url: str
    listen_url: str | None = None
    pool_size: int = 8
    pool_timeout: float = 3.0  # seconds a request waits for a pooled connection before its 503
    statement_timeout: float = 5.0  # seconds: every statement of a request (db.pool.bounded_transaction), then 504
    poll_interval: float = 2.0
    keepalive: float = 15.0
    cors_origins: list[str] = field(default_factory=list)
    ses_topics: list[str] = field(default_factory=list)
    sns_cert_dir: str | None = None
    sns_ca_file: str | None = None
    sns_connect_to: str | None = None
    secure_cookies: bool = False
    access_log: bool = False
    # checks of the mail itself (docs/checks.md): the link check is off unless link_check; the spam
    # check unless spamd names host:port
    link_check: bool = False
    link_check_allow: list[str] = field(default_factory=list)
    spamd: str | None = None
    # the sink's open listing (docs/inboxes.md, the sink): http serve --sink on a loopback bind, or with
    # --sink-public; then the inbox listing without a key lists the sink's inboxes
    sink_listing: bool = False
    sink_public: bool = False  # --sink-public: the listing for any peer and Host (else loopback ones only)

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> HttpConfig:
        return cls(**json.loads(os.environ[CONFIG_ENV]))


def _jsonb_as_text(conn: psycopg.AsyncConnection) -> None:
    # the SQL functions answer JSON documents: passed through as text, never parsed and re-dumped
    conn.adapters.register_loader("jsonb", TextLoader)


class State:
    """A server process's connection pool, LISTEN hub and SNS verifier."""

    def __init__(self, config: HttpConfig) -> None:
        self.config = config
        self.pool = async_pool(config.database_url, max_size=config.pool_size, application_name="mailroom-http",
                               configure=_configure)
        # the worker skeleton (mailroom.db.worker) runs the heartbeats; its outage is the requests' too:
        # the database unreachable, one line, reminders, one line when it is back
        self.worker = Worker("http", log, url=config.database_url)
        self.outage = self.worker.outage
        self.hub = Hub(config.listen_url, poll_interval=config.poll_interval, indexer=self._index)
        # the process's long polls and event streams: counted against the caps SQL reads, one look a group
        self.waits = Waits(self.hub, caps=self._wait_caps, refuse=self._wait_refused)
        self.look_slots = LookSlots(config.pool_size)  # the looks of waits and event streams: half the pool
        # large messages are parsed in these processes (started on first use), never on the loop
        self.parser = ParsePool()
        self.sns: SnsVerifier | None = None
        # the checks' edge (docs/checks.md): None is off, and SQL refuses the check (MR280, MR281)
        self.link_policy = LinkPolicy.parse(config.link_check_allow) if config.link_check else None
        self.spamd = Spamd.parse(config.spamd) if config.spamd else None
        if config.ses_topics:
            connect_to = None
            if config.sns_connect_to:
                host, _, port = config.sns_connect_to.rpartition(":")
                connect_to = (host, int(port))
            self.sns = SnsVerifier(
                frozenset(config.ses_topics), cert_dir=Path(config.sns_cert_dir) if config.sns_cert_dir else None,
                ca_file=config.sns_ca_file, connect_to=connect_to,
            )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        await self.pool.open(wait=False)
        self.hub.start()
        log.info("serving (pid %d, pool %d, LISTEN %s, SES hook %s)", os.getpid(), self.config.pool_size,
                 "on" if self.config.listen_url else "off (polling)", "on" if self.sns else "off")
        # listed by `mailroom status` like every worker (kind http); `mailroom run` waits for the ready byte
        self.worker.heartbeat.serves = os.environ.get(SERVES_ENV)
        beats = asyncio.create_task(self.worker.abeat_every(self.pool.connection, listening=lambda: self.hub.listening))
        notify_ready()
        try:
            yield
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
            await self.worker.afinish()
            await self.hub.stop()
            await self.pool.close()
            await self.parser.close()

    async def _index(self, ids: list[int]) -> None:
        async with self.pool.connection() as conn:
            await sqlapi.index_messages.acall(conn, message_ids=ids)

    async def _wait_caps(self) -> dict[str, tuple[int, int, int]]:
        rows = await self.call(sqlapi.wait_caps, shape="rows")
        return {row.kind: (row.per_credential, row.total, row.per_client) for row in rows}

    async def _wait_refused(self, kind: str, scope: str) -> None:
        await self.call(sqlapi.wait_refused, kind=kind, scope=scope)  # raises SQL's refusal: 429, Retry-After

    async def look(self, fn: Any, **kwargs: Any) -> Any:
        """A call of a wait or an event stream (its looks): as `call`, at most half the pool at once
        (api/waits.py LookSlots)."""
        return await self.look_slots.run(lambda: self.call(fn, **kwargs))

    async def call(self, fn: Any, *, shape: str = "value", retry: bool = True, **kwargs: Any) -> Any:
        """One SQL call on a pooled connection, in a transaction whose statement timeout is the
        server's (--statement-timeout, SET LOCAL: the runtime roles are group roles, and a pooler
        drops startup options, so a login's or a URL's setting cannot be relied on).

        A pooled connection the server ended while it was idle (found before anything is sent) is
        replaced by the next one; nothing else is retried: a statement the server cancelled or
        terminated, or a connection lost under it, is answered (504, 503) and never run again.
        No connection within --pool-timeout: 503 with Retry-After. `retry` is kept for callers
        and means nothing more than that."""
        del retry

        async def run(conn: psycopg.AsyncConnection) -> Any:
            if shape == "rows":
                return await fn.arows(conn, **kwargs)
            if shape == "row":
                return await fn.arow(conn, **kwargs)
            return await fn.avalue(conn, **kwargs)

        try:
            result = await front_call(self.pool, run, pool_timeout=self.config.pool_timeout,
                                      statement_timeout=self.config.statement_timeout)
        except TimeoutError:
            self.outage.delay("no answer from the database")
            raise unavailable() from None
        except NoConnection as exc:
            if exc.cause is not None:
                self.outage.delay(exc.cause)
            raise unavailable() from None
        except psycopg.Error as exc:
            if kind_of(exc) is Kind.UNAVAILABLE and not exc.sqlstate:
                self.outage.delay(exc)  # the connection was lost: one line for the outage
            raise db_error(exc) from None
        self.outage.resumed()
        return result


def _configure(conn: psycopg.AsyncConnection) -> Any:
    async def configure() -> None:
        _jsonb_as_text(conn)
        await alearn_vocabulary(conn)  # once a process: each MR code's kind and HTTP status (mailroom.error_codes)

    return configure()
