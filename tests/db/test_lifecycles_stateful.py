"""The SQL lifecycles driven by random sequences (Hypothesis stateful tests, issue 34, item 4).

Each machine keeps a model of what the documented rules say and checks it against the database after
every step, on one real database with the clock pinned:

- accounts: create → dispatch (dequeue_tokens) → consume, suspend, unsuspend: the status, a token
  dispatched at most once and only while its account may receive it, a link consumed at most once;
- inboxes: create → deliver → expire → purge, with the clock moving: never a message stored past
  `expires_at`, the plan's message count, expiry and purge each once;
- the outbound queue: enqueue → claim → finalize (sent, 4xx, 5xx) or reap: never claimed twice at once,
  a stale claim token fenced, attempts counted, retries at attempts² minutes, give-up by the settings.
"""

from __future__ import annotations

import datetime as dt
import uuid

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from psycopg.rows import dict_row

pytestmark = pytest.mark.slow

SETTINGS = settings(max_examples=15, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
T0 = dt.datetime(2031, 3, 1, 12, 0, tzinfo=dt.UTC)


def _sqlstate(fn) -> str | None:  # noqa: ANN001
    try:
        fn()
    except psycopg.Error as exc:
        return exc.sqlstate
    return None


class _Db(RuleBasedStateMachine):
    url: str = ""
    CLEAN = ""  # each example starts from an empty lifecycle: what a replay draws depends on nothing else

    def __init__(self) -> None:
        super().__init__()
        self.conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
        if self.CLEAN:
            self.conn.execute(self.CLEAN)
        self.now = T0
        self.pin()

    def pin(self) -> None:
        self.conn.execute("SELECT set_config('mailroom.clock', %s, false)", (self.now.isoformat(),))

    def teardown(self) -> None:
        self.conn.close()


class Accounts(_Db):
    CLEAN = "TRUNCATE mailroom.accounts, mailroom.tokens CASCADE"

    def __init__(self) -> None:
        super().__init__()
        self.accounts: dict[int, dict] = {}  # id -> {status, activated, login, signed, used}

    @rule()
    def create(self) -> None:
        login = f"u{uuid.uuid4().hex[:10]}"
        account = self.conn.execute("SELECT mailroom.create_account(%s, %s) AS id",
                                    (f"{login}@example.test", login)).fetchone()["id"]
        self.accounts[account] = {"status": "provisioned", "activated": False, "login": login, "signed": None,
                                  "used": False}

    @rule()
    def dispatch(self) -> None:
        rows = self.conn.execute("SELECT * FROM mailroom.dequeue_tokens(1000) WHERE action = 'activation'").fetchall()
        by_login = {a["login"]: (i, a) for i, a in self.accounts.items()}
        for row in rows:
            if row["login"] not in by_login:
                continue  # another example's account
            _, a = by_login[row["login"]]
            assert a["signed"] is None, f"account {row['login']}'s activation token dispatched twice"
            assert a["status"] == "provisioned", f"dispatched to a {a['status']} account"
            a["signed"] = row["signed"]
        for a in self.accounts.values():
            if a["status"] == "provisioned" and not a["activated"]:
                assert a["signed"] is not None, "a due activation token was not dispatched"

    @rule(pick=st.integers(0, 10**6))
    def consume(self, pick: int) -> None:
        signed = [i for i, a in self.accounts.items() if a["signed"]]
        if not signed:
            return
        account = signed[pick % len(signed)]
        a = self.accounts[account]
        state = _sqlstate(lambda: self.conn.execute("SELECT * FROM mailroom.consume_token(%s)", (a["signed"],)))
        if a["used"]:
            assert state == "MR114", state  # already used
        elif a["status"] == "provisioned":
            assert state is None, state
            a.update(used=True, activated=True, status="active")
        else:
            assert state is not None and state.startswith("MR1"), (a["status"], state)

    @rule(pick=st.integers(0, 10**6))
    def suspend(self, pick: int) -> None:
        if not self.accounts:
            return
        account = sorted(self.accounts)[pick % len(self.accounts)]
        a = self.accounts[account]
        state = _sqlstate(lambda: self.conn.execute("SELECT mailroom.suspend_account(%s)", (account,)))
        if a["status"] == "suspended":
            assert state == "MR106", state
        else:
            assert state is None, state
            a["status"] = "suspended"

    @rule(pick=st.integers(0, 10**6))
    def unsuspend(self, pick: int) -> None:
        if not self.accounts:
            return
        account = sorted(self.accounts)[pick % len(self.accounts)]
        a = self.accounts[account]
        state = _sqlstate(lambda: self.conn.execute("SELECT mailroom.unsuspend_account(%s)", (account,)))
        if a["status"] != "suspended":
            assert state == "MR107", state
        else:
            assert state is None, state
            a["status"] = "active" if a["activated"] else "provisioned"

    @invariant()
    def statuses_agree(self) -> None:
        for account, a in self.accounts.items():
            status = self.conn.execute("SELECT mailroom.account_status(%s)::text AS s", (account,)).fetchone()["s"]
            assert status == a["status"], (account, status, a)


class Inboxes(_Db):
    CLEAN = "TRUNCATE mailroom.mailboxes, mailroom.messages CASCADE"

    def __init__(self) -> None:
        super().__init__()
        self.boxes: dict[str, dict] = {}  # address -> {expires_at, stored, expired, purged, max}
        plan = self.conn.execute("SELECT * FROM mailroom.list_plans() WHERE name = 'free'").fetchone()
        self.max_messages = plan.get("max_messages")
        # a full free inbox lets its oldest message go (plans.when_full, migration 0500) or refuses
        self.drop_oldest = self.conn.execute(
            "SELECT when_full = 'drop_oldest' AS d FROM mailroom.plans WHERE name = 'free'").fetchone()["d"]

    @rule(ttl=st.integers(min_value=1, max_value=120))
    def create(self, ttl: int) -> None:
        row = self.conn.execute("SELECT * FROM mailroom.create_mailbox(%s, 'free')", (ttl,)).fetchone()
        self.boxes[row["address"]] = {"expires_at": row["expires_at"], "stored": 0, "gone": False}

    @rule(pick=st.integers(0, 10**6))
    def deliver(self, pick: int) -> None:
        if not self.boxes:
            return
        address = sorted(self.boxes)[pick % len(self.boxes)]
        b = self.boxes[address]
        state = _sqlstate(lambda: self.conn.execute(
            "SELECT mailroom.deliver_message(%s, 'Subject: x\r\n\r\nx'::bytea, 'a@example.org', 'x', 'a@example.org', 'x')",
            (address,)))
        if b["gone"]:
            assert state in ("MR203", "MR205", "MR206"), state
        elif self.now >= b["expires_at"]:
            assert state == "MR205", f"accepted past expires_at: {state}"
        elif self.max_messages is not None and b["stored"] >= self.max_messages and not self.drop_oldest:
            assert state == "MR208", state
        else:
            assert state is None, state
            b["stored"] = min(b["stored"] + 1, self.max_messages or b["stored"] + 1)

    @rule(minutes=st.integers(min_value=1, max_value=90))
    def time_passes(self, minutes: int) -> None:
        self.now += dt.timedelta(minutes=minutes)
        self.pin()

    @rule()
    def expire(self) -> None:
        self.conn.execute("SELECT mailroom.expire_mailboxes(1000)")

    @rule()
    def purge(self) -> None:
        self.conn.execute("SELECT mailroom.purge_mailboxes('0 seconds', 1000)")
        for address, b in self.boxes.items():
            if self.now >= b["expires_at"] and not b["gone"]:
                gone = self.conn.execute("SELECT count(*) AS n FROM mailroom.mailboxes WHERE address = %s",
                                         (address,)).fetchone()["n"] == 0
                b["gone"] = b["gone"] or gone

    @invariant()
    def stored_counts_agree(self) -> None:
        for address, b in self.boxes.items():
            n = self.conn.execute("SELECT count(*) AS n FROM mailroom.messages AS m JOIN mailroom.mailboxes AS x"
                                  " ON x.id = m.mailbox_id WHERE x.address = %s", (address,)).fetchone()["n"]
            assert n == (0 if b["gone"] else b["stored"]), (address, n, b)
            late = self.conn.execute(
                "SELECT count(*) AS n FROM mailroom.messages AS m JOIN mailroom.mailboxes AS x ON x.id = m.mailbox_id"
                " WHERE x.address = %s AND m.received_at >= x.expires_at", (address,)).fetchone()["n"]
            assert late == 0, f"{address}: a message stored at or after expires_at"


class Queue(_Db):
    CLEAN = "TRUNCATE mailroom.outbound_messages CASCADE"

    def __init__(self) -> None:
        super().__init__()
        self.messages: dict[int, dict] = {}  # id -> {status, attempts, claim}
        self.max_attempts = int(self.conn.execute("SELECT mailroom.setting('outbound.max_attempts') AS v").fetchone()["v"])
        self.conn.execute("SELECT mailroom.upsert_sender('mailroom', 'noreply@mailroom.test', '127.0.0.1', 2525)")

    def _due(self, m: dict) -> bool:
        return m["status"] == "queued" and (m["retry_at"] is None or m["retry_at"] <= self.now)

    @rule(priority=st.integers(min_value=-10, max_value=10))
    def enqueue(self, priority: int) -> None:
        # a recipient and a domain of its own: a 5.1.1 answer suppresses its address (docs/bounces.md), a
        # domain's throttling reply backs off the whole domain (docs/limits.md)
        mid = self.conn.execute(
            "SELECT mailroom.enqueue_message('mailroom', ARRAY[%s], 'hi', 'body', p_priority => %s) AS id",
            (f"to@d{uuid.uuid4().hex[:12]}.example.org", priority)).fetchone()["id"]
        self.messages[mid] = {"status": "queued", "attempts": 0, "claim": None, "retry_at": None}

    @rule(limit=st.integers(min_value=1, max_value=5))
    def claim(self, limit: int) -> None:
        rows = self.conn.execute("SELECT id, claim_token, attempts FROM mailroom.claim_messages(%s, 'w1')",
                                 (limit,)).fetchall()
        due_before = [i for i, m in self.messages.items() if self._due(m)]
        mine = [r for r in rows if r["id"] in self.messages]
        for r in mine:
            m = self.messages[r["id"]]
            assert self._due(m), f"claimed message {r['id']} in state {m}"
            m.update(status="processing", claim=r["claim_token"])
        if len(rows) < limit:
            left = [i for i in due_before if self.messages[i]["status"] != "processing"]
            assert not left, ("a due message was left", self.now, limit, rows, self.conn.execute(
                "SELECT id, status, next_retry_at, send_after, attempts, priority FROM mailroom.outbound_messages"
                " WHERE id = ANY(%s)", (left,)).fetchall())

    @rule(pick=st.integers(0, 10**6), outcome=st.sampled_from([("sent", None, None), ("reply", 452, "4.2.2"),
                                                   ("reply", 550, "5.1.1"), ("connect", None, None)]))
    def finalize(self, pick: int, outcome: tuple) -> None:
        claimed = [i for i, m in self.messages.items() if m["status"] == "processing"]
        if not claimed:
            return
        mid = claimed[pick % len(claimed)]
        m = self.messages[mid]
        row = self.conn.execute(
            "SELECT * FROM mailroom.finalize_messages(ARRAY[%s::bigint], ARRAY[%s::bigint], ARRAY[%s],"
            " ARRAY[%s::integer], ARRAY[%s])", (mid, m["claim"], outcome[0], outcome[1], outcome[2])).fetchone()
        m["attempts"] += 1
        assert row["attempts"] == m["attempts"], (row, m)
        if outcome[0] == "sent":
            assert row["status"] == "sent", row
        elif outcome[1] == 550:
            assert row["status"] == "failed", row
        elif row["status"] == "failed":
            assert m["attempts"] >= self.max_attempts, f"gave up after {m['attempts']} of {self.max_attempts}"
        else:
            assert row["status"] == "queued", row
            assert m["attempts"] < self.max_attempts + 1, (m, self.max_attempts)
            assert row["next_retry_at"] - self.now == dt.timedelta(minutes=m["attempts"] ** 2), row
            m["retry_at"] = row["next_retry_at"]
        m["status"] = row["status"]
        # the same claim again is fenced: nothing changes
        again = self.conn.execute(
            "SELECT * FROM mailroom.finalize_messages(ARRAY[%s::bigint], ARRAY[%s::bigint], ARRAY['sent'])",
            (mid, m["claim"])).fetchone()
        assert again is None or again["result"] != "ok" or again["status"] == m["status"], again
        m["claim"] = None

    @rule(minutes=st.integers(min_value=1, max_value=200))
    def time_passes(self, minutes: int) -> None:
        self.now += dt.timedelta(minutes=minutes)
        self.pin()

    @invariant()
    def statuses_agree(self) -> None:
        for mid, m in self.messages.items():
            row = self.conn.execute("SELECT status::text AS s, attempts FROM mailroom.outbound_messages WHERE id = %s",
                                    (mid,)).fetchone()
            assert (row["s"], row["attempts"]) == (m["status"], m["attempts"]), (mid, row, m)


@pytest.mark.parametrize("machine", [Accounts, Inboxes, Queue], ids=lambda m: m.__name__)
def test_lifecycle(machine, db_url):
    machine.url = db_url
    run_state_machine_as_test(machine, settings=SETTINGS)
