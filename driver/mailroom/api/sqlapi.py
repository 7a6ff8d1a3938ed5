"""The declarations both faces (REST, MCP) call: the one wait's look and the caps on waits
(sql/29_http.sql, sql/25_waiting.sql; docs/architecture.md "The wait")."""

from __future__ import annotations

from mailroom.api.operations import BY_NAME
from mailroom.db.contract import SqlFunction

# the one wait (REST's long poll, MCP's wait_for_message): one look, {mailbox_id, expires_in, message}
http_wait_look = BY_NAME["wait_for_message"].sql
# the page, the start of REST's /events and MCP's inbox resource: {"mailbox": Mailbox, "messages": [MessageSummary]}
http_mailbox_view = SqlFunction(
    "http_mailbox_view",
    "p_address text, p_session_token text, p_key_digest bytea, p_limit integer = default, p_offset integer = default,"
    " p_after_id bigint = default, p_before_id bigint = default",
    returns="jsonb",
)
# the caps a server process counts its waits and event streams against, and the refusal over one
wait_caps = SqlFunction("wait_caps", returns=("kind", "per_credential", "total"))
wait_refused = SqlFunction("wait_refused", "p_kind text, p_scope text")
# every code's meaning in a face's words (the MCP server's tool descriptions)
face_error_meanings = SqlFunction("face_error_meanings", "p_face text", returns=("code", "meaning"))
