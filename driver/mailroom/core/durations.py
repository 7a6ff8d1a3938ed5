"""Durations on the command line: one parser for every flag that takes a time ('90s', '5m', '7d')."""

from __future__ import annotations

import re
from datetime import timedelta

from mailroom.core.errors import ConfigError

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
NEVER = ("never", "off", "none")


def parse_duration(flag: str, text: str | None) -> timedelta:
    """'60s', '5m', '7d', '1.5h', '250ms', '90' (seconds) -> timedelta; ConfigError (exit 2) when bad."""
    match = _DURATION.match(text or "")
    if not match:
        raise ConfigError(f"{flag} must be a duration like 60s, 5m, 2h or 7d, got {text!r}")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])


def parse_seconds(flag: str, text: str | None) -> float:
    """The same durations as a number of seconds."""
    return parse_duration(flag, text).total_seconds()


def parse_optional_duration(flag: str, text: str) -> timedelta | None:
    """A duration, or None for 'never' / 'off' / 'none'."""
    if text.strip().lower() in NEVER:
        return None
    return parse_duration(flag, text)
