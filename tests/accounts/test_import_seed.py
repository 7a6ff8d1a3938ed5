"""`mailroom db import-seed` (issue 33, item 8): a database built from the original mailroom's own SQL
(tests/accounts/fixtures/seed_schema.sql, the article's text), used the way its walkthrough uses it,
imported into a fresh mailroom: statuses and timestamps, the links the seed's collector mailed consume,
the tokens it had not mailed are dispatched by mailroom's collector, collisions skipped and counted,
a second run imports nothing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid
from pathlib import Path

import psycopg
import pytest

from mailroom import testing
from mailroom.testing import as_login

SEED_SQL = (Path(__file__).parent / "fixtures" / "seed_schema.sql").read_text()
SEED_KEY = "cafebabe" * 8  # the article's MAILROOM_SECRET_KEY


def _link(secret: bytes, path: bytes, code: str = "") -> str:
    """The seed collector's link value: base64url(secret || HMAC-SHA256(key, path || secret [|| code]))."""
    mac = hmac.new(bytes.fromhex(SEED_KEY), path + secret + code.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(secret + mac).rstrip(b"=").decode()


@pytest.fixture
def seed_url(pg):
    name = f"seed_{uuid.uuid4().hex[:12]}"
    url = testing.create_database(pg, name)
    with psycopg.connect(url, autocommit=True) as seed:
        seed.execute(SEED_SQL)
    yield url
    testing.drop_database(pg, name)


def _seed(seed_url: str) -> dict:
    """Accounts in each status and tokens dispatched, undispatched, consumed and expired, as the article's
    walkthrough makes them (INSERT, UPDATE tokens SET consumed_at, UPDATE accounts SET status)."""
    with psycopg.connect(seed_url, autocommit=True) as s:
        def add(email: str, login: str) -> int:
            return s.execute("INSERT INTO accounts (email, login) VALUES (%s, %s) RETURNING id", (email, login)).fetchone()[0]

        prov = add("prov@example.com", "prov")
        act = add("act@example.com", "act")
        s.execute("UPDATE tokens SET consumed_at = extract(epoch FROM now()) WHERE account = %s AND action = 'activation'",
                  (act,))
        s.execute("INSERT INTO tokens (account, action) VALUES (%s, 'password_recovery')", (act,))
        sus = add("sus@example.com", "sus")
        s.execute("UPDATE tokens SET consumed_at = extract(epoch FROM now()) WHERE account = %s", (sus,))
        s.execute("UPDATE accounts SET status = 'suspended' WHERE id = %s", (sus,))
        # the seed's collector ran: everything so far was mailed
        s.execute("UPDATE jobs SET last_seq = (SELECT max(id) FROM tokens) WHERE job_type = 'mailroom'")
        fresh = add("fresh@example.com", "fresh")
        stale = add("stale@example.com", "stale")
        s.execute("UPDATE tokens SET expires_at = extract(epoch FROM now())::integer - 60 WHERE account = %s", (stale,))
        add("taken@example.com", "taken")
        add("clash@example.com", "takenlogin")
        secrets = {
            (login, action): (bytes(secret), code)
            for login, action, secret, code in s.execute(
                "SELECT a.login, t.action::text, t.secret, t.code FROM tokens t JOIN accounts a ON a.id = t.account")
        }
        accounts = {r[0]: r[1:] for r in s.execute(
            "SELECT login, status::text, created_at, status_changed_at, activated_at, suspended_at, unsuspended_at"
            " FROM accounts")}
    return {"secrets": secrets, "accounts": accounts, "ids": (prov, act, sus, fresh, stale)}


def test_an_original_mailroom_database_imports(cli, conn, db_url, seed_url):
    seed = _seed(seed_url)
    conn.execute("SELECT mailroom.create_account('TAKEN@example.com', 'someone')")
    conn.execute("SELECT mailroom.create_account('other@example.com', 'takenlogin')")
    admin = {"MAILROOM_DATABASE_URL": as_login(db_url, "mr_admin")}
    imported = cli("keys", "import", env={"MAILROOM_SECRET_KEY": SEED_KEY})
    assert imported.returncode == 0, imported.stderr

    run = cli("db", "import-seed", seed_url, env=admin)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("imported 5 accounts, skipped 2 "), run.stdout
    for line in ("accounts skipped: email exists: 1", "accounts skipped: login exists: 1",
                 "tokens imported dispatched: 2", "tokens imported undispatched: 1", "tokens left: consumed: 2",
                 "tokens left: expired: 1", "activation tokens issued (provisioned, none usable in the seed): 1"):
        assert f"  {line}\n" in run.stdout, run.stdout
    assert "@" not in run.stdout + run.stderr, "an address printed"

    # statuses and timestamps, epoch for epoch
    got = {r[0]: r[1:] for r in conn.execute(
        "SELECT login, status::text, "
        + ", ".join(f"extract(epoch FROM {c})::bigint" for c in (
            "created_at", "status_changed_at", "activated_at", "suspended_at", "unsuspended_at"))
        + " FROM mailroom.accounts WHERE login IN ('prov', 'act', 'sus', 'fresh', 'stale')")}
    assert got == {k: v for k, v in seed["accounts"].items() if k in got} and len(got) == 5
    assert dict(conn.execute("SELECT login, status::text FROM mailroom.accounts WHERE login IN ('act', 'sus')")) == {
        "act": "active", "sus": "suspended"}
    assert conn.execute("SELECT count(*) FROM mailroom.accounts WHERE login = 'taken' OR email = 'clash@example.com'"
                        ).fetchone()[0] == 0

    # the link the seed's collector mailed (built as its db.c does) consumes through consume_token
    secret, _ = seed["secrets"][("prov", "activation")]
    with psycopg.connect(as_login(db_url, "mr_app"), autocommit=True) as app:
        outcome = app.execute("SELECT outcome FROM mailroom.consume_token(%s)", (_link(secret, b"/activate"),)).fetchone()
        assert outcome == ("consumed",)
        secret, code = seed["secrets"][("act", "password_recovery")]
        outcome = app.execute("SELECT outcome FROM mailroom.consume_token(%s, %s)",
                              (_link(secret, b"/recover", code), code)).fetchone()
        assert outcome == ("consumed",)
    assert conn.execute("SELECT status::text FROM mailroom.accounts WHERE login = 'prov'").fetchone()[0] == "active"

    # what the seed had not mailed, mailroom's collector dispatches; never what it had
    with psycopg.connect(as_login(db_url, "mr_collector"), autocommit=True) as collector:
        logins = sorted(r[0] for r in collector.execute("SELECT login FROM mailroom.dequeue_tokens(50)")
                        if r[0] not in ("someone", "takenlogin"))
    assert logins == ["fresh", "stale"]  # fresh: the seed's token; stale: a new one (the seed's expired)

    again = cli("db", "import-seed", seed_url, env=admin)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("imported 0 accounts, skipped 7 "), again.stdout
    assert "  accounts skipped: already imported: 5\n" in again.stdout
    assert conn.execute("SELECT count(*) FROM mailroom.accounts").fetchone()[0] == 7


def test_a_source_without_the_seed_schema_is_one_line(cli, db_url):
    run = cli("db", "import-seed", db_url, env={"MAILROOM_DATABASE_URL": as_login(db_url, "mr_admin")})
    assert run.returncode == 2 and run.stderr.startswith("mailroom: error: the source database has no seed schema")
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_the_import_is_the_admins(cli, db_url, seed_url):
    _seed(seed_url)
    run = cli("db", "import-seed", seed_url, env={"MAILROOM_DATABASE_URL": as_login(db_url, "mr_app")})
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert run.stderr.startswith("mailroom: error: permission denied for function import_seed_accounts"), run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
