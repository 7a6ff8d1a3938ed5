"""Fault injection against the real `mailroom inbox serve` (docs/inboxes.md, "Fault injection"): an
inbox set with `mailroom inbox fault set` answers its reply at RCPT, at the end of DATA (nothing
stored) or after DATA (stored), for every message, the next N or a share; decided in the server's
own SQL calls (check_bounce_recipient, deliver_messages), the server sending the reply it is given."""

from __future__ import annotations

import json
import smtplib
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from inbox_support import wait_for_log

MESSAGE = b"Subject: retry me\r\n\r\nhello\r\n"


def _stored(conn, box) -> int:
    return conn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id = %s", (box.id,)).fetchone()[0]


def _fault(cli, box, *args: str) -> dict:
    done = cli("inbox", "fault", "set", box.address, "--token", box.token, "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _sql_fault(conn, box, stage: str, reply: str, share: int = 100, count: int | None = None) -> None:
    """The same call as `inbox fault set`, without a process per call (the CLI is tested above)."""
    conn.execute("SELECT mailroom.set_inbox_fault(%s, %s, %s, %s, %s, %s)",
                 (box.address, box.token, stage, reply, share, count))


def _send(server, box) -> tuple[tuple[int, bytes], tuple[int, bytes] | None]:
    """One transaction to `box`: the RCPT reply, and the DATA reply when RCPT was accepted."""
    with smtplib.SMTP(server.host, server.port, timeout=30) as client:
        client.ehlo()
        client.mail("app@example.com")
        rcpt = client.rcpt(box.address)
        if rcpt[0] != 250:
            client.rset()
            return rcpt, None
        return rcpt, client.data(MESSAGE)


def test_rcpt_answers_the_set_4xx_then_clear(server, conn, cli, make_mailbox):
    box = make_mailbox()
    fault = _fault(cli, box, "--at", "rcpt", "--reply", "451 4.7.1 Greylisted, try again later")
    assert (fault["stage"], fault["reply"], fault["share"], fault["remaining"]) == (
        "rcpt", "451 4.7.1 Greylisted, try again later", 100, None)
    for _ in range(2):
        assert _send(server, box) == ((451, b"4.7.1 Greylisted, try again later"), None)
    assert _stored(conn, box) == 0
    shown = cli("inbox", "fault", "show", box.address, "--token", box.token)
    assert shown.returncode == 0 and "fired: 2" in shown.stdout and "stage: rcpt" in shown.stdout, shown
    assert cli("inbox", "fault", "clear", box.address, "--token", box.token).stdout.strip() == "cleared"
    rcpt, data = _send(server, box)
    assert rcpt[0] == 250 and data is not None and data[0] == 250
    assert _stored(conn, box) == 1
    assert cli("inbox", "fault", "show", box.address, "--token", box.token).stdout.strip() == "no fault"


def test_data_answers_the_set_5xx_and_stores_nothing(server, conn, make_mailbox):
    box = make_mailbox()
    _sql_fault(conn, box, "data", "554 5.7.1 Message rejected by policy")
    rcpt, data = _send(server, box)
    assert rcpt[0] == 250
    assert data == (554, b"5.7.1 Message rejected by policy")
    assert _stored(conn, box) == 0


def test_after_data_stores_then_answers_the_error(server, conn, cli, make_mailbox):
    box = make_mailbox()
    _fault(cli, box, "--at", "after-data", "--reply", "451 4.3.0 Acknowledgement lost", "--count", "1")
    rcpt, data = _send(server, box)
    assert rcpt[0] == 250 and data == (451, b"4.3.0 Acknowledgement lost")
    assert _stored(conn, box) == 1  # stored: the client's retry is the duplicate an application must handle
    assert _send(server, box)[1][0] == 250
    assert _stored(conn, box) == 2
    wait_for_log(server.log_path, r"stored 1 message\(s\), then answered an injected fault", server.proc)
    assert box.address not in server.log_path.read_text()


def test_the_next_two_then_normal(server, conn, make_mailbox):
    box = make_mailbox()
    _sql_fault(conn, box, "rcpt", "452 4.2.2 Mailbox over quota, try later", count=2)
    replies = [_send(server, box) for _ in range(3)]
    assert [r[0] for r in replies] == [(452, b"4.2.2 Mailbox over quota, try later")] * 2 + [replies[2][0]]
    assert replies[2][0][0] == 250 and replies[2][1][0] == 250
    assert _stored(conn, box) == 1
    shown = conn.execute("SELECT mailroom.inbox_fault(%s, %s)", (box.address, box.token)).fetchone()[0]
    assert (shown["remaining"], shown["fired"], shown["active"]) == (0, 2, False)


def test_share_0_never_and_100_always(server, conn, make_mailbox):
    box = make_mailbox()
    _sql_fault(conn, box, "data", "550 5.7.1 Chaos", share=0)
    for _ in range(5):
        assert _send(server, box)[1][0] == 250
    _sql_fault(conn, box, "data", "550 5.7.1 Chaos", share=100)
    for _ in range(5):
        assert _send(server, box)[1] == (550, b"5.7.1 Chaos")
    assert _stored(conn, box) == 5


def test_one_recipients_rcpt_fault_leaves_the_others(server, conn, make_mailbox):
    faulty, fine = make_mailbox(), make_mailbox()
    _sql_fault(conn, faulty, "rcpt", "550 5.1.1 Chaos says no")
    with smtplib.SMTP(server.host, server.port, timeout=30) as client:
        client.ehlo()
        client.mail("app@example.com")
        assert client.rcpt(faulty.address) == (550, b"5.1.1 Chaos says no")
        assert client.rcpt(fine.address)[0] == 250
        assert client.data(MESSAGE)[0] == 250
    assert (_stored(conn, faulty), _stored(conn, fine)) == (0, 1)


def test_bad_input_is_one_line_and_exit_2(cli, make_mailbox):
    box = make_mailbox()
    for args, words in (
        (("--at", "helo", "--reply", "451 4.7.1 x"), "stage"),
        (("--at", "rcpt", "--reply", "451 5.7.1 x"), "class"),
        (("--at", "rcpt", "--reply", "250 2.0.0 fine"), "421, 450"),
    ):
        done = cli("inbox", "fault", "set", box.address, "--token", box.token, *args)
        assert done.returncode == 2, done
        assert done.stderr.count("\n") == 1 and words in done.stderr and "Traceback" not in done.stderr
    done = cli("inbox", "fault", "set", box.address, "--token", "not-the-token", "--at", "rcpt", "--reply",
               "451 4.7.1 x")
    assert done.returncode != 0 and "not authorized" in done.stderr


def test_the_count_is_taken_atomically_by_concurrent_sessions(server, conn, make_mailbox):
    """8 sessions at once against a fault for the next 3: exactly 3 are answered it, 5 get 250 (8: under
    the server's per-client session cap, 10, since every session here comes from 127.0.0.1)."""
    box = make_mailbox()
    _sql_fault(conn, box, "rcpt", "451 4.7.1 Counted", count=3)
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: _send(server, box)[0][0], range(8)))
    assert sorted(replies) == [250] * 5 + [451] * 3
    assert _stored(conn, box) == 5


