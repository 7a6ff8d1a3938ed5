"""The SQL functions of accounts and tokens the driver calls (mailroom.db.contract): sql/1x, 4x.

None takes a key: the signing keys live in the database's keyring (sql/15_keyring.sql), whose functions are
declared in db/sqlapi.py (`db migrate` imports a key, and db/keyring.py checks MAILROOM_SECRET_KEY)."""

from __future__ import annotations

from mailroom.db.contract import SqlFunction

dequeue_tokens = SqlFunction(
    "dequeue_tokens", "p_limit integer", returns=("action", "email", "login", "signed", "code", "token_id")
)
enqueue_token_emails = SqlFunction("enqueue_token_emails", "p_limit integer", returns="integer")
create_account = SqlFunction("create_account", "p_email text, p_login text", returns="bigint")
consume_token = SqlFunction(
    "consume_token", "p_signed text, p_code text = default", returns=("account", "outcome", "attempts_left")
)
account_status = SqlFunction("account_status", "p_account bigint", returns="mailroom.account_status")
# `mailroom account …` (accounts/cli.py): the application's calls (mailroom_app), and list/show (admin)
suspend_account = SqlFunction("suspend_account", "p_account bigint", returns="mailroom.account_status")
unsuspend_account = SqlFunction("unsuspend_account", "p_account bigint", returns="mailroom.account_status")
list_accounts = SqlFunction(
    "list_accounts",
    "p_account bigint = default, p_email text = default, p_status mailroom.account_status = default,"
    " p_limit integer = default, p_after bigint = default",
    returns=("id", "email", "login", "status", "created_at", "activated_at", "suspended_at", "status_changed_at"),
)
request_password_recovery = SqlFunction("request_password_recovery", "p_email text, p_requester text = default")

token_actions = SqlFunction("token_actions", returns=(
    "action", "signing_path", "eligible_status", "with_code", "activates_account", "output_code",
))
