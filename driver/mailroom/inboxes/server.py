"""`mailroom inbox serve`: the listening inbound SMTP server and its database pool.

The protocol (aiosmtpd, limits, replies) is mailroom.inboxes.smtp; what it asks the database
(recipients, sizes, group-committed deliveries, bounces) is mailroom.inboxes.delivery, each call
bounded by --db-timeout (451 past it); the processes that parse large messages and bounces off the
event loop are mailroom.inboxes.parsing. Started while the database is down, the server waits for
it (one log line) before it listens; cut off later, it answers 451 and logs the outage once and the
recovery once. It reports in like every worker (kind inbound: what it serves, its metrics) and,
on a clean exit, reports itself stopped. SMTP AUTH (mailroom.inboxes.auth): offered on a loopback
listener or after STARTTLS, checked by `mailroom.smtp_login`; --submission adds a second listener
on which it is required (never on the port that receives internet mail). What it stored and refused is one summary line every
--log-every (and one at the stop), none while idle: no line per message unless --log-messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from typing import Any

import aiosmtpd
import psycopg
from psycopg_pool import AsyncConnectionPool

from mailroom.core import eventloop
from mailroom.core.errors import Kind, UserError, describe_db_error
from mailroom.core.log import get_logger
from mailroom.core.ready import notify_ready
from mailroom.db import sqlapi as db_sqlapi
from mailroom.db.connect import ConnectFailed
from mailroom.db.pool import async_pool
from mailroom.db.worker import Worker, reason
from mailroom.inboxes import sqlapi
from mailroom.inboxes.auth import AcceptAnyLogin, Authenticator, CredentialLogin, LoginFailures, auth_needs_tls
from mailroom.inboxes.delivery import Delivery
from mailroom.inboxes.metrics import InboundMetrics
from mailroom.inboxes.parsing import DEFAULT_WORKERS, ParsePool
from mailroom.inboxes.smtp import AIOSMTPD_TESTED, InboxHandler, _Busy, _SessionGate, _smtp_class

log = get_logger("inbox")


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """The server side of STARTTLS: the certificate chain and its key (TLS 1.2 at least), or a
    configuration error in one line (exit 2) when they cannot be loaded."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
        raise UserError(f"cannot load the TLS certificate and key ({cert_file}, {key_file}): {reason}", 2) from None
    return context


def _log_summary(handler: InboxHandler) -> None:
    line = handler.tally.line()
    if line is not None:
        log.info("%s", line)


LISTEN_BACKLOG = 1024  # at least; --max-sessions when larger


