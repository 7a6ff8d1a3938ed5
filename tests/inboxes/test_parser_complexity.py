"""Every parser of untrusted inbound input runs in time linear in its input (issue 21, item 1).

For each adversarial family (tests/inboxes/complexity_support.py: blank lines, dashes, quotes,
deep nesting, many parts, long headers, ...) the parser is timed on an input of size n (grown
until one parse takes ~20 ms; inputs bounded where they are read are parsed in a loop instead) and
on 8n: 8x the input may take at most 16x the time (a linear parser is near 8x, a quadratic one near
64x); a noisy attempt is repeated, up to three. Ratios of runs in the same process, never absolute
times. The families cover the bounce reader, the MIME reader (structure, headers, parameters),
the From fast path and the SMTP path parser.
"""

from __future__ import annotations

import pytest
from complexity_support import FAMILIES, GROWTH, LIMIT, growth

CASES = [(parser, family) for parser, families in FAMILIES.items() for family in families]


@pytest.mark.parametrize(("parser", "family"), CASES, ids=[f"{p}:{f}" for p, f in CASES])
def test_linear_time(parser, family):
    for _ in range(3):  # the machine is shared: a noisy attempt is repeated; quadratic fails all three
        n, base, big = growth(parser, family)
        assert n > 0, f"{parser} on {family}: one parse of the smallest input did not finish"
        ratio = big / base
        if ratio <= LIMIT:
            break
    assert ratio <= LIMIT, (
        f"{parser} on {family}: {GROWTH}x the input ({n} -> {GROWTH * n}) took {ratio:.1f}x the time "
        f"({base * 1000:.1f} ms -> {big * 1000:.1f} ms); linear is about {GROWTH}x"
    )
