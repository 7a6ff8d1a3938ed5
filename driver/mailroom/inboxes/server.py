"""`mailroom inbox serve`: the listening inbound SMTP server and its database pool.

The protocol (aiosmtpd, limits, replies) is mailroom.inboxes.smtp; what it asks the database
(recipients, sizes, group-committed deliveries, bounces) is mailroom.inboxes.delivery; the
processes that parse large messages and bounces off the event loop are mailroom.inboxes.parsing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiosmtpd
import psycopg
from psycopg_pool import AsyncConnectionPool

from mailroom.core.errors import UserError, describe_db_error
from mailroom.core.log import get_logger
from mailroom.db import sqlapi as db_sqlapi
from mailroom.db.connect import connect_async, connection_kwargs
from mailroom.inboxes import sqlapi
from mailroom.inboxes.delivery import Delivery
from mailroom.inboxes.parsing import DEFAULT_WORKERS, ParsePool
from mailroom.inboxes.smtp import AIOSMTPD_TESTED, InboxHandler, _Busy, _SessionGate, _smtp_class

log = get_logger("inbox")


class InboundServer:
    """The listening server and its connection pool; run() until stop() (or SIGTERM in the CLI)."""

    def __init__(
        self,
        url: str,
        *,
        host: str = "127.0.0.1",
        port: int = 2525,
        max_recipients: int = 100,
        max_bad_recipients: int = 10,
        max_sessions: int = 100,
        idle_timeout: float = 300.0,
        max_line_length: int = 1000,
        pool_size: int = 4,
        data_size_limit: int | None = None,
        hostname: str | None = None,
        reuse_port: bool = False,
        parse_workers: int = DEFAULT_WORKERS,
    ) -> None:
        self.url = url
        self.reuse_port = reuse_port  # several worker processes listen on one port (--workers)
        self.host = host
        self.port = port
        self.max_recipients = max_recipients
        self.max_bad_recipients = max_bad_recipients
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self.max_line_length = max_line_length
        self.pool_size = pool_size
        self.data_size_limit = data_size_limit
        self.hostname = hostname
        self.parse_workers = parse_workers
        self.bound_port: int | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def stop(self) -> None:
        """Thread-safe: ask run() to finish."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def run(self, ready: Callable[[int], None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if aiosmtpd.__version__ not in AIOSMTPD_TESTED:
            log.warning("WARN: aiosmtpd %s is not a version inbox serve is tested with (%s)",
                        aiosmtpd.__version__, ", ".join(AIOSMTPD_TESTED))
        # One direct connection first: fails fast with the real reason (the pool would only time out).
        conn = await connect_async(self.url, application_name="mailroom-inbox")
        try:
            max_bytes = await sqlapi.max_inbound_message_bytes.avalue(conn)
            domain = await db_sqlapi.setting.avalue(conn, name="inbox.domain")
        except psycopg.Error as exc:
            raise UserError(f"cannot read inbox settings (is the database migrated?): {describe_db_error(exc)}") from None
        finally:
            await conn.close()
        pool = AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=self.pool_size,
            kwargs=connection_kwargs(application_name="mailroom-inbox"),
            open=False,
        )
        try:
            await pool.open(wait=True, timeout=10)
        except Exception as exc:  # noqa: BLE001 - PoolTimeout hides the cause
            await pool.close()
            raise UserError(f"cannot connect to the database: {describe_db_error(exc)}") from None
        size_limit = self.data_size_limit if self.data_size_limit is not None else int(max_bytes)
        # large messages and bounces are parsed in these processes, never on the event loop
        parser = ParsePool(workers=self.parse_workers)
        try:
            await parser.start()
        except Exception as exc:  # noqa: BLE001 - one line, never a traceback
            await pool.close()
            await parser.close()
            raise UserError(f"cannot start the parsing processes: {exc}") from None
        handler = InboxHandler(Delivery(pool, parser), max_recipients=self.max_recipients)
        smtp_class = _smtp_class(self.max_line_length)
        hostname = self.hostname or domain
        gate = _SessionGate(self.max_sessions)

        def factory() -> asyncio.Protocol:
            if not gate.enter():
                return _Busy()
            try:
                return smtp_class(
                    handler,
                    gate=gate,
                    max_bad_recipients=self.max_bad_recipients,
                    data_size_limit=size_limit or None,
                    enable_SMTPUTF8=True,
                    decode_data=False,
                    hostname=hostname,
                    ident="mailroom inbound",
                    timeout=self.idle_timeout,
                    loop=self._loop,
                )
            except BaseException:
                gate.leave()
                raise

        try:
            server = await self._loop.create_server(
                factory, host=self.host, port=self.port, reuse_port=self.reuse_port or None
            )
        except OSError as exc:
            await pool.close()
            await parser.close()
            raise UserError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        self.bound_port = server.sockets[0].getsockname()[1]
        log.info(
            "listening on %s:%d (SIZE %d, max %d recipients, %d refused recipients a session, %d sessions,"
            " idle timeout %gs)",
            self.host, self.bound_port, size_limit, self.max_recipients, self.max_bad_recipients,
            self.max_sessions, self.idle_timeout,
        )
        if ready is not None:
            ready(self.bound_port)
        try:
            await self._stop.wait()
        finally:
            server.close()
            # Let messages in DATA finish (their 250 follows COMMIT), then close the pool.
            try:
                await asyncio.wait_for(handler.idle.wait(), timeout=10)
            except TimeoutError:
                log.warning("stopping with %d delivery(ies) still running", handler.in_flight)
            await pool.close()
            await parser.close()
            log.info("stopped")
