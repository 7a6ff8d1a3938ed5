"""Settings bench.run hands to the areas through the environment (so `python -m bench.bench_x` alone sees them too)."""

from __future__ import annotations

import os

ROUNDS_ENV = "MAILROOM_BENCH_ROUNDS"


def rounds(quick: bool, full: int = 3, short: int = 1) -> int:
    """Interleaved rounds of a comparison: `--rounds N` of bench.run (MAILROOM_BENCH_ROUNDS) if given, else
    `full` (quick: `short`)."""
    value = os.environ.get(ROUNDS_ENV, "")
    return int(value) if value.isdigit() and int(value) > 0 else (short if quick else full)
