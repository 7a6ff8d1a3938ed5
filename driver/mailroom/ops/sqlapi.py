"""The SQL functions of operations (maintenance), as the driver calls them (mailroom.db.contract)."""

from __future__ import annotations

from mailroom.db.contract import SqlFunction

maintain_partitions = SqlFunction("maintain_partitions", returns=("action", "table_name", "partition_name", "row_count"))

# the DKIM keys doctor checks against DNS (sql/30_outbound_dkim.sql; public halves only)
list_dkim_keys = SqlFunction("list_dkim_keys", returns=(
    "domain", "selector", "algorithm", "public_key", "dns_name", "dns_value", "created_at",
))
