"""The one worker skeleton (mailroom.db.worker, issue 36 item 5): every worker is built on it, none wires
the steps by hand again, and the steps do what they say against a real database.

The workers' own suites (tests/accounts/test_collect*.py, tests/outbound, tests/inboxes/test_inbox_expiry.py,
tests/inboxes/test_inbox_workers.py, tests/ops/test_failure_paths.py, …) prove their behaviour on it.
"""

from __future__ import annotations

import ast
import os
import signal
import threading
from pathlib import Path

import psycopg
import pytest

import mailroom
from mailroom.accounts.collector import Collector
from mailroom.core.errors import Kind
from mailroom.db.connect import ConnectFailed
from mailroom.db.worker import Worker, classify
from mailroom.http.state import HttpConfig, State
from mailroom.inboxes.expiry import ExpiryWorker
from mailroom.inboxes.server import InboundServer
from mailroom.inboxes.watch import InboxWatcher
from mailroom.ops.maintain import MaintenanceWorker
from mailroom.outbound.sender import Sender

ROOT = Path(mailroom.__file__).parent
WORKER_MODULES = ["accounts/collector.py", "outbound/sender.py", "inboxes/expiry.py", "inboxes/server.py",
                  "ops/maintain.py", "http/state.py"]
# what the skeleton wires: a worker module that names one of these again wires it by hand
HAND_WIRED = {"Outage", "UpgradeBackoff", "Heartbeat", "Listener", "LazyConnection", "alearn_vocabulary",
              "connection_kwargs"}


def test_the_five_workers_are_built_on_the_skeleton():
    for cls in (Collector, Sender, ExpiryWorker, InboundServer, MaintenanceWorker):
        assert issubclass(cls, Worker), cls
    # the HTTP face holds one for its background task (the heartbeat); `inbox watch` is a user's client
    assert isinstance(State(HttpConfig(database_url="postgresql:///nowhere")).worker, Worker)
    assert not issubclass(InboxWatcher, Worker)


@pytest.mark.parametrize("module", WORKER_MODULES)
def test_no_worker_wires_the_steps_by_hand(module: str):
    tree = ast.parse((ROOT / module).read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    if module == "http/state.py":
        names.discard("alearn_vocabulary")  # each pooled connection of the request path learns it (configure)
    assert not names & HAND_WIRED, f"{module} imports {sorted(names & HAND_WIRED)}: use mailroom.db.worker"
    # no raw connection: the shared helpers (mailroom.db.connect through the skeleton) learn the vocabulary
    raw = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == "connect"
           and isinstance(node.value, (ast.Name, ast.Attribute))
           and ast.unparse(node.value) in ("psycopg", "psycopg.AsyncConnection", "psycopg.Connection")]
    assert not raw, f"{module} opens raw connections at lines {raw}"


def test_classify_says_what_a_worker_does():
    assert classify(psycopg.errors.UndefinedFunction("function mailroom.x() does not exist")) is Kind.UPGRADING
    assert classify(psycopg.OperationalError("connection refused")) is Kind.UNAVAILABLE
    assert classify(psycopg.errors.AdminShutdown("terminating connection")) is Kind.UNAVAILABLE
    assert classify(ConnectFailed("cannot connect to the database: refused", Kind.UNAVAILABLE)) is Kind.UNAVAILABLE
    assert classify(ConnectFailed("cannot connect to the database: password", Kind.DENIED)) is Kind.DENIED
    assert classify(psycopg.errors.InsufficientPrivilege("permission denied")) is Kind.DENIED
    assert classify(psycopg.errors.InvalidTextRepresentation("bad input")) is Kind.USAGE


class _Probe(Worker):
    pass


def _state(db_url: str, worker: str) -> str | None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute("SELECT state FROM mailroom.worker_health() WHERE worker = %s", (worker,)).fetchone()
    return row[0] if row else None


def test_a_worker_reports_in_backs_off_and_stops_cleanly(db_url: str):
    import logging

    log = logging.getLogger("test-skeleton")
    w = _Probe("maintenance", log, url=db_url, name="skeleton-probe:1")
    db = w.lazy("mailroom-test-skeleton")
    try:
        w.beat_if_due(db)  # the first heartbeat is due at once
        assert w.heartbeat.sent_count == 1
        assert _state(db_url, "skeleton-probe:1") == "running"
        w.beat_if_due(db)  # not due again within the interval
        assert w.heartbeat.sent_count == 1
        # back off: the schema's wait and the database's wait are separate, each logged once, resumed together
        assert w.backoff(psycopg.errors.UndefinedFunction("gone")) == pytest.approx(w.upgrade.FIRST)
        assert w.backoff(ConnectFailed("cannot connect to the database: refused", Kind.UNAVAILABLE)) \
            == pytest.approx(w.outage.FIRST)
        assert w.upgrade.waiting and w.outage.waiting
        w.resumed()
        assert not w.upgrade.waiting and not w.outage.waiting
        # stop cleanly: SIGTERM sets the stop, finish() says so (listed as stopped, not lost)
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            w.stop_on_signals()
            os.kill(os.getpid(), signal.SIGTERM)
            assert w.stop_event.wait(2)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        db.close()
    w.finish()
    assert _state(db_url, "skeleton-probe:1") == "stopped"


def test_a_worker_waits_for_the_database_then_connects(db_url: str):
    import asyncio
    import logging

    w = _Probe("maintenance", logging.getLogger("test-skeleton"), url=db_url)
    attempts = []

    async def flaky() -> int:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectFailed("cannot connect to the database: refused", Kind.UNAVAILABLE)
        async with await w.aconnect("mailroom-test-skeleton") as conn:
            return (await (await conn.execute("SELECT 7")).fetchone())[0]

    async def no_sleep(_seconds: float) -> None:
        pass

    assert asyncio.run(w.await_database(flaky, stopping=threading.Event().is_set, sleep=no_sleep)) == 7
    assert len(attempts) == 3 and not w.outage.waiting
    # a refusal no wait fixes is raised at once
    async def denied() -> int:
        raise ConnectFailed("cannot connect to the database: password", Kind.DENIED)

    with pytest.raises(ConnectFailed):
        asyncio.run(w.await_database(denied, stopping=threading.Event().is_set, sleep=no_sleep))
