"""The SQL functions of the outbound queue the driver calls (mailroom.db.contract): sql/3x.

None takes a key: relay passwords come back encrypted to the sender key (outbound/sealing.py)."""

from __future__ import annotations

from dataclasses import dataclass

from mailroom.db.contract import SqlFunction

# the claim's row: the attributes of the composite type mailroom.claimed_message (migration 0250),
# in their order; every form of the claim returns it (tests/db/test_contract.py checks this
# declaration against the type, so a column added to the type without this line fails there)
CLAIMED_MESSAGE = (
    "id", "claim_token", "attempts", "message_id", "sender_name", "from_address", "to_addrs", "cc_addrs",
    "bcc_addrs", "subject", "text_body", "html_body", "headers", "created_at", "possibly_sent", "smtp_host",
    "smtp_port", "smtp_security", "smtp_username", "smtp_password_sealed", "smtp_password_set",
    "smtp_allow_cleartext", "return_path", "recipients", "return_paths", "list_unsubscribe", "dkim_domain",
    "dkim_selector", "dkim_public_key", "dkim_algorithm", "attachments", "raw_message",
    # a webhook delivery (migration 0510, sql/38_outbound_webhooks.sql): its kind, URL and sealed secret
    "kind", "webhook_url", "webhook_secret_sealed",
)

# the sender
claim_messages = SqlFunction(
    "claim_messages", "p_limit integer, p_worker text, p_lease interval = default", returns=CLAIMED_MESSAGE
)
# finalize_messages then claim_messages in one commit: outcome rows (message None), then claimed rows
# (message: a mailroom.claimed_message, read as a row once the connection registered the type)
finalize_and_claim = SqlFunction(
    "finalize_and_claim",
    "p_limit integer, p_worker text, p_ids bigint[], p_claim_tokens bigint[], p_outcomes text[],"
    " p_smtp_codes integer[] = default, p_enhanced_codes text[] = default, p_errors text[] = default,"
    " p_lease interval = default",
    returns=("id", "result", "attempts", "next_retry_at", "reply_class", "message"),
)
finalize_messages = SqlFunction(
    "finalize_messages",
    "p_ids bigint[], p_claim_tokens bigint[], p_outcomes text[], p_smtp_codes integer[] = default,"
    " p_enhanced_codes text[] = default, p_errors text[] = default",
    returns=("id", "result", "attempts", "next_retry_at", "reply_class"),
)
record_refused_recipients = SqlFunction(
    "record_refused_recipients",
    "p_ids bigint[], p_claim_tokens bigint[], p_recipients text[], p_smtp_codes integer[], p_enhanced_codes text[]",
    returns="integer",
)
release_messages = SqlFunction("release_messages", "p_ids bigint[], p_claim_tokens bigint[]", returns="integer")
reap_stuck_messages = SqlFunction("reap_stuck_messages", "p_older_than interval = default", returns="integer")
outbound_stats = SqlFunction("outbound_stats", returns=(
    "queued", "processing", "sent", "failed", "due_now", "retries_waiting", "possibly_sent",
    "oldest_queued_age_seconds", "stale_outcomes", "reaped", "held", "cancelled", "held_back", "scheduled",
    "webhook_possible_duplicates",
))

