"""The worker kinds against a Citus coordinator, through the same CLI as on one node, each as its
least-privilege login: four senders with one SIGKILLed (nothing lost, nothing doubled), the queue
verbs, expiry and purge, partition maintenance (docs/scale.md)."""

from __future__ import annotations

import collections
import signal
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "outbound"))
from outbound_support import SEND_FLAGS, Handler, SmtpServer, add_sender, wait_for  # noqa: E402

pytestmark = pytest.mark.citus

MESSAGES = 5000  # shared by the four senders


@pytest.fixture
def sink():
    server = SmtpServer(Handler()).start()
    yield server
    server.stop()


def _counts(cconn, sender: str) -> dict[str, int]:
    return dict(cconn.execute(
        "SELECT m.status::text, count(*) FROM mailroom.outbound_messages AS m"
        " JOIN mailroom.senders AS s ON s.id = m.sender_id WHERE s.name = %s GROUP BY 1",
        (sender,),
    ).fetchall())


def test_four_senders_one_killed_deliver_each_message_once(cconn, ccli, ccli_popen, sink):
    add_sender(cconn, sink.port, name="four")
    cconn.execute(
        "SELECT count(mailroom.enqueue_message('four', ARRAY['k' || g || '@example.com'], 'bulk ' || g, 'body ' || g))"
        " FROM generate_series(1, %s) AS g",
        (MESSAGES,),
    )
    procs = [
        ccli_popen("send", "--until-idle", *SEND_FLAGS, "--concurrency", "2", "--batch-size", "100", "--worker", f"w{i}")
        for i in range(4)
    ]
    wait_for(lambda: len(sink.handler.received) >= MESSAGES // 10, timeout=120, what="first deliveries")
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait(timeout=10)
    for proc in procs[1:]:
        assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()

    # the killed sender's claims stay processing until the reaper returns them (possibly sent)
    stuck = _counts(cconn, "four").get("processing", 0)
    reaped = ccli("outbound", "reap", "--older-than", "0s")
    assert reaped.returncode == 0, reaped.stderr
    assert int(reaped.stdout.split()[1]) >= stuck
    drained = ccli("send", "--until-idle", *SEND_FLAGS, "--worker", "after", timeout=300)
    assert drained.returncode == 0, drained.stderr
    assert _counts(cconn, "four") == {"sent": MESSAGES}

    delivered = collections.Counter(sink.handler.message_ids())
    rows = cconn.execute(
        "SELECT m.message_id, m.possibly_sent FROM mailroom.outbound_messages AS m"
        " JOIN mailroom.senders AS s ON s.id = m.sender_id WHERE s.name = 'four'"
    ).fetchall()
    assert all(delivered[mid] >= 1 for mid, _ in rows), "every message reached the relay"
    flagged = {mid for mid, flag in rows if flag}
    duplicates = {mid for mid, n in delivered.items() if n > 1}
    assert duplicates <= flagged, "a message delivered twice is one the reaper flagged possibly_sent"
    assert len(flagged) == stuck


def test_queue_verbs_on_the_coordinator(cconn, ccli):
    add_sender(cconn, 2525, name="verbs")
    ids = [r[0] for r in cconn.execute(
        "SELECT mailroom.enqueue_message('verbs', ARRAY['v' || g || '@verbs.example'], 's', 'b') FROM generate_series(1, 3) g"
    )]
    held = ccli("outbound", "hold", "--domain", "verbs.example")
    assert held.returncode == 0, held.stderr
    assert _counts(cconn, "verbs") == {"held": 3}
    released = ccli("outbound", "release", str(ids[0]))
    assert released.returncode == 0, released.stderr
    cancelled = ccli("outbound", "cancel", "--domain", "verbs.example", "--yes")
    assert cancelled.returncode == 0, cancelled.stderr
    assert _counts(cconn, "verbs") == {"cancelled": 3}
    retried = ccli("outbound", "retry", "--domain", "verbs.example", "--yes")
    assert retried.returncode == 0, retried.stderr
    assert _counts(cconn, "verbs") == {"queued": 3}
    run_now = ccli("outbound", "run-now", str(ids[1]))
    assert run_now.returncode == 0, run_now.stderr
    deleted = ccli("outbound", "delete", "--domain", "verbs.example", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert _counts(cconn, "verbs") == {}


def test_expire_and_purge_on_the_coordinator(cconn, ccli):
    boxes = [r[0] for r in cconn.execute("SELECT (mailroom.create_mailbox(1)).address FROM generate_series(1, 5)")]
    for address in boxes:
        cconn.execute("SELECT mailroom.deliver_message(%s, convert_to('Subject: x\r\n\r\nbody', 'UTF8'))", (address,))
    # two hours later the inboxes are due; a day later their storage is reclaimed
    result = ccli("expire", "--once", env=_clock(hours=2))
    assert result.returncode == 0, result.stderr
    open_boxes = cconn.execute(
        "SELECT count(*) FROM mailroom.mailboxes WHERE address = ANY(%s) AND is_active", (boxes,)
    ).fetchone()[0]
    assert open_boxes == 0
    purged = ccli("expire", "--once", "--purge-after", "1h", env=_clock(hours=26))
    assert purged.returncode == 0, purged.stderr
    left = cconn.execute("SELECT count(*) FROM mailroom.mailboxes WHERE address = ANY(%s)", (boxes,)).fetchone()[0]
    stored = cconn.execute(
        "SELECT count(*) FROM mailroom.messages WHERE envelope_to = ANY(%s)", (boxes,)
    ).fetchone()[0]
    assert (left, stored) == (0, 0)


def _clock(hours: int) -> dict[str, str]:
    """The environment of a command whose login (a timekeeper in tests) reads a pinned clock."""
    at = (datetime.now(UTC) + timedelta(hours=hours)).isoformat()
    return {"PGOPTIONS": f"-c mailroom.clock={at}"}


def test_maintain_on_the_coordinator(cconn, ccli):
    result = ccli("maintain")
    assert result.returncode == 0, result.stderr
    # every distributed time-partitioned table has a partition for tomorrow, on the workers too
    tomorrow = cconn.execute(
        "SELECT count(*) FROM pg_catalog.pg_inherits AS i JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'mailroom.messages'::regclass"
    ).fetchone()[0]
    assert tomorrow >= 2
