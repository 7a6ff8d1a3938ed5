"""Progress of long work on a terminal: one line redrawn in place on stderr, nothing in logs.

    with Progress("purging sent messages", total=120000) as progress:
        progress.update(done)          # 'purging sent messages: 60000/120000 (50%), 12s'

When stderr is not a terminal (a service, a pipe, a log file) it prints nothing; the command's own
summary line says what was done. Without a total it shows the count and the time so far; `tick()`
redraws the time alone (a single long call: `maintain` runs one SQL function).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO


class Progress:
    """One progress line; see the module docstring."""

    MIN_REDRAW = 0.1  # seconds between redraws

    def __init__(self, label: str, *, total: int | None = None, stream: TextIO | None = None,
                 force: bool | None = None, ticker: bool = False) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = force if force is not None else _is_tty(self.stream)
        self.done = 0
        self.started = time.monotonic()
        self._drawn = 0.0
        self._width = 0
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick_loop, daemon=True) if ticker and self.enabled else None

    def __enter__(self) -> Progress:
        if self.enabled:
            self._draw(force=True)
        if self._ticker is not None:
            self._ticker.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(1)
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()

    def update(self, done: int) -> None:
        self.done = done
        if self.enabled:
            self._draw()

    def tick(self) -> None:
        if self.enabled:
            self._draw()

    def _tick_loop(self) -> None:
        while not self._stop.wait(1.0):
            self._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._drawn < self.MIN_REDRAW:
            return
        self._drawn = now
        elapsed = int(now - self.started)
        if self.total:
            pct = min(100, int(self.done * 100 / self.total))
            text = f"{self.label}: {self.done}/{self.total} ({pct}%), {elapsed}s"
        elif self.done:
            text = f"{self.label}: {self.done}, {elapsed}s"
        else:
            text = f"{self.label}… {elapsed}s"
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
