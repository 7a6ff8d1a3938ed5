"""The supervisor behind `mailroom run`: the inbound SMTP server, the collector, the sender and the expiry worker.

Each child is the same CLI command an operator would run on its own; the supervisor only
starts them, forwards SIGTERM/SIGINT, and stops the others when one of them dies (exit 1),
so a service manager (systemd, a container runtime) can restart the set.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from mailroom.core.errors import UserError
from mailroom.core.log import get_logger

log = get_logger("run")
STOP_GRACE_SECONDS = 10.0


@dataclass
class Child:
    name: str
    args: list[str]
    proc: subprocess.Popen | None = field(default=None, repr=False)


def plan(
    inbox_host: str, inbox_port: int, *, collect: bool, send: bool, expire: bool, inbox: bool,
    metrics_port: int | None = None,
) -> list[Child]:
    """Which commands to run, in start order (the inbox first, so relays pointing at it work)."""
    children = []
    if inbox:
        children.append(Child("inbox", ["inbox", "serve", "--host", inbox_host, "--port", str(inbox_port)]))
    if collect:
        children.append(Child("collect", ["collect", "--enqueue"]))
    if send:
        metrics = ["--metrics-port", str(metrics_port)] if metrics_port is not None else []
        children.append(Child("send", ["send", *metrics]))
    if expire:
        children.append(Child("expire", ["expire"]))
    return children


def wait_for_port(host: str, port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise UserError(f"the inbound SMTP server exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise UserError(f"the inbound SMTP server did not listen on {host}:{port} within {timeout:.0f}s")


class Supervisor:
    """Starts children, forwards signals, stops everything when one dies or a signal arrives."""

    def __init__(self, children: list[Child], env: dict[str, str]) -> None:
        self.children = children
        self.env = env
        self.stopping = False

    def start(self, inbox_addr: tuple[str, int] | None = None) -> None:
        for child in self.children:
            child.proc = subprocess.Popen([sys.executable, "-m", "mailroom", *child.args], env=self.env)
            log.info("started %s (pid %d): mailroom %s", child.name, child.proc.pid, " ".join(child.args))
            if child.name == "inbox" and inbox_addr is not None:
                wait_for_port(*inbox_addr, timeout=15, proc=child.proc)

    def first_exit(self) -> Child | None:
        for child in self.children:
            if child.proc is not None and child.proc.poll() is not None:
                return child
        return None

    def stop(self) -> None:
        self.stopping = True
        for child in reversed(self.children):
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for child in self.children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.info("%s did not stop within %.0fs; killing it", child.name, STOP_GRACE_SECONDS)
                child.proc.kill()
                child.proc.wait()
            log.info("%s exited with code %s", child.name, child.proc.returncode)


def run_all(
    url: str,
    *,
    inbox_host: str,
    inbox_port: int,
    inbox: bool,
    collect: bool,
    send: bool,
    expire: bool,
    metrics_port: int | None,
) -> int:
    """Run inbound SMTP, the collector (--enqueue), the sender and the expiry worker; the exit code."""
    env = dict(os.environ, MAILROOM_DATABASE_URL=url)
    children = plan(inbox_host, inbox_port, collect=collect, send=send, expire=expire, inbox=inbox,
                    metrics_port=metrics_port)
    if not children:
        raise UserError("nothing to run: every component is disabled", exit_code=2)
    sup = Supervisor(children, env)
    received: list[int] = []

    def on_signal(signum, _frame):
        received.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        sup.start((inbox_host, inbox_port) if inbox else None)
        log.info("running %s; SIGTERM or Ctrl-C stops all", ", ".join(c.name for c in children))
        while not received:
            dead = sup.first_exit()
            if dead is not None:
                log.info("%s exited with code %s; stopping the others", dead.name, dead.proc.returncode)
                sup.stop()
                return 1
            time.sleep(0.1)
        log.info("signal %s received; stopping", signal.Signals(received[0]).name)
        return 0
    finally:
        if not sup.stopping:
            sup.stop()