# A fault harms only its owner (issue 45 item 2; docs/inboxes.md "Fault injection"): the review's mixed
# transaction, one SMTP transaction to owner B's inbox and owner A's, owner A's inbox set a DATA-stage fault.

def _owned(make_mailbox, kind: str, owner: str):
    """An inbox of `owner` (an API owner), or for kind anonymous one with a token (its own owner)."""
    return make_mailbox() if kind == "anonymous" else make_mailbox(owner_type="api", owner_id=owner)


def _owner_fault(conn, box, stage: str, reply: str) -> None:
    """What `PUT …/fault` does for the inbox's holder: its token, or its API owner."""
    owner = (None, None) if box.token else ("api", conn.execute(
        "SELECT owner_id FROM mailroom.mailboxes WHERE id = %s", (box.id,)).fetchone()[0])
    conn.execute("SELECT mailroom.set_inbox_fault(%s, %s, %s, %s, 100, NULL, %s, %s)",
                 (box.address, box.token, stage, reply, *owner))


def _send_to(server, *boxes) -> tuple[int, bytes]:
    """One transaction to every box (each RCPT accepted): the DATA reply."""
    with smtplib.SMTP(server.host, server.port, timeout=30) as client:
        client.ehlo()
        client.mail("app@example.com")
        for box in boxes:
            assert client.rcpt(box.address)[0] == 250
        return client.data(MESSAGE)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return resp.read().decode()


