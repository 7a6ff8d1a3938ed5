"""The one process supervisor: `mailroom run` (a process per command) and `mailroom inbox serve --workers N`.

A child is either a `mailroom` command run as its own process (`args`), or a function run in a
forked copy of this process (`target`, whose return value is the exit status). A command child with
`fork` set is not a new interpreter either: it is a forked copy of this process that runs the
command (the package's __main__, as `python -m mailroom` does) in its own environment, so the
modules the supervisor imported before forking (`preload`) are pages the children share
(copy-on-write; the objects frozen out of the cyclic collector first, so its passes do not write to
them): issue 46, item 5, the memory of `mailroom run`. Such a child is named `mr <command>` (its
comm: ps, top, /proc/PID/comm; its command line is the supervisor's). Children start in order; a
child's `ready` check (if any) runs right after it starts and blocks until it serves (it raises
UserError when it does not). A command child says it serves itself: it gets the write end of a pipe
as MAILROOM_READY_FD and writes one byte there when it is connected and serving
(mailroom.core.ready); once every child is started the supervisor waits for those bytes, saying once
which child it still waits for (a worker started while the database is down waits for it), and only
then calls `on_started`. Every child runs in a process group of its own, so a Ctrl-C on the terminal
reaches the supervisor alone, which stops the children once; and every child dies with the
supervisor (Linux: SIGTERM from the kernel when its parent dies, `die_with`), so a supervisor killed
by SIGKILL leaves no child serving on. Then the supervisor
waits, and its policy is the same for every set of children:

- a child that exits within `startup_seconds` of its start failed to start: the others are
  stopped and the exit status is 1;
- a child that exits later is started again alone after RESTART_DELAY when `restart` is set (the
  inbox server's workers, `mailroom run`'s: a restarted command child's ready byte is not waited
  for); otherwise the others are stopped and the exit status is 1, so a service manager (systemd,
  a container runtime) restarts the whole set (the demo);
- SIGTERM or SIGINT stops every child with SIGTERM (the last started first); each gets `stop_grace`
  seconds to exit before SIGKILL; a child that exits 0 is logged as stopped, any other as what it
  exited with (or what killed it), and the exit status is 0. A finite set (`mailroom send --workers N
  --until-idle`) ends when its work does: a child that exits 0 is done, neither restarted nor a
  failure, and the supervisor exits 0 once every child is done. A child still running after the grace
  is stuck: before SIGKILL it gets SIGQUIT, on which every supervised child writes the Python stack of
  each of its threads to stderr (`supervised`: faulthandler, which writes from the signal handler
  itself, so a deadlocked interpreter still answers), so the log says where it hung.

The supervisor holds no database connection and no event loop.
"""

from __future__ import annotations

import faulthandler
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mailroom.core.errors import UserError
from mailroom.core.log import get_logger

STARTUP_SECONDS = 5.0
RESTART_DELAY = 1.0
STOP_GRACE_SECONDS = 10.0
STACKS_SIGNAL = signal.SIGQUIT  # a supervised child writes its threads' stacks to stderr (the JVM's, Go's)
STACKS_SECONDS = 0.5  # between that signal and SIGKILL
POLL_SECONDS = 0.1
READY_PATIENCE = 5.0  # seconds before the supervisor says which child it still waits for


