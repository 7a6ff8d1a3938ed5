"""LISTEN with reconnect, a self-test and a polling fallback: the one way a worker hears NOTIFY.

A Listener runs in a thread on its own autocommit connection to the listen URL, which must be a
direct (or session-pooled) connection: a transaction pooler cannot carry LISTEN. After LISTEN it
registers with mailroom.listen (the hot producers notify only while someone is registered) and waits
out the writers that started before (mailroom.await_writers). It calls
`on_notify(channel, payload)` for each notification and `on_connect()` after every (re)connect,
because whatever was announced while it was away is gone and the consumer must look for work.

It checks itself on connect and every `check_interval` seconds: a separate short connection
NOTIFYs a private channel and the listener must hear it within `check_timeout`. Through a
transaction pooler, or on a link that went silent, it does not: the listener says why once,
closes, and tries again after a while. Meanwhile `listening` is False and consumers poll.

Without a listen URL nothing runs: `listening` stays False, the consumer polls, and `start()`
logs that once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import select
import threading
import time
from collections.abc import Callable, Sequence

import psycopg
from psycopg import sql

from mailroom.core.errors import describe_db_error
from mailroom.core.outage import Backoff
from mailroom.db import sqlapi
from mailroom.db.connect import connection_kwargs, with_defaults

RETRY_AFTER_FAILED_CHECK = 30.0  # a pooler will not start carrying LISTEN soon
READ_SLICE = 0.5  # longest blocking read (stop() wakes one at once: the wake pipe)


class Listener:
    """LISTEN on `channels` in a background thread; see the module docstring."""

    def __init__(
        self,
        url: str | None,
        channels: Sequence[str],
        *,
        name: str,
        log: logging.Logger,
        on_notify: Callable[[str, str], None] | None = None,
        on_connect: Callable[[], None] | None = None,
        check_interval: float = 60.0,
        check_timeout: float = 2.0,
        poll_hint: str = "",
    ) -> None:
        self.url = url
        self.channels = list(channels)
        self.name = name
        self.log = log
        self.on_notify = on_notify or (lambda _c, _p: None)
        self.on_connect = on_connect or (lambda: None)
        self.check_interval = check_interval
        self.check_timeout = check_timeout
        self.poll_hint = poll_hint  # e.g. "polling every 1s", for the log line
        self.check_channel = f"mailroom_selftest_{secrets.token_hex(6)}"
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        # stop() writes a byte here, so a read waiting on the connection returns at once (a worker's
        # stop, e.g. `send --until-idle` once the queue is empty, waited out the read's slice)
        self._wake: tuple[int, int] | None = None
        self._down_reason: str | None = None
        self.checks_passed = 0
        # (re)connects so far, counted before `listening` turns true: a reader that sees `listening`
        # and then reads `connects` sees this connect counted (the collector's one drain per connect)
        self.connects = 0

    @property
    def listening(self) -> bool:
        """True while connected, LISTENing and the last self-test came back."""
        return self._listening.is_set()

    def start(self) -> Listener:
        if self.url is None:
            self.log.info("no listen URL: %s (no notifications)", self.poll_hint or "polling")
            return self
        self._wake = os.pipe()
        os.set_blocking(self._wake[1], False)
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-listen", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._listening.clear()
        if self._thread is None:
            return
        if self._wake is not None:
            with contextlib.suppress(OSError):  # full (already woken) or closed
                os.write(self._wake[1], b"\0")
        self._thread.join(timeout)
        if self._wake is not None and not self._thread.is_alive():
            for fd in self._wake:
                os.close(fd)
            self._wake = None

    def wait_listening(self, timeout: float) -> bool:
        """Block until the listener is up (tests, start-up ordering); False on timeout."""
        return self._listening.wait(timeout)

    # -- the thread ----------------------------------------------------------------------------

    def _down(self, reason: str) -> None:
        self._listening.clear()
        # one line an outage: the first reason, not every retry nor every new wording of the same
        # outage (a server shutting down refuses, then closes, then has no socket: three reasons)
        if self._down_reason is None:
            hint = f"; {self.poll_hint} until it is back" if self.poll_hint else ""
            self.log.warning("WARN: LISTEN %s: %s%s", "/".join(self.channels), reason, hint)
            self._down_reason = reason

    def _up(self) -> None:
        if self._down_reason is not None:
            self.log.info("LISTEN %s: listening again", "/".join(self.channels))
        self._down_reason = None
        self.connects += 1
        self._listening.set()
        self.on_connect()

    def _run(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                conn = psycopg.connect(with_defaults(self.url), **connection_kwargs(application_name=self.name))
            except psycopg.Error as exc:
                self._down(f"cannot connect ({describe_db_error(exc)})")
                self._stop.wait(backoff.next())
                continue
            try:
                with conn:
                    if self._serve(conn):
                        backoff.reset()
                        continue
                self._stop.wait(RETRY_AFTER_FAILED_CHECK)
            except psycopg.Error as exc:
                self._down(f"connection lost ({describe_db_error(exc)})")
                self._stop.wait(backoff.next())

    def _serve(self, conn: psycopg.Connection) -> bool:
        """LISTEN and read until stopped (True) or the self-test fails (False)."""
        self._register(conn)  # first: rows committed from here on are announced or found by on_connect
        for channel in [*self.channels, self.check_channel]:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        if not self._self_test(conn):
            self._down("the self-test NOTIFY did not come back (a transaction pooler cannot carry LISTEN: "
                       "give a direct --listen-url)")
            return False
        self._up()
        next_check = time.monotonic() + self.check_interval
        while not self._stop.is_set():
            wait = min(READ_SLICE, max(0.0, next_check - time.monotonic()))
            self._read(conn, wait, None)
            if time.monotonic() >= next_check:
                conn.execute("SELECT 1")  # the listen connection itself is alive (raises when not)
                if not self._self_test(conn):
                    self._down("the self-test NOTIFY did not come back (the link went silent)")
                    return False
                next_check = time.monotonic() + self.check_interval
        with contextlib.suppress(psycopg.Error):  # stopping: leave the registry (a dead session is pruned)
            sqlapi.unlisten.call(conn)
        return True

    def _register(self, conn: psycopg.Connection) -> None:
        """Say this session listens, so the producers of hot channels notify it (sql/08_notify.sql), then
        wait out the writers that may have decided before that no one listened: whatever they wrote is
        then committed, and on_connect's look for work (after LISTEN and the self-test) finds it; what
        commits later is announced (or, before LISTEN takes effect, found by that same look)."""
        try:
            sqlapi.listen.call(conn, channels=self.channels)
            sqlapi.await_writers.value(conn)
        except psycopg.errors.UndefinedFunction:
            pass  # a schema older than the registry notifies always

    def _self_test(self, conn: psycopg.Connection) -> bool:
        nonce = secrets.token_hex(8)
        try:
            with psycopg.connect(with_defaults(self.url),
                                 **connection_kwargs(application_name=f"{self.name}-check")) as probe:
                probe.execute("SELECT pg_notify(%s, %s)", (self.check_channel, nonce))
        except psycopg.Error:
            return False
        deadline = time.monotonic() + self.check_timeout
        while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
            if self._read(conn, min(left, READ_SLICE), nonce):
                self.checks_passed += 1
                return True
        return self._stop.is_set()

    def _read(self, conn: psycopg.Connection, timeout: float, nonce: str | None) -> bool:
        """Deliver the notifications of one read, waiting up to `timeout` for the connection (or
        stop()); True when the self-test nonce was among them."""
        # what psycopg kept from the connection's last statement, or what is there already
        heard, delivered = self._deliver(conn, nonce)
        if delivered:
            return heard
        # poll, not select: a server holding many sockets gives this connection a descriptor past
        # select()'s 1,024 (psycopg's own waits poll too)
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        if self._wake is not None:
            poller.register(self._wake[0], select.POLLIN)
        ready = poller.poll(max(0, int(timeout * 1000)))
        if any(fd == conn.fileno() for fd, _ in ready) and not self._stop.is_set():
            heard = self._deliver(conn, nonce)[0]
        return heard

    def _deliver(self, conn: psycopg.Connection, nonce: str | None) -> tuple[bool, bool]:
        """One read that does not wait (timeout 0: psycopg polls once); whether the self-test nonce
        came, and whether anything did."""
        heard = delivered = False
        # stop_after=1 ends after one read with every notification of that read; never break early.
        for note in conn.notifies(timeout=0, stop_after=1):
            delivered = True
            if note.channel == self.check_channel:
                heard = heard or note.payload == nonce
                continue
            with contextlib.suppress(Exception):  # a consumer's bug must not kill the listener
                self.on_notify(note.channel, note.payload)
        return heard, delivered
