"""`mailroom inbox serve --workers N`: N server processes on one port, supervised by the parent.

Each worker is a forked copy of the process running its own InboundServer (its own event loop and
its own database pool) on a socket bound with SO_REUSEPORT, so the kernel spreads connections over
them; they share nothing but the database. The parent (mailroom.core.supervisor, with restarts)
holds no database connection and no event loop: it forks the workers one after the other, each
once the previous one listens, then passes SIGTERM/SIGINT on to them and waits. A worker that dies
on its own is started again (after a second); one that dies within the supervisor's start-up
window (bad settings, no database) stops the whole server.

`250` keeps its meaning in every worker: it is answered only after that worker's COMMIT.
"""

from __future__ import annotations

import os
import select
import socket
from collections.abc import Callable

from mailroom.core.errors import UserError
from mailroom.core.log import get_logger
from mailroom.core.ready import notify_ready
from mailroom.core.sockets import bound_socket
from mailroom.core.supervisor import Child, Supervisor

log = get_logger("inbox")


def reserve_port(host: str, port: int) -> tuple[socket.socket, int]:
    """A bound (not listening) SO_REUSEPORT socket: fixes the port for port 0, fails early when taken."""
    sock = bound_socket(host, port, options=((socket.SOL_SOCKET, socket.SO_REUSEPORT),))
    return sock, sock.getsockname()[1]


def supervise(run_worker: Callable[[int, Callable[[int], None], int], None], workers: int, host: str, port: int) -> int:
    """Fork `workers` processes running run_worker(port, ready, index) and supervise them; the exit
    status. `index` (0 to workers - 1) tells a worker from the others (its metrics port)."""
    reserved, port = reserve_port(host, port)
    ready_r, ready_w = os.pipe()

    def target_of(index: int) -> Callable[[], None]:
        def target() -> None:
            os.close(ready_r)
            reserved.close()
            for name in ("MAILROOM_READY_FD", "NOTIFY_SOCKET"):  # the parent says when all of them listen
                os.environ.pop(name, None)
            run_worker(port, lambda _port: os.write(ready_w, b"."), index)

        return target

    def listening(child: Child) -> None:
        """One byte on the pipe: the worker listens (a restarted worker's byte is read by nobody)."""
        while True:
            readable, _, _ = select.select([ready_r], [], [], 0.2)
            if readable and os.read(ready_r, 1):
                return
            if not child.running():
                raise UserError(f"an inbox worker exited during start-up (status {child.returncode})")

    children = [Child(f"worker {n}", target=target_of(n - 1), ready=listening) for n in range(1, workers + 1)]
    # a worker lets deliveries in flight finish (up to 10 s, InboundServer.run) before it exits
    sup = Supervisor(children, restart=True, stop_grace=30, log_name="inbox")
    try:
        def started() -> None:
            log.info("listening on %s:%d with %d worker processes (SO_REUSEPORT)", host, port, workers)
            notify_ready()

        code = sup.run(started)
    finally:
        reserved.close()
        os.close(ready_r)
        os.close(ready_w)
    log.info("stopped (%d workers)", workers)
    return code