@dataclass
class Child:
    """One supervised process; see the module docstring."""

    name: str
    args: list[str] | None = None  # `python -m mailroom *args`
    fork: bool = False  # with args: run them in a forked copy of this process, not a new interpreter
    target: Callable[[], int | None] | None = field(default=None, repr=False)  # run in a forked copy
    ready: Callable[[Child], None] | None = field(default=None, repr=False)  # blocks until it serves
    notify: bool = True  # a command child: wait for its MAILROOM_READY_FD byte after the start
    env: dict[str, str | None] | None = field(default=None, repr=False)  # its own environment (merged over the
    # set's; a None value removes that variable: a secret the worker does not read)
    pid: int | None = None
    started_at: float = 0.0
    returncode: int | None = None  # as subprocess reports it: the exit code, or -N for signal N
    ready_fd: int | None = field(default=None, repr=False)  # read end of its ready pipe, until it is ready
    is_ready: bool = False
    done: bool = False  # a finite set's child that exited 0 (Supervisor(finite=True))

    def exit_text(self) -> str:
        """How it ended, for the log: 'stopped', 'exited with code 3', 'killed by SIGKILL'."""
        if self.returncode == 0:
            return "stopped"
        if self.returncode is not None and self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exited with code {self.returncode}"

    def describe(self) -> str:
        return f"mailroom {' '.join(self.args)}" if self.args is not None else self.name

    def running(self) -> bool:
        """Whether it still runs (reaps it and sets returncode when it has exited)."""
        if self.pid is None or self.returncode is not None:
            return False
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.returncode = self.returncode if self.returncode is not None else 1
            return False
        if pid == 0:
            return True
        self.returncode = os.waitstatus_to_exitcode(status)
        return False

    def send(self, signum: int) -> None:
        if self.running():
            try:
                os.kill(self.pid, signum)  # type: ignore[arg-type]
            except ProcessLookupError:
                pass


SUPERVISOR_ENV = "MAILROOM_SUPERVISOR_PID"  # a command child's supervisor: it dies with it (die_with)
_PR_SET_PDEATHSIG = 1
_prctl: Any = None


def _load_prctl() -> Any:
    """libc's prctl, loaded once (by the supervisor before it forks: a child only calls it)."""
    global _prctl
    if _prctl is None:
        try:
            import ctypes

            _prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            _prctl = False
    return _prctl


def supervised(parent: int) -> None:
    """What a supervised child does first: die with its supervisor (`die_with`), and write the stacks
    of its threads to stderr on STACKS_SIGNAL (the supervisor sends it to a child that did not stop
    within the grace, before SIGKILL; an operator may too: `kill -QUIT PID`)."""
    faulthandler.register(STACKS_SIGNAL, all_threads=True, chain=False)
    die_with(parent)


def die_with(parent: int) -> None:
    """A child in a process group of its own outlives a supervisor killed by SIGKILL (the OOM killer,
    kill -9), serving on alone (an inbox worker on a SO_REUSEPORT port the next server shares): on
    Linux it gets SIGTERM when its parent dies, and stops as on any SIGTERM. Elsewhere nothing."""
    prctl = _load_prctl()
    if not prctl:
        return
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:  # it died before the call above
        os.kill(os.getpid(), signal.SIGTERM)


PR_SET_NAME = 15


def comm_of(child: Child) -> str:
    """A forked command child's process name: `mr inbox serve`, `mr collect` (the kernel keeps 15 bytes)."""
    words = (child.args or [])[:2] if (child.args or [""])[0] in ("inbox", "http", "mcp", "db") else (child.args or [])[:1]
    return " ".join(["mr", *words])[:15]


def preload(modules: list[str]) -> None:
    """Import `modules` here, before the children fork, and freeze what is loaded (freeze_loaded)."""
    import importlib

    for name in modules:
        importlib.import_module(name)
    freeze_loaded()


def freeze_loaded() -> None:
    """Freeze what this process has loaded out of the cyclic collector, before the children fork: its
    passes then do not write to those objects, and the children share their pages instead of each
    holding its own copy."""
    import gc

    gc.collect()
    gc.freeze()


