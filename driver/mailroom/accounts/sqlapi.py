"""The SQL functions of accounts and tokens the driver calls (mailroom.db.contract): sql/1x, 4x."""

from __future__ import annotations

from mailroom.db.contract import SqlFunction

dequeue_tokens = SqlFunction(
    "dequeue_tokens", "p_limit integer, p_key bytea", returns=("action", "email", "login", "signed", "code", "token_id")
)
enqueue_token_emails = SqlFunction("enqueue_token_emails", "p_limit integer, p_key bytea", returns="integer")
create_account = SqlFunction("create_account", "p_email text, p_login text", returns="bigint")
consume_token = SqlFunction(
    "consume_token",
    "p_signed text, p_key bytea, p_code text = default, p_previous_keys bytea[] = default",
    returns=("account", "outcome", "attempts_left"),
)
account_status = SqlFunction("account_status", "p_account bigint", returns="mailroom.account_status")
request_password_recovery = SqlFunction("request_password_recovery", "p_email text")
token_actions = SqlFunction("token_actions", returns=(
    "action", "signing_path", "eligible_status", "with_code", "activates_account", "output_code",
))
