"""Partition maintenance (issue 14): one call of mailroom.maintain_partitions().

The SQL function decides everything (which partitions to create ahead, which to drop, which rows
to delete in batches) and runs one caller at a time: a concurrent caller gets one row 'skipped'.
`mailroom maintain` runs it once and prints the report; `mailroom expire` runs it every
--maintain-every; pg_cron can run it too (docs/retention.md).
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

import psycopg

from mailroom.ops import sqlapi

Row = tuple[str, Optional[str], Optional[str], int]


def maintain(conn: psycopg.Connection) -> list[Row]:
    """Run maintain_partitions on an autocommit `conn` (its own transaction); its report rows."""
    return sqlapi.maintain_partitions.rows(conn)


def summary(rows: list[Row]) -> str:
    """'created 3, dropped 1 (120 rows)': the report in one line for a log (names no partition)."""
    if not rows:
        return "nothing to do"
    counts = Counter(r[0] for r in rows)
    dropped = sum(r[3] for r in rows if r[0] == "dropped")
    parts = [f"{action} {n}" + (f" ({dropped} rows)" if action == "dropped" else "") for action, n in counts.items()]
    return ", ".join(parts)
