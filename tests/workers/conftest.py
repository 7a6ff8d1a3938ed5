"""Fixtures of the seed's acceptance aliases: the outbound suite's own (its SMTP servers on
127.0.0.1), reused as they are. The outbound folder goes on sys.path as in tests/pooled."""

from __future__ import annotations

import sys
from pathlib import Path

OUTBOUND = Path(__file__).resolve().parents[1] / "outbound"
if str(OUTBOUND) not in sys.path:
    sys.path.append(str(OUTBOUND))

from workers._outbound import suite  # noqa: E402

smtp_server = suite("conftest").smtp_server  # the scripted aiosmtpd servers, stopped after each test
