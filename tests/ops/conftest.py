"""The ops tests reuse the outbound tests' SMTP helpers (a relay that checks a login): their folder
goes on sys.path here."""

from __future__ import annotations

import sys
from pathlib import Path

OUTBOUND = Path(__file__).resolve().parent.parent / "outbound"
if str(OUTBOUND) not in sys.path:
    sys.path.append(str(OUTBOUND))
