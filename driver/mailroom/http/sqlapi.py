"""The SQL functions of the HTTP face, as the driver calls them (mailroom.db.contract).

Every request of `mailroom http serve` is one of these calls (sql/29_http.sql, sql/29_ses.sql,
sql/27_search.sql); `mailroom apikey` and `mailroom catchall` call the admin functions of
sql/28_api_keys.sql and sql/24_catchall.sql. A credential reaches SQL as the inbox's session
token or as the sha256 digest of an API key, never as the key.
"""

from __future__ import annotations

from mailroom.api.operations import BY_NAME as _OPS
from mailroom.api.sqlapi import http_mailbox_view, http_wait_look, wait_caps, wait_refused  # noqa: F401 (shared)
from mailroom.db.contract import SqlFunction

# the inbox operations' functions (declared once, in api/operations.py), by the names the routes use
http_create_mailbox = _OPS["create_mailbox"].sql
http_get_mailbox = _OPS["get_mailbox"].sql
http_list_mailboxes = _OPS["list_mailboxes"].sql
http_list_messages = _OPS["list_messages"].sql
http_update_message = _OPS["update_message"].sql
http_delete_messages = _OPS["delete_messages"].sql
http_clear_messages = _OPS["clear_messages"].sql
http_extend_mailbox = _OPS["extend_mailbox"].sql
http_read_message = _OPS["read_message"].sql
http_delete_mailbox = _OPS["delete_mailbox"].sql
http_delete_message = _OPS["delete_message"].sql
http_extract_link = _OPS["extract_link"].sql
http_extract_code = _OPS["extract_code"].sql
http_search_messages = _OPS["search_messages"].sql
http_set_inbox_fault = _OPS["set_fault"].sql
http_clear_inbox_fault = _OPS["clear_fault"].sql
http_inbox_fault = _OPS["get_fault"].sql

_WHO = "p_address text, p_session_token text, p_key_digest bytea"

# the one listing of an API key's inboxes (the REST list, the page, MCP): a JSON array of Mailbox
# issue 35 item 1: marks (read, tags), deleting selected or all, extending, an owner's all-mail list
http_list_all_messages = SqlFunction(
    "http_list_all_messages",
    "p_session_token text, p_key_digest bytea, p_limit integer = default, p_before_id bigint = default,"
    " p_tag text = default, p_unread boolean = default, p_query text = default",
    returns="jsonb",
)
http_message_raw = SqlFunction("http_message_raw", f"{_WHO}, p_message_id bigint", returns="bytea")
http_message_attachment = SqlFunction(
    "http_message_attachment", f"{_WHO}, p_message_id bigint, p_index integer", returns=("raw", "attachment")
)
# the frame of the HTML part: its inline images (sql/22_reading.sql _inline_images) and, with any, the raw message
http_message_frame = SqlFunction(
    "http_message_frame", f"{_WHO}, p_message_id bigint", returns=("html_body", "inline_parts", "raw")
)
http_check_message = SqlFunction(
    "http_check_message", f"{_WHO}, p_subject_like text = default, p_last boolean = default", returns="jsonb"
)
# the checks of a message (sql/29_checks.sql, docs/checks.md): what a check reads (the link check: and
# the ports it may ask); p_enabled is this server's switch for it (MR280, MR281 when off)
http_message_check = SqlFunction(
    "http_message_check", f"{_WHO}, p_message_id bigint, p_check text, p_enabled boolean = default",
    returns=("html_body", "text_body", "raw", "link_ports"),
)
# fault injection (sql/24_faults.sql through sql/29_http.sql)
# release (sql/32_outbound_release.sql): one of the two ways mailroom_http queues mail, and the form's options
http_release_message = SqlFunction(
    "http_release_message", f"{_WHO}, p_message_id bigint, p_to text, p_sender text = default", returns="jsonb"
)
release_options = SqlFunction("release_options", returns="jsonb")
# send over HTTP (sql/32_outbound_send.sql): the other way, POST /api/v1/send; the request as one document
http_send_message = SqlFunction(
    "http_send_message", "p_key_digest bytea, p_message jsonb, p_idempotency_key text = default", returns="jsonb"
)
index_messages = SqlFunction("index_messages", "p_message_ids bigint[]", returns="integer")
deliver_ses_message = SqlFunction(
    "deliver_ses_message",
    "p_ses_message_id text, p_recipients text[], p_raw bytea, p_envelope_from text, p_parsed jsonb",
    returns=("recipient", "outcome", "message_id"),
)

# operators (mailroom_admin)
create_api_key = SqlFunction(
    "create_api_key", "p_owner_id text, p_key_digest bytea, p_label text = default, p_hint text = default",
    returns="bigint",
)
list_api_keys = SqlFunction(
    "list_api_keys", "p_owner_id text = default",
    returns=("key_id", "owner_id", "label", "hint", "created_at", "revoked_at"),
)
revoke_api_key = SqlFunction("revoke_api_key", "p_key_id bigint", returns="boolean")
grant_api_key_sender = SqlFunction("grant_api_key_sender", "p_key_id bigint, p_sender text", returns="boolean")
revoke_api_key_sender = SqlFunction("revoke_api_key_sender", "p_key_id bigint, p_sender text", returns="boolean")
list_api_key_senders = SqlFunction(
    "list_api_key_senders", "p_key_id bigint = default",
    returns=("key_id", "owner_id", "sender", "from_address", "granted_at"),
)
set_catchall_domain = SqlFunction(
    "set_catchall_domain",
    "p_domain text, p_owner_id text, p_plan text = default, p_max_open integer = default,"
    " p_ttl_minutes integer = default",
)
remove_catchall_domain = SqlFunction("remove_catchall_domain", "p_domain text", returns="boolean")
list_catchall_domains = SqlFunction(
    "list_catchall_domains",
    returns=("domain", "owner_id", "plan", "ttl_minutes", "max_open", "open_inboxes", "created_at"),
)

# one-click unsubscribe (RFC 8058, sql/36_outbound_unsubscribe.sql): the token of the link, the form field's value
unsubscribe = SqlFunction("unsubscribe", "p_token text, p_one_click text", returns="boolean")

# webhooks (sql/38_outbound_webhooks.sql): an API key's own endpoints
http_add_webhook = SqlFunction("http_add_webhook", "p_key_digest bytea, p_url text, p_events text[]", returns="jsonb")
http_list_webhooks = SqlFunction("http_list_webhooks", "p_key_digest bytea", returns="jsonb")
http_remove_webhook = SqlFunction("http_remove_webhook", "p_key_digest bytea, p_id bigint", returns="jsonb")
http_webhook_deliveries = SqlFunction(
    "http_webhook_deliveries", "p_key_digest bytea, p_id bigint, p_limit integer = default", returns="jsonb"
)
http_replay_webhook = SqlFunction("http_replay_webhook", "p_key_digest bytea, p_delivery_id bigint", returns="jsonb")
