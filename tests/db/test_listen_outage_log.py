"""The LISTEN thread says an outage once, whatever wording the failures take while it lasts.

A server that shuts down first closes connections, then refuses them, then has no socket: three
different errors, one outage. The collector once logged a line for each (seen in a parallel run of
tests/ops/test_failure_paths.py). Here the endpoint changes its failure on purpose: a TCP server
that accepts and closes at once ("server closed the connection"), then nothing listening on that
port ("connection refused").
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from mailroom.db.listen import Listener


class _Closer:
    """Accepts TCP connections on 127.0.0.1 and closes them at once."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2)
        self.sock.close()


def _wait(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_one_warning_for_one_outage_whatever_its_errors(caplog):
    closer = _Closer()
    log = logging.getLogger("mailroom.test.listen")
    url = f"host=127.0.0.1 port={closer.port} dbname=x user=x connect_timeout=2"
    listener = Listener(url, ["token_insert"], name="test", log=log, poll_hint="polling every 500 ms")
    with caplog.at_level(logging.INFO, logger="mailroom.test.listen"):
        listener.start()
        try:
            _wait(lambda: closer.accepted >= 1)
            closer.close()  # the same outage now answers "connection refused"
            time.sleep(4)  # retries after 0.1, 0.2, 0.4 … s (mailroom.core.outage.Backoff) meet the refusal
        finally:
            listener.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "cannot connect" in warnings[0]
