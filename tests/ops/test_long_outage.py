"""An outage longer than every pool and backoff cap (issue 34, item 2): the postmaster SIGKILLed and
kept down for over four minutes under every worker and the HTTP face.

psycopg_pool's reconnection delays double to minutes and its attempts gave up after five: after a
228 s outage the HTTP face's first request took 59 s and inbound SMTP answered 451 for 53 s after
PostgreSQL was back. Here, through the whole outage, a RCPT answers 451 and every HTTP route 503 with
Retry-After within seconds, no process exits, and each says so once; once the server is back, the
HTTP face, inbound SMTP and every worker serve again within 5 s, and mail flows end to end.

MAILROOM_TEST_OUTAGE (seconds) sets the outage's length: 45 s in the suite (past every cap mailroom has
now, 2–5 s, and past the 32 s psycopg_pool's own delays had reached, whose next attempt then came 64 s
after the first: the old code fails it; it was 75 s, cut for CI's time), 245 s in `make soak` (the
issue's four minutes; figures in docs/reliability.md).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psycopg
import pytest
from test_failure_paths import (
    KINDS,
    _rcpt,
    _setup,
    _start_all,
    _wait_until,
    _workers_by_state,
    assert_http_unavailable,
    free_port,
    http,
    wait_http_ok,
)

from mailroom.db import cluster as embedded

pytestmark = pytest.mark.slow

OUTAGE = float(os.environ.get("MAILROOM_TEST_OUTAGE", "45"))
RECOVERY_BOUND = 5.0  # seconds from the server accepting connections to each process serving again


def _children(pid: int) -> set[int]:
    """The live processes whose parent is `pid` (/proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_postmaster(cluster: embedded.Cluster) -> None:
    """SIGKILL the postmaster, then wait until its backends have noticed and gone too: a backend serving a
    pooled connection lives a few milliseconds past its postmaster, and a probe sent then is answered
    (the third CI run of issue 43 met a 250 3 ms after the kill)."""
    pid = int((cluster.pgdata / "postmaster.pid").read_text().splitlines()[0])
    backends = _children(pid)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not any(_alive(b) for b in backends):
            try:
                psycopg.connect(cluster.url(), connect_timeout=1).close()
            except psycopg.OperationalError:
                return
        time.sleep(0.05)
    raise AssertionError("the server still answers after its postmaster was killed")


def _start_again(cluster: embedded.Cluster) -> None:
    """Start the server once the killed postmaster's backends have all gone (they hold its shared memory);
    durable (synchronous_commit on, unlike a test cluster's fast settings): a commit the test saw survives."""
    bindir, run_as = embedded.find_bindir(), embedded.RunAs.detect()
    deadline = time.monotonic() + 60
    while True:
        try:
            cluster.start(bindir, run_as)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_sigkilled_postmaster_down_past_every_cap(private_cluster):
    url = private_cluster.url()
    # a crash loses what synchronous_commit = off (the test clusters' setting) had not flushed: durable here
    private_cluster.stop(embedded.find_bindir(), embedded.RunAs.detect())
    private_cluster.start(embedded.find_bindir(), embedded.RunAs.detect())
    inbox_port, http_port = free_port(), free_port()
    _setup(url, inbox_port)
    workers = _start_all(url, inbox_port, http_port)
    try:
        _wait_until("every worker to report in", lambda: set(KINDS.values()) <= set(_workers_by_state(url))
                    and {_workers_by_state(url)[k] for k in KINDS.values()} == {"running"})
        with psycopg.connect(url, autocommit=True) as conn:
            address = conn.execute("SELECT address FROM mailroom.create_mailbox(60, 'free')").fetchone()[0]
        assert _rcpt(inbox_port, address)[0] == 250
        status, _, box, _ = http(http_port, "POST", "/api/v1/mailboxes", b"{}")
        assert status == 201, box
        box_path = f"/api/v1/mailboxes/{box['address']}/messages"
        assert http(http_port, "GET", box_path, token=box["session_token"])[0] == 200

        _kill_postmaster(private_cluster)
        down_at = time.monotonic()
        probes = 0
        while True:
            code, seconds = _rcpt(inbox_port, address)
            assert code == 451 and seconds < 5, (code, seconds, time.monotonic() - down_at)
            assert_http_unavailable(http_port, "GET", box_path, token=box["session_token"])
            assert_http_unavailable(http_port, "POST", "/api/v1/mailboxes", b"{}")
            probes += 1
            for w in workers.values():
                assert w.proc.poll() is None, f"{w.name} exited during the outage:\n{w.text()}"
            left = OUTAGE - (time.monotonic() - down_at)
            if left <= 0:
                break
            time.sleep(min(30.0, left))
        for w in workers.values():
            assert w.count("database unreachable (") == 1, f"{w.name} said it more than once:\n{w.text()}"
            assert "Traceback" not in w.text(), w.text()
        outage = time.monotonic() - down_at

        _start_again(private_cluster)
        up_at = time.monotonic()
        try:
            http_back = wait_http_ok(http_port, box_path, token=box["session_token"], timeout=30)
        except AssertionError:
            raise AssertionError(workers["http"].text()) from None
        recovered: dict[str, float] = {"http (first 200)": http_back}
        deadline = up_at + 30
        while len(recovered) < len(workers) + 2 and time.monotonic() < deadline:
            if "inbox (first 250)" not in recovered and _rcpt(inbox_port, address)[0] == 250:
                recovered["inbox (first 250)"] = time.monotonic() - up_at
            for name, w in workers.items():
                if name not in recovered and w.count("recovered: database unreachable no more"):
                    recovered[name] = time.monotonic() - up_at
            time.sleep(0.1)
        print(f"outage {outage:.0f}s, {probes} probe rounds; serving again after (s): "
              + ", ".join(f"{k} {v:.1f}" for k, v in sorted(recovered.items())))
        assert len(recovered) == len(workers) + 2, (recovered, {n: w.text() for n, w in workers.items()})
        slow = {k: round(v, 1) for k, v in recovered.items() if v > RECOVERY_BOUND}
        assert not slow, f"served again only after more than {RECOVERY_BOUND}s: {slow}"

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT mailroom.create_account(%s, 'after-a-long-outage')", (address,))
            _wait_until("the activation email in the inbox", lambda: conn.execute(
                "SELECT count(*) FROM mailroom.messages AS m JOIN mailroom.mailboxes AS b ON b.id = m.mailbox_id"
                " WHERE b.address = %s AND m.subject ILIKE '%%activ%%'", (address,)).fetchone()[0] >= 1, timeout=30)
        for name, w in workers.items():
            assert w.stop() == 0, f"{name}:\n{w.text()}"
    finally:
        for w in workers.values():
            w.kill()
