"""The token collector: wait for token NOTIFYs, dequeue in batches on limit or timeout, reconnect.

The collector decides only *when* to call `mailroom.dequeue_tokens`; what is eligible, how a
token is signed and how an email is rendered all live in SQL. Two connections per collector:
- the listener (mailroom.db.listen): LISTEN on the listen URL, a direct connection; notifications
  are only hints. Without one, or while it cannot hear, the collector polls every poll interval;
- `work`: non-autocommit on the database URL (a transaction pooler is fine), one transaction per
  batch (dequeue → hand off → COMMIT); between batches, about every 10 s, a heartbeat
  (mailroom.db.heartbeat: alive, listening, tokens collected) in a transaction of its own.

Notification payloads are the number of tokens the inserting statement created; their sum is the
pending count. A batch is taken when the pending count reaches the limit, or when the batch
timeout has passed since the first notification of a quiet period; the collector then keeps
dequeuing while full batches come back, so a folded NOTIFY never strands tokens. On start and
after every reconnect it drains the backlog, because notifications sent while it was away are gone.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import time
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from mailroom.accounts.output import CommitLost, EnqueueSink, OutputClosed, StdoutSink
from mailroom.core.errors import ConfigError, UpgradeBackoff, UserError, describe_db_error, is_upgrade_condition
from mailroom.core.log import get_logger
from mailroom.db import heartbeat, sqlapi
from mailroom.db.connect import connect, connection_lost, ping
from mailroom.db.listen import Listener
from mailroom.db.reconnect import Backoff

OUTPUTS = ("csv", "jsonl")
MAX_BATCH_LIMIT = 100_000
MAX_MS = 24 * 3600 * 1000
MAX_CHANNEL_BYTES = 63  # NAMEDATALEN - 1
_RECONNECTED = object()  # queued by the listener after every (re)connect: drain the backlog


@dataclass(frozen=True)
class CollectorConfig:
    """Validated settings of one collector process."""

    url: str
    batch_limit: int = 10
    batch_timeout_ms: int = 5000
    healthcheck_ms: int = 270_000
    channel: str = "token_insert"
    output: str = "csv"
    enqueue: bool = False
    listen_url: str | None = None  # None: poll every poll_ms
    poll_ms: int = 1000


def _int_setting(name: str, value: str, low: int, high: int) -> int:
    text = value.strip()
    if not text.isdigit() or not text.isascii():
        raise ConfigError(f"{name} must be a whole number between {low} and {high}, got {value!r}")
    number = int(text)
    if not low <= number <= high:
        raise ConfigError(f"{name} must be between {low} and {high}, got {number}")
    return number


def parse_config(
    batch_limit: str,
    batch_timeout: str,
    healthcheck_interval: str,
    channel: str,
    output: str,
    enqueue: bool,
    poll_interval_ms: int = 1000,
) -> CollectorConfig:
    """Validate every flag / environment value; raise ConfigError (exit 2) on the first bad one.

    The URLs are filled in by the caller (they need the embedded cluster's state)."""
    limit = _int_setting("MAILROOM_BATCH_LIMIT", batch_limit, 1, MAX_BATCH_LIMIT)
    timeout_ms = _int_setting("MAILROOM_BATCH_TIMEOUT", batch_timeout, 0, MAX_MS)
    health_ms = _int_setting("MAILROOM_HEALTHCHECK_INTERVAL", healthcheck_interval, 1, MAX_MS)
    if health_ms < timeout_ms:
        raise ConfigError(
            f"MAILROOM_HEALTHCHECK_INTERVAL ({health_ms} ms) must be at least "
            f"MAILROOM_BATCH_TIMEOUT ({timeout_ms} ms)"
        )
    channel = channel.strip()
    if not channel:
        raise ConfigError("MAILROOM_CHANNEL_NAME is empty")
    if len(channel.encode()) > MAX_CHANNEL_BYTES or not channel.isprintable():
        raise ConfigError(
            f"MAILROOM_CHANNEL_NAME must be printable and at most {MAX_CHANNEL_BYTES} bytes"
        )
    output = output.strip().lower()
    if output not in OUTPUTS:
        raise ConfigError(f"--output must be one of {', '.join(OUTPUTS)}, got {output!r}")
    return CollectorConfig("", limit, timeout_ms, health_ms, channel, output, enqueue, None, poll_interval_ms)


WAIT_SLICE = 0.2  # longest uninterrupted wait, so a signal is honoured within a second
APP_NAME = "mailroom-collect"

# Connection-level failures: reconnect and resume. Anything else from the database is fatal.
RECONNECTABLE = (psycopg.OperationalError, psycopg.InterfaceError)

# A silent network loss must surface as an error, not a healthcheck hanging for the kernel's
# two-hour default: TCP keepalives unless the URL sets its own (libpq ignores them on sockets).
TCP_DEFAULTS = {"keepalives": "1", "keepalives_idle": "10", "keepalives_interval": "5",
                "keepalives_count": "3", "tcp_user_timeout": "30000"}


def with_tcp_defaults(url: str) -> str:
    """The URL plus TCP keepalive / user-timeout defaults for the keys it does not set."""
    try:
        given = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return url  # let connect() report the malformed URL
    missing = {k: v for k, v in TCP_DEFAULTS.items() if k not in given}
    return make_conninfo(url, **missing) if missing else url


class Collector:
    """One collector process. `run()` returns the exit code (0 after SIGTERM / SIGINT)."""

    def __init__(self, cfg: CollectorConfig) -> None:
        self.cfg = cfg
        self.log = get_logger("collect")
        self.sink = EnqueueSink() if cfg.enqueue else StdoutSink(cfg.output)
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # announced counts, or _RECONNECTED
        self.listener = Listener(
            with_tcp_defaults(cfg.listen_url) if cfg.listen_url else None,
            [cfg.channel],
            name=APP_NAME,
            log=self.log,
            on_notify=lambda _channel, payload: self.events.put(_announced(payload)),
            on_connect=lambda: self.events.put(_RECONNECTED),
            check_interval=min(cfg.healthcheck_ms / 1000, 60.0),
            poll_hint=f"polling every {cfg.poll_ms} ms",
        )
        self.heartbeat = heartbeat.Heartbeat(heartbeat.worker_name(), "collector", self.log)
        self.upgrade = UpgradeBackoff(self.log)
        self.work: psycopg.Connection | None = None
        self.stopping = False
        self.must_drain = True
        self.pending = 0  # tokens announced by notifications since the last batch
        self.first_at = 0.0  # monotonic time of the first notification of this quiet period
        self.last_check = 0.0  # monotonic time of the last round trip that proved the work link alive
        self.url = with_tcp_defaults(cfg.url)
        self.timeout = cfg.batch_timeout_ms / 1000
        self.health = cfg.healthcheck_ms / 1000
        self.poll = cfg.poll_ms / 1000

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> int:
        self._install_signals()
        c = self.cfg
        self.log.info(
            "configured; channel=%s limit=%d timeout=%dms healthcheck-interval=%dms output=%s",
            c.channel, c.batch_limit, c.batch_timeout_ms, c.healthcheck_ms,
            "enqueue" if c.enqueue else c.output,
        )
        try:
            self._connect()  # the first failure is fatal: a bad URL should not spin forever
            self.listener.start()
            while not self.stopping:
                try:
                    if self.work is None:
                        self._reconnect()
                    else:
                        self._step()
                except RECONNECTABLE as exc:
                    self._lost(describe_db_error(exc))
                except psycopg.Error as exc:
                    if self.work is not None and not connection_lost(self.work, exc) and is_upgrade_condition(exc):
                        self._wait_for_schema(exc)
                        continue
                    if self.work is None or not connection_lost(self.work, exc):
                        raise
                    self._lost(describe_db_error(exc))  # e.g. PgBouncer: a server connection crashed
                except CommitLost as exc:
                    self.log.warning(
                        "WARN: connection lost while committing a written batch of %d tokens; "
                        "those that come back get new links and are written again", exc.rows,
                    )
                    self._lost(describe_db_error(exc.cause))
        except OutputClosed as exc:
            self._close()
            self.listener.stop()
            raise UserError(
                f"stdout closed ({exc.reason}); rolled back the unwritten batch of {exc.rows} "
                "tokens, which stay eligible for the next collector"
            ) from None
        except psycopg.Error as exc:
            self._close()
            self.listener.stop()
            raise UserError(f"collector stopped: {describe_db_error(exc)}") from None
        self._close()
        self.listener.stop()
        self.log.info("stopped")
        return 0

    def _install_signals(self) -> None:
        def stop(signum: int, _frame: object) -> None:
            if self.stopping:  # second signal: give up on the in-flight batch (it rolls back)
                raise SystemExit(128 + signum)
            self.stopping = True
            self.log.info("received %s; finishing the current batch", signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

    # -- connections -------------------------------------------------------------------------

    def _connect(self) -> None:
        work = connect(self.url, autocommit=False, application_name=APP_NAME)
        self.work = work
        info = work.info
        self.log.info(
            "connected; host=%s port=%s dbname=%s user=%s",
            info.host, info.port, info.dbname, info.user,
        )
        self._check_channel()
        self.pending = 0
        self.must_drain = True  # notifications sent while we were away are gone
        self.last_check = time.monotonic()

    def _check_channel(self) -> None:
        """Warn when the tokens trigger notifies another channel than the one we LISTEN on."""
        assert self.work is not None
        try:
            channel = sqlapi.setting.value(self.work, name="tokens.channel")
        except RECONNECTABLE:
            raise
        except psycopg.Error:
            self.work.rollback()
            return  # setting absent (older schema): nothing to compare
        self.work.rollback()
        if channel and channel != self.cfg.channel:
            self.log.warning(
                "WARN: setting tokens.channel is %r but MAILROOM_CHANNEL_NAME is %r; "
                "only the backlog drain and the idle sweep will find new tokens",
                channel, self.cfg.channel,
            )

    def _close(self) -> None:
        if self.work is not None:
            with contextlib.suppress(Exception):  # closing a dead connection
                self.work.close()
        self.work = None

    def _lost(self, reason: str) -> None:
        self.log.warning("WARN: connection lost: %s", reason)
        self._close()

    def _reconnect(self) -> None:
        backoff = Backoff()
        attempt = 0
        while not self.stopping:
            attempt += 1
            self.log.info("reconnecting (attempt %d)", attempt)
            try:
                self._connect()
            except UserError as exc:
                delay = backoff.next()
                self.log.warning("WARN: %s; retrying in %.1fs", exc, delay)
                self._sleep(delay)
                continue
            return

    def _wait_for_schema(self, exc: psycopg.Error) -> None:
        """The schema changed under the batch (docs/upgrading.md): it rolled back; wait, then drain."""
        assert self.work is not None
        self.work.rollback()
        self.must_drain = True  # the announced tokens are still there: take them when it works again
        self._sleep(self.upgrade.delay(exc))

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, WAIT_SLICE))

    # -- the loop ----------------------------------------------------------------------------

    def _step(self) -> None:
        if self.heartbeat.due(self.listener.listening):
            self._beat()
            return
        if self.must_drain:
            self._drain("backlog")
            self.must_drain = False
            return
        now = time.monotonic()
        if self.pending >= self.cfg.batch_limit:
            self._process("limit")
            return
        if self.pending and now - self.first_at >= self.timeout:
            self._process("timeout")
            return
        if self.pending:
            wait = self.first_at + self.timeout - now
        else:
            # listening: a healthcheck (and sweep) now and then; not listening: poll
            idle = self.health if self.listener.listening else self.poll
            wait = self.last_check + idle - now
            if wait <= 0:
                self._healthcheck()
                return
        self._wait(min(wait, WAIT_SLICE))

    def _wait(self, seconds: float) -> None:
        """Take what the listener heard within `seconds`: token counts, or a reconnect."""
        try:
            event = self.events.get(timeout=max(seconds, 0.0))
        except queue.Empty:
            return
        while True:
            if event is _RECONNECTED:
                self.must_drain = True
            else:
                if not self.pending:
                    self.first_at = time.monotonic()
                    self.log.info("woke up (NOTIFY)")
                self.pending += event
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return

    def _beat(self) -> None:
        """One heartbeat in its own short transaction on the work connection."""
        assert self.work is not None
        params = self.heartbeat.params(self.listener.listening)
        try:
            sqlapi.worker_heartbeat.call(self.work, **params)
            self.work.commit()
        except psycopg.Error as exc:
            if connection_lost(self.work, exc):
                raise
            self.work.rollback()
            self.heartbeat.failed(exc, bool(params["listening"]))
            return
        self.heartbeat.sent(params)

    def _healthcheck(self) -> None:
        """One sweep for tokens no notification announced (also the poll when not listening).

        The sweep catches tokens that became eligible again without a notification, such as a
        batch rolled back by another collector whose stdout closed; its round trip proves the
        work connection alive.
        """
        assert self.work is not None
        ping(self.work)
        self.work.rollback()
        swept = self._drain(None)
        if swept:
            self.log.info("sweep: collected %d tokens no notification announced", swept)
        self.last_check = time.monotonic()

    def _process(self, reason: str) -> None:
        self.log.info("processing %d rows (%s)", self.pending, reason)
        announced = self.pending
        self.pending = 0
        total = self._drain(None)
        if total != announced:
            self.log.info("collected %d tokens (%d announced)", total, announced)

    def _drain(self, what: str | None) -> int:
        """Run batches of the limit until one comes back short (or we are asked to stop)."""
        assert self.work is not None
        limit = self.cfg.batch_limit
        total = batches = 0
        while True:
            got = self.sink.run_batch(self.work, limit)
            total += got
            batches += got > 0
            if got < limit or self.stopping:
                break
        self.heartbeat.claimed += total
        self.last_check = time.monotonic()
        self.upgrade.resumed()
        if what and not self.stopping:
            self.sink.settle()
        if self.sink.reissued:
            self.log.warning("WARN: %d tokens written before a lost commit came back: written again with new links "
                             "(the links of the earlier lines never took effect)", self.sink.reissued)
            self.sink.reissued = 0
        if what:
            if total:
                self.log.info("%s: collected %d tokens in %d batches", what, total, batches)
            if self.listener.listening:
                self.log.info("waiting for notifications on %s", self.cfg.channel)
            else:
                self.log.info("polling every %d ms", self.cfg.poll_ms)
        return total


def _announced(payload: str) -> int:
    """Tokens announced by one notification: its decimal payload, else 1 (a bare NOTIFY)."""
    text = payload.strip()
    if text.isdigit() and text.isascii():
        return max(int(text), 1)
    return 1
