"""The SQL functions of the MCP face, as the driver calls them (mailroom.db.contract).

Every tool call and resource read of `mailroom mcp` is one of these calls (sql/26_mcp.sql), as
role mailroom_http. The API key reaches SQL as its sha256 digest, never as the key.
"""

from __future__ import annotations

from mailroom.db.contract import SqlFunction

_WHO = "p_address text, p_key_digest bytea"

mcp_create_mailbox = SqlFunction(
    "mcp_create_mailbox", "p_key_digest bytea, p_ttl_minutes integer = default, p_plan text = default", returns="jsonb"
)
mcp_list_mailboxes = SqlFunction("mcp_list_mailboxes", "p_key_digest bytea, p_limit integer = default", returns="jsonb")
mcp_list_messages = SqlFunction(
    "mcp_list_messages", f"{_WHO}, p_limit integer = default, p_offset integer = default", returns="jsonb"
)
mcp_read_message = SqlFunction("mcp_read_message", f"{_WHO}, p_message_id bigint", returns="jsonb")
mcp_check_message = SqlFunction(
    "mcp_check_message", f"{_WHO}, p_subject_like text = default, p_last boolean = default", returns="jsonb"
)
mcp_extract_link = SqlFunction(
    "mcp_extract_link", f"{_WHO}, p_message_id bigint, p_url_like text = default", returns="text"
)
mcp_extract_code = SqlFunction(
    "mcp_extract_code", f"{_WHO}, p_message_id bigint, p_pattern text = default", returns="text"
)
mcp_delete_mailbox = SqlFunction("mcp_delete_mailbox", _WHO, returns="boolean")
mcp_mark_message = SqlFunction(
    "mcp_mark_message", f"{_WHO}, p_message_id bigint, p_is_read boolean = default, p_tags text[] = default",
    returns="jsonb",
)
mcp_clear_messages = SqlFunction("mcp_clear_messages", _WHO, returns="jsonb")
mcp_extend_mailbox = SqlFunction("mcp_extend_mailbox", f"{_WHO}, p_ttl_seconds integer", returns="jsonb")
mcp_set_inbox_fault = SqlFunction(
    "mcp_set_inbox_fault",
    f"{_WHO}, p_stage text, p_reply text, p_share numeric = default, p_count integer = default",
    returns="jsonb",
)
mcp_clear_inbox_fault = SqlFunction("mcp_clear_inbox_fault", _WHO, returns="boolean")
mcp_error_codes = SqlFunction("mcp_error_codes", returns=("function_name", "code", "meaning"))
