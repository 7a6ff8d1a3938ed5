"""The fault-injection suite reuses the ops tests' worker helpers (tests/ops/test_failure_paths.py) and
its proxy (proxy.py here): both folders go on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent / "ops", HERE.parent / "outbound"):
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
