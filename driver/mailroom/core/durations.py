"""Durations: one syntax for every option and argument that takes a time ('500ms', '5s', '10m', '7d').

A duration is a number and a unit: ms, s, m, h, d or w ('1.5h' works); 0 needs none. A number
without a unit is refused rather than guessed (the collector once took milliseconds where other
commands took seconds). `Duration` is the click type of every such option (metavar DURATION): a bad
value is a usage error, one line and exit 2; `parse_duration` is the same rule for values that come
from elsewhere.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Any

import typer

from mailroom.core.errors import ConfigError

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_ZERO = re.compile(r"^\s*0+(?:\.0+)?\s*$")
_BARE = re.compile(r"^\s*\d{1,12}(?:\.\d+)?\s*$")
NEVER = ("never", "off", "none")
SYNTAX = "a duration like 500ms, 5s, 10m, 2h or 7d"


def duration_or_none(text: str | None) -> timedelta | None:
    """'500ms', '5s', '10m', '7d', '1.5h', '0' -> timedelta; None when it is not a duration."""
    if text is None:
        return None
    if _ZERO.match(text):
        return timedelta(0)
    match = _DURATION.match(text)
    if not match:
        return None
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds > timedelta.max.total_seconds() / 2:
        return None
    return timedelta(seconds=seconds)


def parse_duration(flag: str, text: str | None) -> timedelta:
    """A duration (see the module docstring), or ConfigError (exit 2) naming the flag."""
    value = duration_or_none(text)
    if value is None:
        raise ConfigError(f"{flag} must be {SYNTAX}, got {text!r}")
    return value


class Duration:
    """The parser of a duration option (typer's `parser=`, with metavar DURATION): the value as
    seconds (a float), or None for 'never' when `never` is allowed. A bad value raises BadParameter,
    which click reports as a usage error: one line, exit 2."""

    __name__ = "duration"  # click names a function type after it

    def __init__(self, *, never: bool = False, positive: bool = False, minimum: float | None = None,
                 maximum: float | None = None, bare_ms: bool = False) -> None:
        self.never = never
        self.bare_ms = bare_ms
        self.positive = positive
        self.minimum = minimum
        self.maximum = maximum

    def __call__(self, value: Any) -> float | None:
        if value is None or isinstance(value, float):
            return value
        text = str(value)
        if self.never and text.strip().lower() in NEVER:
            return None
        parsed = duration_or_none(text)
        if parsed is None and self.bare_ms and _BARE.match(text):
            # the original C collector's variables (MAILROOM_BATCH_TIMEOUT=5000) were milliseconds:
            # an installation upgraded with them keeps their meaning
            parsed = timedelta(milliseconds=float(text))
        if parsed is None:
            raise typer.BadParameter(f"{text!r} is not {SYNTAX}{' or never' if self.never else ''}")
        seconds = parsed.total_seconds()
        if self.positive and seconds <= 0:
            raise typer.BadParameter(f"{text!r}: the duration must be more than 0")
        if self.minimum is not None and seconds < self.minimum:
            raise typer.BadParameter(f"{text!r} is shorter than {format_seconds(self.minimum)}")
        if self.maximum is not None and seconds > self.maximum:
            raise typer.BadParameter(f"{text!r} is longer than {format_seconds(self.maximum)}")
        return seconds


def format_seconds(seconds: float) -> str:
    """Seconds in the duration syntax, the largest whole unit: 0.5 -> '500ms', 600 -> '10m'."""
    if seconds == 0:
        return "0"
    for unit in ("w", "d", "h", "m", "s"):
        amount = seconds / _UNITS[unit]
        if amount >= 1 and amount == int(amount):
            return f"{int(amount)}{unit}"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


def format_age(seconds: float | None) -> str:
    """An age for people: '-', '42s', '3m', '2h 5m', '3d 4h'."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"