def _run_command(child: Child, env: dict[str, str], inherited: list[int]) -> None:
    """In the forked process: run the command `child.args` as `python -m mailroom` would, in `env`;
    never return into the supervisor's code."""
    code: int = 1
    try:
        os.setpgid(0, 0)  # a process group of its own before anything else (the parent sets it too)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        for fd in inherited:  # the other children's ready pipes: theirs alone
            try:
                os.close(fd)
            except OSError:
                pass
        prctl = _load_prctl()
        if prctl:
            prctl(PR_SET_NAME, comm_of(child).encode(), 0, 0, 0)
        os.environ.clear()
        os.environ.update(env)  # MAILROOM_SUPERVISOR_PID in it: main() calls supervised first
        sys.argv = ["mailroom", *(child.args or [])]
        import runpy

        runpy.run_module("mailroom", run_name="__main__", alter_sys=True)  # what `python -m mailroom` runs
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - a forked child never returns into the parent's code
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _run_target(child: Child, parent: int) -> None:
    """In the forked process: run the target, never return into the supervisor's code."""
    code = 0
    log = get_logger(child.name)
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        supervised(parent)
        code = (child.target() if child.target is not None else 0) or 0
    except UserError as exc:
        log.error("%s %d: %s", child.name, os.getpid(), exc)
        code = 2
    except BaseException as exc:  # noqa: BLE001 - a forked child never returns into the parent's code
        log.error("%s %d failed: %s", child.name, os.getpid(), type(exc).__name__)
        code = 1
    finally:
        sys.stderr.flush()
        os._exit(code)


