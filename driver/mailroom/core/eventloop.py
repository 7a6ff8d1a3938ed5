"""The event loop of the asyncio workers (`inbox serve`, `send`): `--event-loop auto|uvloop|asyncio`.

uvloop (libuv, a dependency of mailroom) spends fewer microseconds a socket read, write and wake-up
than asyncio's own loop, which is most of what a busy SMTP worker does. `auto` takes it when it is
installed; `asyncio` refuses it (a second loop to fall back on, and the one the suites also run on).
Both are public APIs: uvloop.new_event_loop as asyncio.Runner's loop_factory.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from mailroom.core.errors import ConfigError

CHOICES = ("auto", "uvloop", "asyncio")
HELP = "auto (uvloop when installed), uvloop or asyncio."

T = TypeVar("T")
LoopFactory = Callable[[], asyncio.AbstractEventLoop] | None


def factory(choice: str) -> LoopFactory:
    """The loop factory of an `--event-loop` choice: uvloop's when installed and not refused, else
    None (asyncio's default loop). A bad choice, or `uvloop` without the package, is a ConfigError
    (one line, exit 2) before anything starts."""
    if choice not in CHOICES:
        raise ConfigError(f"--event-loop must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("--event-loop uvloop: the uvloop package is not installed") from None
        return None
    return uvloop.new_event_loop


def auto_modules() -> tuple[str, ...]:
    """The modules `auto` loads when a worker starts its loop (uvloop, when installed): what a parent
    that forks such workers imports first, so its pages are shared (mailroom.ops.run's PRELOAD)."""
    return ("uvloop",) if importlib.util.find_spec("uvloop") is not None else ()


def name(loop: asyncio.AbstractEventLoop) -> str:
    """`uvloop` or `asyncio`: the loop a worker runs on (said in its start line)."""
    return "uvloop" if type(loop).__module__.split(".")[0] == "uvloop" else "asyncio"


def run(main: Coroutine[Any, Any, T], new_loop: LoopFactory) -> T:
    """asyncio.run(main) on the chosen loop."""
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(main)
