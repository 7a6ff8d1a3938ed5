"""`mailroom inbox serve --workers N`: N server processes on one port, supervised by the parent.

Each worker is a forked copy of the process running its own InboundServer (its own event loop and
its own database pool) on a socket bound with SO_REUSEPORT, so the kernel spreads connections over
them; they share nothing but the database. The parent holds no database connection and no event
loop: it forks the workers, waits until every one of them listens, then forwards SIGTERM/SIGINT to
them and waits. A worker that dies on its own is started again (after a second); one that dies
within STARTUP_SECONDS of its start (bad settings, no database) stops the whole server.

`250` keeps its meaning in every worker: it is answered only after that worker's COMMIT.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable

from mailroom.core.errors import UserError
from mailroom.core.log import get_logger

log = get_logger("inbox")

STARTUP_SECONDS = 5.0


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """A bound (not listening) SO_REUSEPORT socket: fixes the port for port 0, fails early when taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock, sock.getsockname()[1]


def supervise(run_worker: Callable[[int, Callable[[int], None]], None], workers: int, host: str, port: int) -> int:
    """Fork `workers` processes running run_worker(port, ready) and supervise them; the exit status."""
    reserved, port = reserve_port(host, port)
    ready_r, ready_w = os.pipe()
    children: dict[int, float] = {}  # pid -> start time
    stopping = False
    failed = False

    def spawn() -> None:
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                os.close(ready_r)
                reserved.close()
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
                run_worker(port, lambda _port: os.write(ready_w, b"."))
            except UserError as exc:
                log.error("worker %d: %s", os.getpid(), exc)
                code = 2
            except BaseException as exc:  # noqa: BLE001 - a worker never returns into the parent's code
                log.error("worker %d failed: %s", os.getpid(), type(exc).__name__)
                code = 1
            finally:
                sys.stderr.flush()
                os._exit(code)
        children[pid] = time.monotonic()

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(children):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for _ in range(workers):
            spawn()
        # Wait until every worker listens (one byte each) or one of them exits.
        ready = 0
        while ready < workers and not stopping:
            readable, _, _ = select.select([ready_r], [], [], 0.2)
            if readable:
                ready += len(os.read(ready_r, workers))
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid:
                children.pop(pid, None)
                log.error("a worker exited during start-up (status %d): stopping", os.waitstatus_to_exitcode(status))
                failed = True
                forward(signal.SIGTERM, None)
        if ready >= workers and not stopping:
            log.info("listening on %s:%d with %d worker processes (SO_REUSEPORT)", host, port, workers)
        while children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            started = children.pop(pid, None)
            if started is None or stopping:
                continue
            code = os.waitstatus_to_exitcode(status)
            if time.monotonic() - started < STARTUP_SECONDS:
                log.error("worker %d exited %d within %gs of its start: stopping", pid, code, STARTUP_SECONDS)
                failed = True
                forward(signal.SIGTERM, None)
                continue
            log.warning("worker %d exited (status %d): starting another", pid, code)
            time.sleep(1)
            if not stopping:
                spawn()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        reserved.close()
        os.close(ready_r)
        os.close(ready_w)
    log.info("stopped (%d workers)", workers)
    return 1 if failed else 0
