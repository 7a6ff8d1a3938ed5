"""The SQL functions every area's workers share, as the driver calls them (mailroom.db.contract)."""

from __future__ import annotations

from mailroom.db.contract import SqlFunction

worker_heartbeat = SqlFunction(
    "worker_heartbeat", "p_worker text, p_kind text, p_listening boolean, p_claimed integer = default"
)
