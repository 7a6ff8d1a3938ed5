"""The collector's main loop: LISTEN on a dedicated connection, batch on limit or timeout, reconnect.

Two connections per collector, both direct (never a pool, never PgBouncer):
- `listen`: autocommit, runs LISTEN and the healthcheck; notifications are only hints;
- `work`:   non-autocommit, runs one transaction per batch (dequeue → hand off → COMMIT).

Notification payloads are the number of tokens the inserting statement created; their sum is the
pending count. A batch is taken when the pending count reaches the limit, or when the batch
timeout has passed since the first notification of a quiet period; the collector then keeps
dequeuing while full batches come back, so a folded NOTIFY never strands tokens. On start and
after every reconnect it drains the backlog, because notifications sent while it was away are gone.
"""

from __future__ import annotations

import contextlib
import signal
import time
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from mailroom.collector_output import CommitLost, EnqueueSink, OutputClosed, StdoutSink
from mailroom.db import connect
from mailroom.errors import UserError, describe_db_error
from mailroom.log import get_logger

if TYPE_CHECKING:
    from mailroom.collector import CollectorConfig

WAIT_SLICE = 0.2  # longest uninterrupted wait, so a signal is honoured within a second
BACKOFF_FIRST = 0.1
BACKOFF_CAP = 5.0
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
        self.listen: psycopg.Connection | None = None
        self.work: psycopg.Connection | None = None
        self.stopping = False
        self.must_drain = True
        self.pending = 0  # tokens announced by notifications since the last batch
        self.first_at = 0.0  # monotonic time of the first notification of this quiet period
        self.last_check = 0.0  # monotonic time of the last round trip that proved the links alive
        self.url = with_tcp_defaults(cfg.url)
        self.timeout = cfg.batch_timeout_ms / 1000
        self.health = cfg.healthcheck_ms / 1000

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
            while not self.stopping:
                try:
                    if self.listen is None:
                        self._reconnect()
                    else:
                        self._step()
                except RECONNECTABLE as exc:
                    self._lost(describe_db_error(exc))
                except CommitLost as exc:
                    self.log.warning(
                        "WARN: connection lost while committing a written batch of %d tokens; "
                        "if they come back they are committed without being written again", exc.rows,
                    )
                    self._lost(describe_db_error(exc.cause))
        except OutputClosed as exc:
            self._close()
            raise UserError(
                f"stdout closed ({exc.reason}); rolled back the unwritten batch of {exc.rows} "
                "tokens, which stay eligible for the next collector"
            ) from None
        except psycopg.Error as exc:
            self._close()
            raise UserError(f"collector stopped: {describe_db_error(exc)}") from None
        self._close()
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
        listen = connect(self.url, autocommit=True, application_name=APP_NAME)
        try:
            listen.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.cfg.channel)))
            work = connect(self.url, autocommit=False, application_name=APP_NAME)
        except BaseException:
            listen.close()
            raise
        self.listen, self.work = listen, work
        info = listen.info
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
        assert self.listen is not None
        try:
            row = self.listen.execute("SELECT mailroom.setting('tokens.channel')").fetchone()
        except RECONNECTABLE:
            raise
        except psycopg.Error:
            return  # setting absent (older schema): nothing to compare
        if row and row[0] and row[0] != self.cfg.channel:
            self.log.warning(
                "WARN: setting tokens.channel is %r but MAILROOM_CHANNEL_NAME is %r; "
                "only the backlog drain and the idle sweep will find new tokens",
                row[0], self.cfg.channel,
            )

    def _close(self) -> None:
        for conn in (self.work, self.listen):
            if conn is not None:
                with contextlib.suppress(Exception):  # closing a dead connection
                    conn.close()
        self.listen = self.work = None

    def _lost(self, reason: str) -> None:
        self.log.warning("WARN: connection lost: %s", reason)
        self._close()

    def _reconnect(self) -> None:
        delay = BACKOFF_FIRST
        attempt = 0
        while not self.stopping:
            attempt += 1
            self.log.info("reconnecting (attempt %d)", attempt)
            try:
                self._connect()
            except UserError as exc:
                self.log.warning("WARN: %s; retrying in %.1fs", exc, delay)
                self._sleep(delay)
                delay = min(delay * 2, BACKOFF_CAP)
                continue
            return

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, WAIT_SLICE))

    # -- the loop ----------------------------------------------------------------------------

    def _step(self) -> None:
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
            wait = self.last_check + self.health - now
            if wait <= 0:
                self._healthcheck()
                return
        self._wait(min(wait, WAIT_SLICE))

    def _wait(self, seconds: float) -> None:
        assert self.listen is not None
        # stop_after=1 ends the generator after one read, yielding every notification of that read;
        # never break out of it early (notifications of the same read would be dropped).
        for note in self.listen.notifies(timeout=max(seconds, 0.0), stop_after=1):
            if not self.pending:
                self.first_at = time.monotonic()
                self.log.info("woke up (NOTIFY)")
            self.pending += _announced(note.payload)

    def _healthcheck(self) -> None:
        """SELECT 1 on both connections, then one sweep for tokens no notification announced.

        The sweep catches tokens that became eligible again without a notification, such as a
        batch rolled back by another collector whose stdout closed.
        """
        assert self.listen is not None and self.work is not None
        self.listen.execute("SELECT 1")
        self.work.execute("SELECT 1")
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
            got = self.sink.run_batch(self.work, limit, self.cfg.key)
            total += got
            batches += got > 0
            if got < limit or self.stopping:
                break
        self.last_check = time.monotonic()
        if what and not self.stopping:
            self.sink.settle()
        if self.sink.skipped:
            self.log.info("%d tokens written before a lost commit were confirmed, not written again",
                          self.sink.skipped)
            self.sink.skipped = 0
        if what:
            if total:
                self.log.info("%s: collected %d tokens in %d batches", what, total, batches)
            self.log.info("waiting for notifications on %s", self.cfg.channel)
        return total


def _announced(payload: str) -> int:
    """Tokens announced by one notification: its decimal payload, else 1 (a bare NOTIFY)."""
    text = payload.strip()
    if text.isdigit() and text.isascii():
        return max(int(text), 1)
    return 1
