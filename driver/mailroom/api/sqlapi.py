"""The declarations both faces (REST, MCP) call: the one wait's look and the caps on waits
(sql/29_http.sql, sql/25_waiting.sql; docs/architecture.md "The wait")."""

from __future__ import annotations

from mailroom.db.contract import SqlFunction

_WHO = "p_address text, p_session_token text, p_key_digest bytea"

# the one wait (REST's long poll, MCP's wait_for_message): one look, {mailbox_id, expires_in, message}
http_wait_look = SqlFunction(
    "http_wait_look",
    f"{_WHO}, p_subject_like text = default, p_after_id bigint = default, p_last boolean = default",
    returns="jsonb",
)
# the caps a server process counts its waits and event streams against, and the refusal over one
wait_caps = SqlFunction("wait_caps", returns=("kind", "per_credential", "total"))
wait_refused = SqlFunction("wait_refused", "p_kind text, p_scope text")
