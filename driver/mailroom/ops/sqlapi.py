"""The SQL functions of operations (maintenance), as the driver calls them (mailroom.db.contract)."""

from __future__ import annotations

from mailroom.db.contract import SqlFunction

maintain_partitions = SqlFunction("maintain_partitions", returns=("action", "table_name", "partition_name", "row_count"))
reindex_messages = SqlFunction("reindex_messages", "p_batch integer = default", returns=("walked", "rebuilt"))

