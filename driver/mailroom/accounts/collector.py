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

Started while the database is down, or cut off later, it waits and retries (mailroom.core.outage:
one line when the wait starts, one when it recovers); a connection refused for good (a wrong
password, no such database) ends it with one line. On a clean exit it reports itself stopped.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import time
from dataclasses import dataclass

import psycopg

from mailroom.accounts.output import CommitLost, EnqueueSink, OutputClosed, StdoutSink
from mailroom.core.errors import ConfigError, Kind, UserError, describe_db_error
from mailroom.core.log import get_logger
from mailroom.core.metrics import NullMetrics
from mailroom.core.ready import notify_ready
from mailroom.db import keyring, sqlapi
from mailroom.db.connect import ConnectFailed, connection_lost, ping
from mailroom.db.worker import Worker

OUTPUTS = ("csv", "jsonl")
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
    metrics_port: int | None = None  # Prometheus /metrics (mailroom.accounts.metrics), off when None
    metrics_host: str = "127.0.0.1"
    key_fingerprint: str | None = None  # of MAILROOM_SECRET_KEY: checked once connected (db/keyring.py)


def parse_config(
    batch_limit: int,
    batch_timeout: float,
    healthcheck_interval: float,
    channel: str,
    output: str,
    enqueue: bool,
    poll_interval: float = 1.0,
) -> CollectorConfig:
    """Check what the options cannot check alone; raise ConfigError (exit 2) on the first bad value.

    The durations are seconds (the command line parsed them); the URLs are filled in by the caller
    (they need the embedded cluster's state)."""
    timeout_ms = round(batch_timeout * 1000)
    health_ms = round(healthcheck_interval * 1000)
    if health_ms < timeout_ms:
        raise ConfigError(
            f"MAILROOM_HEALTHCHECK_INTERVAL ({healthcheck_interval:g}s) must be at least "
            f"MAILROOM_BATCH_TIMEOUT ({batch_timeout:g}s)"
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
    return CollectorConfig("", batch_limit, timeout_ms, health_ms, channel, output, enqueue, None,
                           max(1, round(poll_interval * 1000)))


WAIT_SLICE = 0.2  # longest uninterrupted wait, so a signal is honoured within a second
APP_NAME = "mailroom-collect"

# Connection-level failures: reconnect and resume. Anything else from the database is fatal.
RECONNECTABLE = (psycopg.OperationalError, psycopg.InterfaceError)


class Collector(Worker):
    """One collector process, on the worker skeleton (mailroom.db.worker). `run()` returns the exit
    code (0 after SIGTERM / SIGINT)."""

    def __init__(self, cfg: CollectorConfig) -> None:
        if cfg.metrics_port is not None:  # (prometheus_client is loaded only by a worker that serves metrics)
            from mailroom.accounts.metrics import CollectorMetrics
        super().__init__("collector", get_logger("collect"), url=cfg.url,
                         metrics=CollectorMetrics() if cfg.metrics_port is not None else NullMetrics())
        self.cfg = cfg
        self.sink = EnqueueSink() if cfg.enqueue else StdoutSink(cfg.output)
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # announced counts, or _RECONNECTED
        self.listen(
            cfg.listen_url,
            [cfg.channel],
            name=APP_NAME,
            on_notify=lambda _channel, payload: self.events.put(_announced(payload)),
            on_connect=lambda: self.events.put(_RECONNECTED),
            check_interval=min(cfg.healthcheck_ms / 1000, 60.0),
            poll_hint=f"polling every {cfg.poll_ms} ms",
        )
        self.work: psycopg.Connection | None = None
        self.stopping = False
        self.must_drain = True
        # a drain that began while listening after the listener's connect N covers connect N's
        # "look for work" (sql/08_notify.sql): its _RECONNECTED does not drain a second time
        self.drained_after_connect = -1
        self.pending = 0  # tokens announced by notifications since the last batch
        self.first_at = 0.0  # monotonic time of the first notification of this quiet period
        self.last_check = 0.0  # monotonic time of the last round trip that proved the work link alive
        self.timeout = cfg.batch_timeout_ms / 1000
        self.health = cfg.healthcheck_ms / 1000
        self.poll = cfg.poll_ms / 1000

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> int:
        self.stop_on_signals()
        c = self.cfg
        self.log.info(
            "configured; channel=%s limit=%d timeout=%dms healthcheck-interval=%dms output=%s",
            c.channel, c.batch_limit, c.batch_timeout_ms, c.healthcheck_ms,
            "enqueue" if c.enqueue else c.output,
        )
        self.start_metrics(c.metrics_port, c.metrics_host)
        try:
            # started while the database is down: wait for it (a wrong password or database name is fatal)
            if self._connect_waiting():
                assert self.work is not None
                keyring.check(self.work, "collect", c.key_fingerprint, self.log)  # before anything is signed
                assert self.listener is not None
                self.listener.start()
                notify_ready()
            while not self.stopping:
                try:
                    if self.work is None:
                        self._connect_waiting()
                    else:
                        self._step()
                except RECONNECTABLE as exc:
                    self._lost(describe_db_error(exc))
                except psycopg.Error as exc:
                    if self.work is not None and not connection_lost(self.work, exc) \
                            and self.classify(exc) is Kind.UPGRADING:
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
            self._shutdown()
            raise UserError(
                f"stdout closed ({exc.reason}); rolled back the unwritten batch of {exc.rows} "
                "tokens, which stay eligible for the next collector"
            ) from None
        except psycopg.Error as exc:
            self._shutdown()
            raise UserError(f"collector stopped: {describe_db_error(exc)}") from None
        except (ConnectFailed, ConfigError):
            self._shutdown()
            raise
        self._shutdown(clean=True)
        self.log.info("stopped")
        return 0

    def _shutdown(self, clean: bool = False) -> None:
        self._close()
        self.finish(report=clean)  # a clean exit is listed as stopped, not lost

    def on_signal(self, signum: int) -> None:
        if self.stopping:  # second signal: give up on the in-flight batch (it rolls back)
            raise SystemExit(128 + signum)
        self.stop()
        self.log.info("received %s; finishing the current batch", signal.Signals(signum).name)

    def stop(self) -> None:
        super().stop()
        self.stopping = True

    # -- connections -------------------------------------------------------------------------

    def _connect(self) -> None:
        work = self.connect(APP_NAME, autocommit=False)
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
        if not self.outage.waiting:
            self.log.warning("WARN: connection lost (%s): reconnecting", reason)
        self.metrics.reconnects.inc()
        self._close()

    def _connect_waiting(self) -> bool:
        """Connect, waiting while the database is unreachable (mailroom.core.outage); False when
        stopped meanwhile. A connection refused for good (a wrong password, no such database) raises."""
        while not self.stopping:
            try:
                self._connect()
            except ConnectFailed as exc:
                if self.classify(exc) is not Kind.UNAVAILABLE:
                    raise
                self._sleep(self.backoff(exc))
                continue
            self.outage.resumed()
            return True
        return False

    def _wait_for_schema(self, exc: psycopg.Error) -> None:
        """The schema changed under the batch (docs/upgrading.md): it rolled back; wait, then drain."""
        assert self.work is not None
        self.work.rollback()
        self.must_drain = True  # the announced tokens are still there: take them when it works again
        self._sleep(self.backoff(exc))

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, WAIT_SLICE))

    # -- the loop ----------------------------------------------------------------------------

    def _step(self) -> None:
        if self.heartbeat.due(self.listening()):
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
            idle = self.health if self.listening() else self.poll
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
                if self._listen_connects() > self.drained_after_connect:
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

    def _listen_connects(self) -> int:
        return self.listener.connects if self.listener is not None else 0

    def _beat(self) -> None:
        """One heartbeat in its own short transaction on the work connection."""
        assert self.work is not None
        self.beat(self.work)

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
        # a drain that begins while listening covers the listener's connect (its look for work); one
        # that began before, while the listener was still connecting, does not: that connect drains again
        covered = self.listening()
        if covered:  # then read the count: the listener counts a connect before it is up
            self.drained_after_connect = self._listen_connects()
        limit = self.cfg.batch_limit
        total = batches = 0
        while True:
            got = self.sink.run_batch(self.work, limit)
            total += got
            batches += got > 0
            if got < limit or self.stopping:
                break
        self.heartbeat.claimed += total
        self.metrics.tokens.inc(total)
        self.metrics.batches.inc(batches)
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
            if covered:
                self.log.info("waiting for notifications on %s", self.cfg.channel)
            elif not self.listening():
                self.log.info("polling every %d ms", self.cfg.poll_ms)
            # else the listener came up during this drain: its connect drains once more, then says so
        return total


def _announced(payload: str) -> int:
    """Tokens announced by one notification: its decimal payload, else 1 (a bare NOTIFY)."""
    text = payload.strip()
    if text.isdigit() and text.isascii():
        return max(int(text), 1)
    return 1