@pytest.mark.parametrize("kind", ["api", "anonymous"])
def test_a_fault_never_refuses_nor_doubles_another_owners_copy(start_server, conn, make_mailbox, kind):
    server = start_server("--metrics-port", "0", "--log-every", "1s")
    metrics_port = int(wait_for_log(server.log_path, r"metrics on http://127\.0\.0\.1:(\d+)/metrics", server.proc)[1])
    owner_a, owner_b = _owned(make_mailbox, kind, "owner-a"), _owned(make_mailbox, kind, "owner-b")
    # data 550: before, DATA answered 550 and the sender bounced owner B's copy (0 copies)
    _owner_fault(conn, owner_a, "data", "550 5.7.1 Owner A refuses")
    assert _send_to(server, owner_b, owner_a) == (250, b"2.0.0 OK: stored for 2 recipient(s)")
    assert (_stored(conn, owner_a), _stored(conn, owner_b)) == (1, 1)
    # after_data 451: before, stored then 451, and the sender's retry gave owner B a second copy
    _owner_fault(conn, owner_a, "after_data", "451 4.3.0 Owner A lost the acknowledgement")
    reply = _send_to(server, owner_a, owner_b)
    assert reply == (250, b"2.0.0 OK: stored for 2 recipient(s)")  # nothing for the sender to retry
    assert (_stored(conn, owner_a), _stored(conn, owner_b)) == (2, 2)  # owner B: exactly one copy of each
    # skipped and counted: its log line, the summary line and the metric; never an address
    wait_for_log(server.log_path, r"skipped 1 injected fault\(s\): the message has a recipient of another owner",
                 server.proc)
    wait_for_log(server.log_path, r"skipped [12] injected fault\(s\) of another owner", server.proc)
    assert "mailroom_inbound_faults_skipped_total 2.0" in _scrape(metrics_port)
    log_text = server.log_path.read_text()
    assert owner_a.address not in log_text and owner_b.address not in log_text
    shown = conn.execute("SELECT f.fired FROM mailroom.inbox_faults AS f WHERE f.mailbox_id = %s",
                         (owner_a.id,)).fetchone()
    assert shown == (0,)  # a skipped fault did not fire


def test_a_fault_still_answers_when_every_recipient_is_its_owners(server, conn, make_mailbox):
    first, second = make_mailbox(owner_type="api", owner_id="owner-a"), make_mailbox(owner_type="api", owner_id="owner-a")
    _owner_fault(conn, first, "data", "550 5.7.1 Owner A refuses")
    assert _send_to(server, second, first) == (550, b"5.7.1 Owner A refuses")
    assert (_stored(conn, first), _stored(conn, second)) == (0, 0)
    _owner_fault(conn, first, "after_data", "451 4.3.0 Owner A lost the acknowledgement")
    assert _send_to(server, first, second) == (451, b"4.3.0 Owner A lost the acknowledgement")
    assert (_stored(conn, first), _stored(conn, second)) == (1, 1)
