"""One switch for every fast path built on a library's internals (docs/architecture.md, "Private
internals, each guarded"), and for MCP's JSON-RPC endpoint (mcp/server.py `_FastCalls`, on the SDK's
public API), which stands in for the SDK's transport.

`MAILROOM_FAST_PATHS=off` (read once, when this module is first imported): every fast path takes the
public path it replaces, with the same answers, so a dependency bump that breaks a fast path can be
worked around at once, and the suites can run on the public paths (`python -m mailroom.testing all
--fast-paths-off-pass`). Any other value, or none, leaves them on.

`hit(name)` counts a request a fast path served, so a guard test can fail when a fast path silently
stops serving with the switch on (an integer add: nothing a profile shows).
"""

from __future__ import annotations

import collections
import os

ENV = "MAILROOM_FAST_PATHS"
_OFF = frozenset({"off", "0", "false", "no"})

_ENABLED = os.environ.get(ENV, "").strip().lower() not in _OFF

# name -> how many times that fast path served (tests read it; nothing else does)
served: collections.Counter[str] = collections.Counter()


def enabled() -> bool:
    """Whether the fast paths are on (MAILROOM_FAST_PATHS is not `off`)."""
    return _ENABLED


def hit(name: str) -> None:
    """The fast path `name` served one request (a call, a message, a row)."""
    served[name] += 1
