"""A token type is data (issue 36, item 3): a type added with `ALTER TYPE … ADD VALUE` and its row of
mailroom.token_actions signs and verifies through every signing path, with the row's path and code rule.

Before, the claim's one-token signer (`_signed_value`, used by sign_token and claim_messages) wrote the
paths as a CASE: a new type was signed as a recovery without its code, i.e. as NULL.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import psycopg

from mailroom.testing import as_login


def _add_type(conn: psycopg.Connection, name: str, path: str, with_code: bool, output_code: int) -> None:
    conn.execute(f"ALTER TYPE mailroom.token_action ADD VALUE IF NOT EXISTS '{name}'")
    conn.execute(
        "INSERT INTO mailroom.token_actions (action, signing_path, eligible_status, with_code, activates_account, output_code)"
        " VALUES (%s, %s, 'active', %s, false, %s)", (name, path, with_code, output_code))


def _expected(key: bytes, path: str, secret: bytes, code: str = "") -> str:
    mac = hmac.new(key, path.encode() + secret + code.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(secret + mac).rstrip(b"=").decode()


def test_a_new_token_type_signs_with_its_own_path_and_verifies(conn, db_url):
    _add_type(conn, "email_change", "/confirm-email", False, 7)
    _add_type(conn, "login_code", "/login", True, 8)
    key = bytes(conn.execute("SELECT key FROM mailroom.signing_keys WHERE state = 'active'").fetchone()[0])
    secret = os.urandom(32)
    with psycopg.connect(as_login(db_url, "mr_admin"), autocommit=True) as admin, \
            psycopg.connect(as_login(db_url, "mr_app"), autocommit=True) as app:
        signed = admin.execute("SELECT mailroom.sign_token('email_change', %s)", (secret,)).fetchone()[0]
        assert signed == _expected(key, "/confirm-email", secret)
        valid, action, _ = app.execute("SELECT * FROM mailroom.verify_token(%s)", (signed,)).fetchone()
        assert (valid, action) == (True, "email_change")

        coded = admin.execute("SELECT mailroom.sign_token('login_code', %s, '01234')", (secret,)).fetchone()[0]
        assert coded == _expected(key, "/login", secret, "01234")
        assert app.execute("SELECT valid, action FROM mailroom.verify_token(%s, '01234')", (coded,)).fetchone() \
            == (True, "login_code")
        assert app.execute("SELECT valid FROM mailroom.verify_token(%s, '99999')", (coded,)).fetchone()[0] is False

        # the array form (dequeue's) and the one-token form (claim's) agree for every type
        every = (("activation", None), ("password_recovery", "12345"), ("email_change", None), ("login_code", "54321"))
        for action, code in every:
            one, many = conn.execute(
                "SELECT mailroom_internal._signed_value(%s::mailroom.token_action, %s, %s, %s),"
                " (mailroom_internal._signed_values(ARRAY[%s::mailroom.token_action], ARRAY[%s::bytea], ARRAY[%s::text], %s))[1]",
                (action, secret, code, key, action, secret, code, key)).fetchone()
            assert one == many, action


def test_a_type_without_its_row_is_refused_not_signed_as_another(conn, db_url):
    conn.execute("ALTER TYPE mailroom.token_action ADD VALUE IF NOT EXISTS 'orphan'")
    with psycopg.connect(as_login(db_url, "mr_admin"), autocommit=True) as admin:
        try:
            admin.execute("SELECT mailroom.sign_token('orphan', %s)", (os.urandom(32),))
        except psycopg.Error as exc:
            assert exc.sqlstate == "MR125"
        else:
            raise AssertionError("a type without its row was signed")
