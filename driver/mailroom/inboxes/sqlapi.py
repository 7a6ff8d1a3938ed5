"""The SQL functions of the expiring inboxes the driver calls (mailroom.db.contract): sql/2x, and
the bounce return paths (sql/36_outbound_bounces.sql) that inbound SMTP checks and records."""

from __future__ import annotations

from mailroom.db.contract import SqlFunction

# inbound SMTP
check_bounce_recipient = SqlFunction(
    "check_bounce_recipient", "p_address text, p_size bigint = default, p_sink boolean = default",
    returns=("verdict", "address", "reply"),
)
check_message_size = SqlFunction(
    "check_message_size", "p_addresses text[], p_size bigint", returns=("verdict", "address", "reply")
)
# p_parsed: ParsedMessage.document() (mailroom.inboxes.mime), one JSON object per message; the inbound
# server adds the key "trace" (its SMTP session's facts), from which deliver_messages writes Received:
deliver_message = SqlFunction(
    "deliver_message", "p_address text, p_raw bytea, p_envelope_from text, p_parsed jsonb, p_trace text = default",
    returns="bigint",
)
deliver_messages = SqlFunction(
    "deliver_messages",
    "p_message integer[], p_address text[], p_raw bytea[], p_envelope_from text[], p_parsed jsonb[],"
    " p_receipt uuid = default",
    returns=("message", "message_ids", "verdict", "reply", "faults_skipped"),
    binary=("raw", "parsed"),  # the group commit's bulk: no hex or array escaping of bodies
)
# SMTP AUTH (sql/28_smtp_credentials.sql): only the secret's sha256 travels (mailroom.inboxes.auth)
smtp_login = SqlFunction(
    "smtp_login", "p_username text, p_digest bytea", returns=("credential_id", "capture_address", "expires_at")
)
create_smtp_credential = SqlFunction(
    "create_smtp_credential", "p_owner_id text, p_digest bytea, p_label text = default",
    returns=("credential_id", "username", "capture_address", "expires_at"),
)
list_smtp_credentials = SqlFunction(
    "list_smtp_credentials", "p_owner_id text = default",
    returns=("credential_id", "owner_id", "username", "label", "capture_address", "created_at", "last_login_at",
             "revoked_at"),
)
revoke_smtp_credential = SqlFunction("revoke_smtp_credential", "p_credential_id bigint", returns="boolean")
settle_delivery = SqlFunction("settle_delivery", "p_key uuid", returns="text[]")
record_bounce = SqlFunction(
    "record_bounce", "p_return_path text, p_reports jsonb", returns=("message_id", "outcome", "reports", "suppressed")
)
max_inbound_message_bytes = SqlFunction("max_inbound_message_bytes", returns="integer")
list_plans = SqlFunction("list_plans", returns=(
    "name", "default_ttl_minutes", "max_ttl_minutes", "max_message_bytes", "max_messages", "when_full",
))

# inboxes
create_mailbox = SqlFunction(
    "create_mailbox",
    "p_ttl_minutes integer = default, p_plan text = default, p_owner_type text = default, p_owner_id text = default",
    returns=("mailbox_id", "address", "expires_at", "session_token"),
)
list_messages = SqlFunction(
    "list_messages",
    "p_address text, p_session_token text, p_owner_type text = default, p_owner_id text = default,"
    " p_limit integer = default, p_offset integer = default",
    returns=("message_id", "received_at", "envelope_from", "from_header", "subject", "is_read", "size_bytes"),
)
read_message = SqlFunction(
    "read_message",
    "p_address text, p_session_token text, p_message_id bigint, p_owner_type text = default, p_owner_id text = default",
    returns=("envelope_from", "from_header", "subject", "text_body", "html_body", "attachments", "raw"),
)
extend_mailbox = SqlFunction(
    "extend_mailbox",
    "p_address text, p_session_token text, p_minutes integer, p_owner_type text = default, p_owner_id text = default",
    returns="timestamptz",
)
delete_mailbox = SqlFunction(
    "delete_mailbox",
    "p_address text, p_session_token text, p_owner_type text = default, p_owner_id text = default",
    returns="boolean",
)
wait_for_message = SqlFunction(
    "wait_for_message",
    "p_address text, p_session_token text, p_timeout interval, p_subject_like text = default,"
    " p_owner_type text = default, p_owner_id text = default, p_after_id bigint = default",
    returns=("message_id", "received_at", "subject"),
)

# expiry
expire_mailboxes = SqlFunction("expire_mailboxes", "p_batch integer = default", returns="integer")
purge_mailboxes = SqlFunction("purge_mailboxes", "p_older_than interval, p_batch integer = default", returns="integer")
seconds_until_next_expiry = SqlFunction("seconds_until_next_expiry", returns="double precision")

# search (sql/27_search.sql)
search_messages = SqlFunction(
    "search_messages",
    "p_address text, p_session_token text, p_query text, p_owner_type text = default, p_owner_id text = default,"
    " p_limit integer = default",
    returns=("message_id", "received_at", "from_header", "subject", "rank"),
)
inbox_stats = SqlFunction("inbox_stats", returns=(
    "open", "expired_unswept", "closed_unpurged", "deleted", "messages", "next_expiry_seconds",
))

# fault injection (sql/24_faults.sql)
set_inbox_fault = SqlFunction(
    "set_inbox_fault",
    "p_address text, p_session_token text, p_stage text, p_reply text, p_share numeric = default,"
    " p_count integer = default, p_owner_type text = default, p_owner_id text = default",
    returns="jsonb",
)
clear_inbox_fault = SqlFunction(
    "clear_inbox_fault",
    "p_address text, p_session_token text, p_owner_type text = default, p_owner_id text = default",
    returns="boolean",
)
inbox_fault = SqlFunction(
    "inbox_fault",
    "p_address text, p_session_token text, p_owner_type text = default, p_owner_id text = default",
    returns="jsonb",
)

# marks and deletes (sql/22_marks.sql)
mark_message = SqlFunction(
    "mark_message",
    "p_address text, p_session_token text, p_message_id bigint, p_is_read boolean = default,"
    " p_tags text[] = default, p_owner_type text = default, p_owner_id text = default",
    returns=("message_id", "is_read", "tags"),
)
delete_inbox_messages = SqlFunction(
    "delete_inbox_messages",
    "p_address text, p_session_token text, p_message_ids bigint[] = default, p_owner_type text = default,"
    " p_owner_id text = default",
    returns="integer",
)