class InboundServer(Worker):
    """The listening server and its connection pool, on the worker skeleton (mailroom.db.worker);
    run() until stop() (or SIGTERM: astop_on_signals)."""

    def __init__(
        self,
        url: str,
        *,
        host: str = "127.0.0.1",
        port: int = 2525,
        max_recipients: int = 100,
        max_bad_recipients: int = 10,
        max_sessions: int = 100,
        max_sessions_per_client: int | None = 10,
        idle_timeout: float = 300.0,
        max_line_length: int = 1000,
        pool_size: int = 4,
        data_size_limit: int | None = None,
        hostname: str | None = None,
        reuse_port: bool = False,
        parse_workers: int = DEFAULT_WORKERS,
        db_timeout: float = 5.0,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        tls_cert: str | None = None,
        tls_key: str | None = None,
        require_tls: bool = False,
        log_every: float = 60.0,
        sink: bool = False,
        submission: tuple[str, int] | None = None,
    ) -> None:
        if (tls_cert is None) != (tls_key is None):
            raise UserError("--tls-cert and --tls-key go together", 2)
        if require_tls and tls_cert is None:
            raise UserError("--require-tls needs --tls-cert and --tls-key", 2)
        self.tls_cert = tls_cert
        self.tls_key = tls_key
        self.require_tls = require_tls
        # (host, port) of the listener that requires AUTH; off a loopback address AUTH needs STARTTLS
        if submission is not None and auth_needs_tls(submission[0]) and tls_cert is None:
            raise UserError("--submission on a non-loopback address needs --tls-cert and --tls-key"
                            " (AUTH is offered there only after STARTTLS)", 2)
        self.submission = submission
        self.bound_submission_port: int | None = None
        super().__init__("inbound", log, url=url, metrics=InboundMetrics())
        self.db_timeout = db_timeout
        self.sink = sink  # --sink: passed to every RCPT call (docs/inboxes.md, the sink)
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.reuse_port = reuse_port  # several worker processes listen on one port (--workers)
        self.host = host
        self.port = port
        self.max_recipients = max_recipients
        self.max_bad_recipients = max_bad_recipients
        self.max_sessions = max_sessions
        self.max_sessions_per_client = max_sessions_per_client  # None: no per-client cap
        # connections the kernel queues before they are accepted (asyncio's default is 100): a burst of
        # clients larger than that lost their handshake's last ACK and hung up to two minutes without a
        # greeting (docs/reliability.md, "Load held"); the faces listen with 1,024 too. The kernel caps it
        # at net.core.somaxconn.
        self.backlog = max(LISTEN_BACKLOG, max_sessions)
        self.idle_timeout = idle_timeout
        self.max_line_length = max_line_length
        self.pool_size = pool_size
        self.data_size_limit = data_size_limit
        self.hostname = hostname
        self.parse_workers = parse_workers
        self.log_every = log_every  # seconds between summary lines (mailroom.inboxes.metrics.InboundTally)
        self.bound_port: int | None = None
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: AsyncConnectionPool | None = None

    def stop(self) -> None:
        """Thread-safe: ask run() to finish."""
        super().stop()
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)

    async def _settings(self) -> tuple[int, str] | None:
        """The largest message any plan takes and the inbox domain, waiting while the database is
        unreachable (None: stopped meanwhile); anything else ends the server with one line."""
        async def read() -> tuple[int, str]:
            # the first connection learns the SMTP replies of MR codes (mailroom.error_codes)
            async with await self.aconnect("mailroom-inbox") as conn:
                return (await sqlapi.max_inbound_message_bytes.avalue(conn),
                        await db_sqlapi.setting.avalue(conn, name="inbox.domain"))

        async def sleep(seconds: float) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), seconds)  # type: ignore[union-attr]

        try:
            return await self.await_database(read, stopping=self._stop.is_set, sleep=sleep)  # type: ignore[union-attr]
        except (psycopg.Error, ConnectFailed) as exc:
            kind = self.classify(exc)
            what = str(reason(exc)) if isinstance(exc, ConnectFailed) else describe_db_error(exc)
            if kind is Kind.DENIED:
                raise UserError(f"cannot read inbox settings: {what}", 2) from None
            raise UserError(f"cannot read inbox settings (is the database migrated?): {what}", kind.exit_code) from None

    def _beats(self) -> Any:
        """A heartbeat every ~10 s on a pooled connection (bounded like every call of the server), until
        the server stops: a heartbeat in flight then ends first, so the stop is said after it. Its
        success ends an outage at once (not at the next SMTP command)."""
        return self.abeat_every(lambda: self._pool.connection(timeout=self.db_timeout),  # type: ignore[union-attr]
                                stopping=self._stop, timeout=self.db_timeout)

    async def _summaries(self, handler: InboxHandler) -> None:
        """The summary line every --log-every while something happened (cancelled at the stop)."""
        while True:
            await asyncio.sleep(self.log_every)
            _log_summary(handler)

    async def run(self, ready: Callable[[int], None] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if aiosmtpd.__version__ not in AIOSMTPD_TESTED:
            log.warning("WARN: aiosmtpd %s is not a version inbox serve is tested with (%s)",
                        aiosmtpd.__version__, ", ".join(AIOSMTPD_TESTED))
        # loaded in this process (each worker of --workers has its own), before anything starts
        tls = tls_context(self.tls_cert, self.tls_key) if self.tls_cert and self.tls_key else None
        self.start_metrics(self.metrics_port, self.metrics_host)
        try:
            settings = await self._settings()
        except BaseException:
            self.metrics.shutdown()
            raise
        if settings is None:
            self.metrics.shutdown()
            log.info("stopped before it listened")
            return
        max_bytes, domain = settings
        pool = async_pool(self.url, max_size=self.pool_size, application_name="mailroom-inbox")
        self._pool = pool
        try:
            await pool.open(wait=True, timeout=10)
        except Exception as exc:  # noqa: BLE001 - PoolTimeout hides the cause
            await pool.close()
            self.metrics.shutdown()
            raise UserError(f"cannot connect to the database: {describe_db_error(exc)}") from None
        size_limit = self.data_size_limit if self.data_size_limit is not None else int(max_bytes)
        # large messages and bounces are parsed in these processes, never on the event loop; started
        # at the first one (an idle server holds none: issue 46, item 5)
        parser = ParsePool(workers=self.parse_workers, lazy=True)
        try:
            await parser.start()
        except Exception as exc:  # noqa: BLE001 - one line, never a traceback
            await pool.close()
            await parser.close()
            self.metrics.shutdown()
            raise UserError(f"cannot start the parsing processes: {exc}") from None
        handler = InboxHandler(Delivery(pool, parser, timeout=self.db_timeout, outage=self.outage, metrics=self.metrics,
                                        sink=self.sink),
                               max_recipients=self.max_recipients, metrics=self.metrics)
        smtp_class = _smtp_class(self.max_line_length)
        hostname = self.hostname or domain
        gate = _SessionGate(self.max_sessions, self.metrics, per_client=self.max_sessions_per_client)
        # the sink accepts any login (Mailpit's accept-any; docs/security.md), else the capture credential
        login: Authenticator = AcceptAnyLogin() if self.sink else CredentialLogin(handler.delivery)
        failures = LoginFailures()  # failed logins per client address, in this process (both listeners)

        def factory(host: str = self.host, auth_required: bool = False) -> asyncio.Protocol:
            if not gate.enter():
                return _Busy()
            try:
                return smtp_class(
                    handler,
                    gate=gate,
                    authenticator=login,
                    login_failures=failures,
                    auth_required=auth_required,
                    auth_require_tls=auth_needs_tls(host),
                    max_bad_recipients=self.max_bad_recipients,
                    data_size_limit=size_limit or None,
                    enable_SMTPUTF8=True,
                    decode_data=False,
                    hostname=hostname,
                    ident="mailroom inbound",
                    timeout=self.idle_timeout,
                    loop=self._loop,
                    tls_context=tls,
                    require_starttls=self.require_tls,
                )
            except BaseException:
                gate.leave()
                raise

        try:
            server = await self._loop.create_server(
                factory, host=self.host, port=self.port, reuse_port=self.reuse_port or None, backlog=self.backlog
            )
        except OSError as exc:
            await pool.close()
            await parser.close()
            self.metrics.shutdown()
            raise UserError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        self.bound_port = server.sockets[0].getsockname()[1]
        self.heartbeat.serves = f"smtp {self.host}:{self.bound_port}"
        submission_server = None
        if self.submission is not None:
            sub_host, sub_port = self.submission
            try:
                submission_server = await self._loop.create_server(
                    lambda: factory(sub_host, True), host=sub_host, port=sub_port, reuse_port=self.reuse_port or None,
                    backlog=self.backlog,
                )
            except OSError as exc:
                server.close()
                await pool.close()
                await parser.close()
                self.metrics.shutdown()
                raise UserError(f"cannot listen on {sub_host}:{sub_port}: {exc.strerror or exc}") from None
            self.bound_submission_port = submission_server.sockets[0].getsockname()[1]
            self.heartbeat.serves += f", submission {sub_host}:{self.bound_submission_port}"
        beats = asyncio.ensure_future(self._beats())
        summaries = asyncio.ensure_future(self._summaries(handler))
        log.info(
            "listening on %s:%d (SIZE %d, max %d recipients, %d refused recipients a session, %d sessions,"
            " %s sessions a client, idle timeout %gs, %s, event loop %s)",
            self.host, self.bound_port, size_limit, self.max_recipients, self.max_bad_recipients,
            self.max_sessions, self.max_sessions_per_client or "any", self.idle_timeout,
            "STARTTLS required" if self.require_tls else "STARTTLS offered" if tls else "no STARTTLS",
            eventloop.name(self._loop),
        )
        if submission_server is not None:
            log.info("AUTH required on the submission port %s:%d (%s)", self.submission[0],  # type: ignore[index]
                     self.bound_submission_port,
                     "offered after STARTTLS" if auth_needs_tls(self.submission[0]) else "loopback")  # type: ignore[index]
        if ready is not None:
            ready(self.bound_port)
        notify_ready()
        try:
            await self._stop.wait()
        finally:
            server.close()
            if submission_server is not None:
                submission_server.close()
            # Let messages in DATA finish (their 250 follows COMMIT), then close the pool.
            try:
                await asyncio.wait_for(handler.idle.wait(), timeout=10)
            except TimeoutError:
                log.warning("stopping with %d delivery(ies) still running", handler.in_flight)
            summaries.cancel()
            _log_summary(handler)  # what happened since the last one
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(beats, timeout=self.db_timeout)  # ends after a heartbeat in flight
            await pool.close()
            await parser.close()
            await self.afinish()
            log.info("stopped")