# operators
list_outbound_messages = SqlFunction(
    "list_outbound_messages", "p_status text = default, p_limit integer = default, p_domain text = default",
    returns=("id", "sender", "status", "priority", "attempts", "recipients", "last_smtp_code", "last_enhanced_code",
             "possibly_sent", "next_retry_at", "created_at", "sent_at"),
)
show_outbound_message = SqlFunction("show_outbound_message", "p_id bigint", returns=(
    "id", "sender", "status", "priority", "attempts", "recipients", "recipient_domain", "message_id",
    "idempotency_key", "idempotency_scope", "last_outcome", "last_smtp_code", "last_enhanced_code", "possibly_sent",
    "claimed_by", "lease_expires_at", "next_retry_at", "send_after", "created_at", "sent_at", "suppressed_recipients",
    "error_log",
))
retry_message = SqlFunction("retry_message", "p_id bigint", returns="bigint")
retry_failed_messages = SqlFunction("retry_failed_messages", returns="integer")
purge_sent_messages = SqlFunction(
    "purge_sent_messages", "p_before timestamptz, p_batch integer = default, p_dry_run boolean = default",
    returns="integer",
)
enqueue_message = SqlFunction(
    "enqueue_message",
    "p_sender text, p_to text[], p_subject text, p_text_body text, p_html_body text = default, p_cc text[] = default,"
    " p_bcc text[] = default, p_headers jsonb = default, p_idempotency_key text = default,"
    " p_send_after timestamptz = default, p_priority integer = default",
    returns="bigint",
)
enqueue_bulk_message = SqlFunction(
    "enqueue_bulk_message",
    "p_sender text, p_to text[], p_subject text, p_text_body text, p_html_body text = default, p_cc text[] = default,"
    " p_bcc text[] = default, p_headers jsonb = default, p_idempotency_key text = default,"
    " p_send_after timestamptz = default, p_priority integer = default",
    returns="bigint",
)
list_senders = SqlFunction("list_senders", returns=(
    "name", "from_address", "smtp_host", "smtp_port", "smtp_security", "smtp_username", "password_set",
    "bounce_domain", "queued", "created_at", "updated_at",
))

# the operator's verbs on queued mail (sql/37_outbound_queue.sql): one result shape for all
_SELECTION = "p_ids bigint[] = default, p_domain text = default, p_all boolean = default, p_status text = default," \
             " p_dry_run boolean = default"
VERB_RESULT = ("changed", "in_flight", "suppressed", "sample_ids", "suppressed_ids")
hold_messages = SqlFunction("hold_messages", _SELECTION, returns=VERB_RESULT)
release_held_messages = SqlFunction("release_held_messages", _SELECTION, returns=VERB_RESULT)
cancel_messages = SqlFunction("cancel_messages", _SELECTION, returns=VERB_RESULT)
delete_messages = SqlFunction("delete_messages", _SELECTION, returns=VERB_RESULT)
run_messages_now = SqlFunction("run_messages_now", _SELECTION, returns=VERB_RESULT)
retry_messages = SqlFunction(
    "retry_messages", _SELECTION + ", p_include_suppressed boolean = default", returns=VERB_RESULT
)


@dataclass(frozen=True)
class QueueVerb:
    """A row of mailroom.queue_verbs (migration 0251) as the CLI uses it: `mailroom outbound COMMAND`
    calls `function`; tests/outbound/test_queue_verbs.py checks each declaration against its row."""

    verb: str
    function: SqlFunction
    command: str
    from_statuses: tuple[str, ...]
    destructive: bool  # wants --yes for more than one message
    past_tense: str
    description: str  # the command's help


QUEUE_VERBS = (
    QueueVerb("hold", hold_messages, "hold", ("queued",), False, "held",
              "Put queued messages on hold: no sender takes them until released (postsuper -h)."),
    QueueVerb("release", release_held_messages, "release", ("held",), False, "released",
              "Release held messages back to the queue, due when they were (postsuper -H)."),
    QueueVerb("cancel", cancel_messages, "cancel", ("queued", "held"), True, "cancelled",
              "Cancel queued or held messages: never sent, kept as cancelled until retention (retry brings them back)."),
    QueueVerb("delete", delete_messages, "delete", ("queued", "held", "sent", "failed", "cancelled"), True, "deleted",
              "Delete messages of any status but processing, with their idempotency keys, for good (postsuper -d)."),
    QueueVerb("run_now", run_messages_now, "run-now", ("queued",), False, "made due now",
              "Make queued messages due now (a deferred retry, a later send_after) and lift their domains' backoff; "
              "the senders are woken (postqueue -f, postqueue -s DOMAIN)."),
    QueueVerb("retry", retry_messages, "retry", ("failed", "cancelled", "held"), True, "queued again",
              "Queue failed, cancelled or held messages again, due now with a fresh attempt budget (postsuper -r); "
              "messages with a recipient suppressed since are left alone, with a warning, unless --include-suppressed."),
)