class Supervisor:
    """Starts children, passes signals on, applies the policy of the module docstring."""

    def __init__(
        self,
        children: list[Child],
        *,
        env: dict[str, str] | None = None,
        restart: bool = False,
        startup_seconds: float = STARTUP_SECONDS,
        stop_grace: float = STOP_GRACE_SECONDS,
        log_name: str = "run",
        finite: bool = False,
    ) -> None:
        self.children = children
        self.finite = finite
        self.env = env
        self.restart = restart
        self.startup_seconds = startup_seconds
        self.stop_grace = stop_grace
        self.log = get_logger(log_name)
        self.stopping = False
        self.failed = False
        self.received: list[int] = []

    # -- starting ------------------------------------------------------------------------------

    def spawn(self, child: Child) -> None:
        child.returncode = None
        child.done = False
        child.started_at = time.monotonic()
        if child.args is not None:
            argv = [sys.executable, "-m", "mailroom", *child.args]
            env = {k: v for k, v in {**(self.env if self.env is not None else os.environ), **(child.env or {})}.items()
                   if v is not None}
            env[SUPERVISOR_ENV] = str(os.getpid())  # it dies with this process (supervised, at its start)
            write_fd = None
            if child.ready_fd is not None:  # a restarted child's unread pipe
                os.close(child.ready_fd)
                child.ready_fd = None
            if child.notify:
                child.ready_fd, write_fd = os.pipe()
                os.set_inheritable(write_fd, True)
                env["MAILROOM_READY_FD"] = str(write_fd)
            try:
                if child.fork:
                    _load_prctl()  # here, not in each child
                    inherited = [c.ready_fd for c in self.children if c.ready_fd is not None]
                    sys.stdout.flush()
                    sys.stderr.flush()  # nothing buffered twice
                    pid = os.fork()
                    if pid == 0:
                        _run_command(child, env, inherited)
                    child.pid = pid
                    try:
                        os.setpgid(pid, pid)  # as posix_spawn's setpgroup=0
                    except OSError:
                        pass  # it already exited
                else:
                    child.pid = os.posix_spawn(sys.executable, argv, env, setpgroup=0)
            finally:
                if write_fd is not None:
                    os.close(write_fd)  # the child holds it now; the next children must not
            self.log.info("started %s (pid %d): %s%s", child.name, child.pid, child.describe(),
                          " (forked)" if child.fork else "")
            return
        parent = os.getpid()
        _load_prctl()  # here, not in each child
        pid = os.fork()
        if pid == 0:
            _run_target(child, parent)
        child.pid = pid
        try:
            os.setpgid(pid, pid)  # a process group of its own: a Ctrl-C on the terminal reaches the supervisor only
        except OSError:
            pass  # it already exited

    def start(self) -> None:
        """Start every child in order, each one's ready check before the next, then wait until every
        command child said it serves (UserError if one fails or exits first)."""
        for child in self.children:
            if self.received:
                return
            self.spawn(child)
            if child.ready is not None:
                child.ready(child)
        self.wait_ready()

    def wait_ready(self, only: list[Child] | None = None) -> None:
        """Until every child (of `only`, when given) with a ready pipe wrote its byte; says once which it
        still waits for. A child's `ready` check may call it with [child]: the next start after it serves."""
        said = False
        deadline = time.monotonic() + READY_PATIENCE
        children = self.children if only is None else only
        while not self.received:
            pending = [c for c in children if c.ready_fd is not None]
            if not pending:
                return
            readable, _, _ = select.select([c.ready_fd for c in pending], [], [], POLL_SECONDS)
            for child in pending:
                if child.ready_fd in readable:
                    data = os.read(child.ready_fd, 1)
                    os.close(child.ready_fd)
                    child.ready_fd = None
                    if data:
                        child.is_ready = True
                        continue
                    # the pipe closed without a byte: the child is exiting
                    end = time.monotonic() + self.stop_grace
                    while child.running() and time.monotonic() < end:
                        time.sleep(POLL_SECONDS / 2)
                    raise UserError(f"{child.name} {child.exit_text()} before it was ready")
                if not child.running():
                    os.close(child.ready_fd)  # type: ignore[arg-type]
                    child.ready_fd = None
                    raise UserError(f"{child.name} {child.exit_text()} before it was ready")
            if not said and time.monotonic() >= deadline:
                said = True
                waiting = [c.name for c in children if c.ready_fd is not None]
                if waiting:
                    self.log.info("waiting for %s to be ready (each says why in its own lines)", ", ".join(waiting))

    # -- running -------------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.received.append(signum)

    def run(self, on_started: Callable[[], None] | None = None) -> int:
        """start(), then supervise until a signal or a failure; the exit status (0 after a signal)."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            if on_started is not None and not self.received:
                on_started()
            while not self.received and not self.failed:
                self._watch()
                if self.finite and all(c.done for c in self.children):
                    break
                time.sleep(POLL_SECONDS)
            if self.received:
                self.log.info("signal %s received; stopping", signal.Signals(self.received[0]).name)
            return 1 if self.failed else 0
        finally:
            if not self.stopping:
                self.stop(signal.SIGTERM)
            for child in self.children:
                if child.ready_fd is not None:
                    os.close(child.ready_fd)
                    child.ready_fd = None
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _watch(self) -> None:
        for child in self.children:
            if child.pid is None or child.done or child.running():
                continue
            if self.finite and child.returncode == 0:
                child.done = True  # its work is over (a finite set: send --until-idle)
                self.log.info("%s %s", child.name, child.exit_text())
                continue
            if time.monotonic() - child.started_at < self.startup_seconds:
                self.log.error("%s %s; stopping the others (it failed to start: within %gs of "
                               "its start)", child.name, child.exit_text(), self.startup_seconds)
                self.failed = True
                return
            if not self.restart:
                self.log.info("%s %s; stopping the others", child.name, child.exit_text())
                self.failed = True
                return
            self.log.warning("%s %s; starting another", child.name, child.exit_text())
            time.sleep(RESTART_DELAY)
            if not self.received:
                self.spawn(child)

    # -- stopping ------------------------------------------------------------------------------

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Pass `signum` on to every running child (the last started first); SIGKILL after stop_grace."""
        self.stopping = True
        for child in reversed(self.children):
            child.send(signum)
        deadline = time.monotonic() + self.stop_grace
        for child in self.children:
            if child.pid is None:
                continue
            while child.running() and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS / 2)
            if child.running():
                self.log.info("%s did not stop within %.0fs; its threads' stacks follow, then it is killed",
                              child.name, self.stop_grace)
                child.send(STACKS_SIGNAL)
                time.sleep(STACKS_SECONDS)
                child.send(signal.SIGKILL)
                while child.running():
                    time.sleep(POLL_SECONDS / 2)
            if child.args is not None:
                self.log.info("%s %s", child.name, child.exit_text())
