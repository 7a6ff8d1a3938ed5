"""`mailroom run`: the inbound SMTP server, the collector, the sender, the expiry worker and partition maintenance.

Each child is the same CLI command an operator would run on its own, supervised by
mailroom.core.supervisor without restarts: when one dies the others are stopped (exit 1), so a
service manager (systemd, a container runtime) can restart the set.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from mailroom.core.errors import UserError
from mailroom.core.supervisor import Child, Supervisor

INBOX_LISTEN_TIMEOUT = 15.0
MAINTAIN_EVERY = "10m"


def wait_for_port(host: str, port: int, timeout: float) -> Callable[[Child], None]:
    """A ready check: the child (the inbound SMTP server) accepts connections on host:port."""

    def ready(child: Child) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not child.running():
                raise UserError(f"the inbound SMTP server exited with code {child.returncode} before listening")
            try:
                with socket.create_connection((host, port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise UserError(f"the inbound SMTP server did not listen on {host}:{port} within {timeout:.0f}s")

    return ready


def plan(
    inbox_host: str, inbox_port: int, *, collect: bool, send: bool, expire: bool, inbox: bool,
    maintain: bool = False, metrics_port: int | None = None,
) -> list[Child]:
    """Which commands to run, in start order (the inbox first, so relays pointing at it work)."""
    children = []
    if inbox:
        children.append(Child("inbox", ["inbox", "serve", "--host", inbox_host, "--port", str(inbox_port)],
                              ready=wait_for_port(inbox_host, inbox_port, INBOX_LISTEN_TIMEOUT)))
    if collect:
        children.append(Child("collect", ["collect", "--enqueue"]))
    if send:
        metrics = ["--metrics-port", str(metrics_port)] if metrics_port is not None else []
        children.append(Child("send", ["send", *metrics]))
    if expire:
        children.append(Child("expire", ["expire"]))
    if maintain:
        children.append(Child("maintain", ["maintain", "--every", MAINTAIN_EVERY]))
    return children


def run_all(
    url: str,
    *,
    inbox_host: str,
    inbox_port: int,
    inbox: bool,
    collect: bool,
    send: bool,
    expire: bool,
    maintain: bool,
    metrics_port: int | None,
) -> int:
    """Run inbound SMTP, the collector (--enqueue), the sender, the expiry worker and maintenance; the exit code."""
    env = dict(os.environ, MAILROOM_DATABASE_URL=url)
    children = plan(inbox_host, inbox_port, collect=collect, send=send, expire=expire, inbox=inbox,
                    maintain=maintain, metrics_port=metrics_port)
    if not children:
        raise UserError("nothing to run: every component is disabled", exit_code=2)
    sup = Supervisor(children, env=env, restart=False)
    return sup.run(lambda: sup.log.info("running %s; SIGTERM or Ctrl-C stops all",
                                        ", ".join(c.name for c in children)))
