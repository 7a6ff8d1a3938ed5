"""The NOTIFY contract, channel by channel (docs/architecture.md, "NOTIFY, channel by channel").

The seed's psql walkthrough (`LISTEN token_insert;`, then an insert) prints its notification on a
fresh install: the token channel always notifies, no `mailroom.listen` needed. Every channel's rule
is read from the table of docs/architecture.md and checked here against the database, as runtime
logins that never register; and the channels the schema sends on are exactly the table's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from mailroom import testing

ROOT = Path(__file__).resolve().parents[2]
HEARD = 5.0  # liveness bound for a notification that must arrive (seconds)
SILENT = 0.5  # how long a notification that must not arrive is waited for


def documented_rules() -> dict[str, str]:
    """channel -> 'always' | 'registered', from the table of docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## NOTIFY, channel by channel", 1)[1].split("\n## ", 1)[0]
    rules = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].startswith("`"):
            channel = re.match(r"`([a-z_]+)`", cells[0]).group(1)
            rule = re.match(r"\*\*(always|registered)\*\*", cells[3])
            assert rule, f"docs/architecture.md: the rule of {channel} is neither **always** nor **registered**"
            rules[channel] = rule.group(1)
    return rules


def listener(db_url: str, channel: str, login: str = "mr_app") -> psycopg.Connection:
    """A plain psycopg connection that LISTENs, as a runtime login, and never calls mailroom.listen."""
    conn = psycopg.connect(testing.as_login(db_url, login), autocommit=True)
    conn.execute(f"LISTEN {channel}")
    return conn


def heard(conn: psycopg.Connection, timeout: float) -> list[tuple[str, str]]:
    return [(n.channel, n.payload) for n in conn.notifies(timeout=timeout, stop_after=1)]


def test_plain_listen_token_insert_hears_create_account(db_url):
    """The seed's walkthrough: LISTEN token_insert in one session, an account inserted in another."""
    with listener(db_url, "token_insert") as lis, \
            psycopg.connect(testing.as_login(db_url, "mr_app"), autocommit=True) as app:
        app.execute("SELECT mailroom.create_account('seed@example.com', 'seed')")
        assert heard(lis, HEARD) == [("token_insert", "1")]
        app.execute("SELECT mailroom.request_password_recovery('nobody@example.com', NULL)")
        assert heard(lis, HEARD) == [("token_insert", "1")]  # the same for any address
    with psycopg.connect(db_url, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM mailroom.listeners").fetchone()[0] == 0  # nobody registered


def test_one_notification_per_statement_with_the_count(db_url, conn):
    with listener(db_url, "token_insert") as lis:
        conn.execute("INSERT INTO mailroom.accounts (email, login) "
                     "SELECT 'bulk' || g || '@example.com', 'bulk' || g FROM generate_series(1, 250) AS g")
        assert heard(lis, HEARD) == [("token_insert", "250")]
        assert heard(lis, SILENT) == []  # one, not 250


def test_a_renamed_token_channel_always_notifies_too(db_url, conn):
    conn.execute("SELECT mailroom.set_setting('tokens.channel', 'my_tokens')")
    with listener(db_url, "my_tokens") as lis, listener(db_url, "token_insert") as old:
        conn.execute("SELECT mailroom.create_account('renamed@example.com', 'renamed')")
        assert heard(lis, HEARD) == [("my_tokens", "1")]
        assert heard(old, SILENT) == []


def _produce(db_url: str, conn: psycopg.Connection) -> dict[str, Callable[[], None]]:
    """One event on each channel, each made by the role that makes it in production."""

    def as_(login: str, sql: str, params: tuple = ()) -> None:
        with psycopg.connect(testing.as_login(db_url, login), autocommit=True) as c:
            c.execute(sql, params)

    conn.execute("SELECT mailroom.upsert_sender('main', 'robot@mailroom.test', '127.0.0.1', 2525)")
    state: dict[str, str] = {}

    def mailbox() -> str:
        if "address" not in state:
            with psycopg.connect(testing.as_login(db_url, "mr_app"), autocommit=True) as c:
                state["address"] = c.execute("SELECT address FROM mailroom.create_mailbox(600, 'free')").fetchone()[0]
        return state["address"]

    def deliver() -> None:
        as_("mr_inbound", "SELECT mailroom.deliver_message(%s, %s)", (mailbox(), b"Subject: x\r\n\r\nbody\r\n"))

    def new_first_mailbox() -> None:
        # a shorter TTL than every open inbox: it becomes the next due
        as_("mr_app", "SELECT mailroom.create_mailbox(1, 'free')")

    return {
        "token_insert": lambda: as_("mr_app", "SELECT mailroom.create_account('c@example.com', 'c')"),
        "mailroom_outbound": lambda: as_("mr_app", "SELECT mailroom.enqueue_message('main', ARRAY['a@example.com'], 's', 't')"),
        "mailroom_expiry_schedule": new_first_mailbox,
        "mailroom_inbox": deliver,
        "mailroom_delivery": deliver,
    }


RULES = documented_rules()


def test_the_table_lists_every_channel_the_schema_sends_on(conn):
    sent = set()
    for path in sorted((ROOT / "sql").rglob("*.sql")):
        text = path.read_text()
        sent |= set(re.findall(r"pg_notify\(\s*'([a-z_]+)'", text))
        for names in re.findall(r"mailroom_internal\._notify_each\(\s*ARRAY\[([^\]]*)\]", text):
            sent |= set(re.findall(r"'([a-z_]+)'", names))
    sent.add(conn.execute("SELECT mailroom.setting('tokens.channel')").fetchone()[0])
    assert set(RULES) == sent, "docs/architecture.md's NOTIFY table and the channels of sql/ differ"
    assert RULES["token_insert"] == "always"  # the seed's contract


@pytest.mark.parametrize("channel", sorted(RULES))
def test_each_channel_follows_its_documented_rule(db_url, conn, channel):
    produce = _produce(db_url, conn)
    assert set(produce) == set(RULES), "a channel of the table has no producer in this test"
    if channel in ("mailroom_inbox", "mailroom_delivery"):
        produce[channel]()  # the mailbox exists before the listener starts
    if channel == "mailroom_expiry_schedule":
        conn.execute("SELECT mailroom.create_mailbox(600, 'free')")  # an open inbox due later
    with listener(db_url, channel) as lis:
        produce[channel]()
        got = heard(lis, HEARD if RULES[channel] == "always" else SILENT)
        if RULES[channel] == "always":
            assert [c for c, _ in got] == [channel], f"{channel} is documented always, LISTEN alone heard nothing"
            return
        assert got == [], f"{channel} is documented registered, but notified with nobody registered"
        lis.execute("SELECT mailroom.listen(ARRAY[%s])", (channel,))
        produce[channel]()
        assert [c for c, _ in heard(lis, HEARD)] == [channel], f"{channel}: registered, still nothing"
        lis.execute("SELECT mailroom.unlisten()")
        conn.execute("SELECT mailroom.set_setting('notify.always', 'true')")
        produce[channel]()
        assert [c for c, _ in heard(lis, HEARD)] == [channel], f"{channel}: notify.always, still nothing"