outbound_queue = SqlFunction("outbound_queue", "p_limit integer = default", returns=(
    "domain", "queued", "due", "held_back", "deferred", "scheduled", "held", "processing", "oldest_age_seconds",
    "backoff_until",
))
upsert_sender = SqlFunction(
    "upsert_sender",
    "p_name text, p_from_address text, p_host text, p_port integer, p_security text = default,"
    " p_username text = default, p_password text = default, p_sealed_password bytea = default,"
    " p_allow_cleartext boolean = default",
    returns="bigint",
)
set_sender_bounce_domain = SqlFunction("set_sender_bounce_domain", "p_sender text, p_domain text")
sender_public_key = SqlFunction("sender_public_key", returns=("id", "public_key", "key_id", "created_at"))
set_sender_public_key = SqlFunction("set_sender_public_key", "p_public_key bytea", returns="integer")
convert_sender_passwords = SqlFunction("convert_sender_passwords", "p_old_key bytea", returns="integer")

# per-domain limits
set_domain_limit = SqlFunction(
    "set_domain_limit", "p_pattern text, p_max_in_flight integer, p_max_per_minute integer", returns="text"
)
delete_domain_limit = SqlFunction("delete_domain_limit", "p_pattern text", returns="text")
list_domain_limits = SqlFunction("list_domain_limits", returns=("pattern", "max_in_flight", "max_per_minute",
                                                                "updated_at"))
domain_status = SqlFunction("domain_status", "p_limit integer = default", returns=(
    "domain", "pattern", "in_flight", "max_in_flight", "claimed_this_minute", "max_per_minute", "backoff_until",
    "backoff_level",
))

# the suppression list
suppress = SqlFunction(
    "suppress", "p_address text, p_reason text, p_expires_at timestamptz = default, p_source_message bigint = default",
    returns="bigint",
)
unsuppress = SqlFunction("unsuppress", "p_address text", returns="boolean")
is_suppressed = SqlFunction("is_suppressed", "p_address text", returns="boolean")
list_suppressions = SqlFunction("list_suppressions", "p_limit integer = default", returns=(
    "address", "reason", "active", "source_message", "created_at", "expires_at",
))

# DKIM (sql/30_outbound_dkim.sql): the public halves only
set_dkim_key = SqlFunction(
    "set_dkim_key", "p_sender text, p_selector text, p_public_key text, p_algorithm text = default",
    returns=("domain", "selector", "dns_name", "dns_value"),
)
delete_dkim_key = SqlFunction("delete_dkim_key", "p_domain text")

# webhooks (sql/38_outbound_webhooks.sql): the operator's
add_webhook = SqlFunction(
    "add_webhook", "p_url text, p_events text[], p_key_id bigint = default, p_sender text = default",
    returns=("id", "secret"),
)
list_webhooks = SqlFunction("list_webhooks", "p_key_id bigint = default", returns=(
    "id", "key_id", "owner_id", "sender", "url", "events", "queued", "created_at",
))
remove_webhook = SqlFunction("remove_webhook", "p_id bigint")
webhook_deliveries = SqlFunction("webhook_deliveries", "p_endpoint_id bigint, p_limit integer = default", returns=(
    "id", "event", "webhook_id", "status", "attempts", "possibly_sent", "last_status", "next_retry_at", "created_at",
    "sent_at", "attempt_log",
))
replay_webhook = SqlFunction("replay_webhook", "p_delivery_id bigint", returns="bigint")
