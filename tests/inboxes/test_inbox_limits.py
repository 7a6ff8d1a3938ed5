"""Abuse limits of the real `mailroom inbox serve`: per-transaction size while reading DATA,
recipients per transaction, refused recipients per session, sessions at once, idle timeout."""

from __future__ import annotations

import re
import smtplib
import socket
import time

import psycopg
import pytest

from mailroom.inboxes.smtp import _SIZE_PROBE_BYTES

FREE_LIMIT = 2 * 1024 * 1024  # the free plan's max_message_bytes (migrations/0020_inboxes.sql)
MIB = 1024 * 1024


def message_of(size: int, subject: str = "sized") -> bytes:
    """An RFC 5322 message of exactly `size` octets, CRLF lines of at most 1000 octets."""
    head = f"From: ann@example.com\r\nSubject: {subject}\r\n\r\n".encode()
    line = b"x" * 998 + b"\r\n"
    count, rest = divmod(size - len(head), len(line))
    if rest < 2:
        count, rest = count - 1, rest + len(line)
    raw = head + line * count + b"y" * (rest - 2) + b"\r\n"
    assert len(raw) == size
    return raw


def peak_rss_bytes(pid: int) -> int:
    """The process's peak resident set size (VmHWM), from /proc."""
    for line in open(f"/proc/{pid}/status").read().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def stored_count(conn: psycopg.Connection, mailbox_id: int | None = None) -> int:
    if mailbox_id is None:
        return conn.execute("SELECT count(*) FROM mailroom.messages").fetchone()[0]
    return conn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id = %s", (mailbox_id,)).fetchone()[0]


def hung_up(client: smtplib.SMTP) -> bool:
    """Whether the server closed the connection (EOF within a few seconds)."""
    client.sock.settimeout(5)
    try:
        return client.sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def refused_at_rcpt(log: str) -> int:
    return log.count("refused a recipient at RCPT")


@pytest.fixture
def server(start_server):
    """With a line per message and per refused recipient (--log-messages): these tests count them."""
    return start_server("--log-messages")


def test_data_over_the_mailbox_limit_is_refused_while_reading(server, conn, make_mailbox):
    """A free inbox (2 MiB): of a 5 MiB message the server holds at most the limit and one probe
    step (256 KiB), reads the rest without keeping it, says 552 and goes on."""
    box = make_mailbox()
    exact, over, big = message_of(FREE_LIMIT, "exact"), message_of(FREE_LIMIT + 1), message_of(5 * MIB)
    with smtplib.SMTP(server.host, server.port, timeout=30) as client:
        client.ehlo()
        # A message of exactly the limit is stored: the reader counts what deliver_message counts.
        client.mail("ann@example.com")  # no SIZE=: only the reading can stop it
        assert client.rcpt(box.address)[0] == 250
        assert client.data(exact)[0] == 250
        before = peak_rss_bytes(server.proc.pid)
        # 5 MiB, undeclared: refused while reading, the connection stays usable.
        client.mail("ann@example.com")
        assert client.rcpt(box.address)[0] == 250
        code, text = client.data(big)
        assert (code, text) == (552, b"5.3.4 Message too big for this mailbox")
        after = peak_rss_bytes(server.proc.pid)
        # One byte over: read whole (within one probe step), refused by deliver_message's exact check.
        client.mail("ann@example.com")
        assert client.rcpt(box.address)[0] == 250
        assert client.data(over) == (552, b"5.3.4 Message too big for this mailbox")
        assert client.noop()[0] == 250
        assert client.sendmail("ann@example.com", [box.address], message_of(1000, "after")) == {}
    # The server never held the 5 MiB message: its peak memory grew by less than the message's
    # size over the peak of storing a 2 MiB one (aiosmtpd alone buffers up to the 25 MiB SIZE).
    assert after - before < 3 * MIB, f"peak RSS grew by {(after - before) / MIB:.1f} MiB"
    log = server.log()
    ((read, held),) = re.findall(r"over its recipients' size limit \(read (\d+) bytes, held at most (\d+)\)", log)
    assert int(read) == len(big)  # read to the end: the session goes on
    assert FREE_LIMIT - 1000 < int(held) <= FREE_LIMIT + _SIZE_PROBE_BYTES
    assert "refused a message at DATA: too_large" in log  # the one byte over
    subjects = conn.execute("SELECT subject FROM mailroom.messages WHERE mailbox_id = %s ORDER BY id", (box.id,))
    assert [r[0] for r in subjects] == ["exact", "after"]


def test_the_limit_is_the_largest_of_the_accepted_recipients(server, conn, make_mailbox):
    """free (2 MiB) + pro (10 MiB): the reader allows 10 MiB, in whichever order they come."""
    free, pro = make_mailbox(), make_mailbox(plan="pro")
    raw = message_of(3 * MIB)
    with smtplib.SMTP(server.host, server.port, timeout=30) as client:
        client.ehlo()
        for order in ([free, pro], [pro, free]):
            client.mail("ann@example.com")
            for box in order:
                assert client.rcpt(box.address)[0] == 250
            # Read whole (under pro's limit); deliver_message then refuses the free copy: nothing kept.
            assert client.data(raw)[0] == 552
        client.mail("ann@example.com")
        assert client.rcpt(pro.address)[0] == 250
        assert client.data(raw)[0] == 250
        # A refused recipient does not raise the transaction's limit.
        client.mail("ann@example.com")
        assert client.rcpt(free.address)[0] == 250
        assert client.rcpt("nobody@mailroom.test")[0] == 550
        assert client.data(raw)[0] == 552
    log = server.log()
    assert log.count("over its recipients' size limit") == 1  # the free + unknown one, while reading
    assert log.count("refused a message at DATA: too_large (2 recipient(s))") == 2  # by deliver_messages
    assert (stored_count(conn, free.id), stored_count(conn, pro.id)) == (0, 1)


def test_the_101st_recipient_gets_452_by_default(server, conn, make_mailbox):
    boxes = [make_mailbox() for _ in range(101)]
    with smtplib.SMTP(server.host, server.port, timeout=30) as client:
        client.ehlo()
        client.mail("ann@example.com")
        for box in boxes[:100]:
            assert client.rcpt(box.address)[0] == 250
        code, text = client.rcpt(boxes[100].address)
        assert (code, text) == (452, b"4.5.3 Too many recipients")
        code, text = client.data(message_of(1000))
        assert (code, text) == (250, b"2.0.0 OK: stored for 100 recipient(s)")
        # The limit is per transaction: the next one takes recipients again.
        assert client.sendmail("ann@example.com", [boxes[100].address], message_of(1000)) == {}
    assert [stored_count(conn, b.id) for b in boxes] == [1] * 101


def test_after_10_refused_recipients_the_session_is_closed_421(server, conn, make_mailbox):
    box = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        client.mail("ann@example.com")
        for n in range(5):
            assert client.rcpt(f"nobody{n}@mailroom.test")[0] == 550
        assert client.rcpt(box.address)[0] == 250
        client.rset()  # the count is per session, not per transaction
        client.mail("ann@example.com")
        for n in range(5, 10):
            assert client.rcpt(f"nobody{n}@mailroom.test")[0] == 550  # the 10th still gets its 550
        # The next RCPT, even for an open inbox, is not asked of the database.
        code, text = client.rcpt(box.address)
        assert (code, text) == (421, b"4.7.0 Too many invalid recipients, closing connection")
        assert hung_up(client)
    assert refused_at_rcpt(server.log()) == 10
    assert "closing a session after 10 refused recipient(s)" in server.log()
    # A new connection starts afresh.
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        assert client.sendmail("ann@example.com", [box.address], message_of(1000)) == {}
    assert stored_count(conn) == 1


def test_expired_inboxes_do_not_count_as_invalid_recipients(server, conn, make_mailbox):
    """Mail for inboxes that expired is the normal life of this service: 550 each, never a 421."""
    boxes = [make_mailbox() for _ in range(12)]
    conn.execute("UPDATE mailroom.mailboxes SET expires_at = clock_timestamp() - interval '1 second'")
    live = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        client.mail("ann@example.com")
        for box in boxes:
            assert client.rcpt(box.address)[0] == 550
        assert client.rcpt(live.address)[0] == 250
    assert "closing a session" not in server.log()


def test_max_bad_recipients_is_configurable_and_pipelined_commands_after_421_are_not_run(
    start_server, conn, make_mailbox
):
    srv = start_server("--max-bad-recipients", "2", "--log-messages")
    box = make_mailbox()
    with socket.create_connection((srv.host, srv.port), timeout=10) as sock:
        reader = sock.makefile("rb")
        assert reader.readline().startswith(b"220")
        # One pipelined burst: after the 421 the server runs nothing, stores nothing.
        sock.sendall(
            b"EHLO client.example\r\nMAIL FROM:<ann@example.com>\r\n"
            + f"RCPT TO:<{box.address}>\r\n".encode()
            + b"RCPT TO:<a@mailroom.test>\r\nRCPT TO:<b@mailroom.test>\r\nRCPT TO:<c@mailroom.test>\r\n"
            + f"RCPT TO:<{box.address}>\r\n".encode()
            + b"DATA\r\n" + message_of(500) + b".\r\n"
        )
        replies = reader.read()  # up to the server's hang-up
    lines = replies.decode().splitlines()
    codes = [line[:3] for line in lines if not line.startswith("250-")]
    assert codes == ["250", "250", "250", "550", "550", "421"]
    assert lines[-1] == "421 4.7.0 Too many invalid recipients, closing connection"
    assert refused_at_rcpt(srv.log()) == 2
    assert stored_count(conn) == 0


def test_connections_over_max_sessions_get_421_and_are_closed(start_server, make_mailbox):
    srv = start_server("--max-sessions", "2")
    box = make_mailbox()
    first = socket.create_connection((srv.host, srv.port), timeout=10)
    second = socket.create_connection((srv.host, srv.port), timeout=10)
    try:
        assert first.recv(1024).startswith(b"220")
        assert second.recv(1024).startswith(b"220")
        with socket.create_connection((srv.host, srv.port), timeout=10) as third:
            third.settimeout(5)
            assert third.makefile("rb").read() == b"421 4.3.2 Too many connections, try again later\r\n"
        assert re.search(r"refused 1 connection\(s\): 2 sessions open \(--max-sessions\)", srv.log())
        # The open sessions are untouched; closing one frees its slot.
        second.sendall(b"NOOP\r\n")
        assert second.recv(1024).startswith(b"250")
        first.close()
        deadline = time.monotonic() + 5
        while True:
            try:
                with smtplib.SMTP(srv.host, srv.port, timeout=10) as client:
                    assert client.sendmail("ann@example.com", [box.address], message_of(1000)) == {}
                    break
            except smtplib.SMTPConnectError as exc:
                assert exc.smtp_code == 421
            assert time.monotonic() < deadline, "the slot of a closed session was never given back"
            time.sleep(0.1)
    finally:
        first.close()
        second.close()


def _connect_from(source: str, srv) -> socket.socket:
    """A TCP connection to the server from a given loopback address (127.0.0.0/8 is all loopback)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect((srv.host, srv.port))
    return sock


def test_one_client_cannot_take_every_session(start_server, make_mailbox, conn):
    """Issue 34: idle connections of one client used to answer every other sender 421 for the idle
    timeout. Per client address, at most --max-sessions-per-client (default 10) sessions: its next
    connection gets 421 at once, while another client is still served."""
    srv = start_server("--max-sessions", "20")
    box = make_mailbox()
    hog = [_connect_from("127.0.0.1", srv) for _ in range(10)]
    try:
        for sock in hog:
            assert sock.recv(1024).startswith(b"220")
        with _connect_from("127.0.0.1", srv) as eleventh:
            eleventh.settimeout(5)
            assert eleventh.makefile("rb").read() == \
                b"421 4.7.0 Too many connections from your address, try again later\r\n"
        refusal = re.search(r".*refused 1 connection\(s\) of a client at its 10 sessions \(--max-sessions-per-client\)",
                            srv.log())
        assert refusal and "127.0.0" not in refusal.group(0)  # (a client address is personal data: never logged)
        # another client is served meanwhile, a whole transaction
        other = _connect_from("127.0.0.2", srv)
        with smtplib.SMTP() as client:
            client.sock = other
            client.file = None
            code, _ = client.getreply()
            assert code == 220
            assert client.sendmail("ann@example.com", [box.address], message_of(1000)) == {}
        assert stored_count(conn) == 1
        # the hog's closed session gives its slot back
        hog.pop().close()
        deadline = time.monotonic() + 5
        while True:
            with _connect_from("127.0.0.1", srv) as again:
                if again.recv(1024).startswith(b"220"):
                    break
            assert time.monotonic() < deadline, "the slot of a closed session was never given back"
            time.sleep(0.1)
    finally:
        for sock in hog:
            sock.close()


def test_max_sessions_per_client_from_the_environment(start_server):
    srv = start_server(env={"MAILROOM_INBOX_MAX_SESSIONS_PER_CLIENT": "2"})
    held = [_connect_from("127.0.0.1", srv) for _ in range(2)]
    try:
        assert all(s.recv(1024).startswith(b"220") for s in held)
        with _connect_from("127.0.0.1", srv) as third:
            third.settimeout(5)
            assert third.makefile("rb").read().startswith(b"421 4.7.0 Too many connections from your address")
        with _connect_from("127.0.0.3", srv) as other:
            assert other.recv(1024).startswith(b"220")
        assert re.search(r"2 sessions a client", srv.log())
    finally:
        for sock in held:
            sock.close()


def test_serve_refuses_bad_limit_flags(cli):
    for flag in ("--max-bad-recipients", "--max-sessions", "--max-sessions-per-client"):
        result = cli("inbox", "serve", flag, "0")
        assert result.returncode == 2
        line = result.stderr.strip()  # one line (core/options.py's grammar), naming the flag and the bound
        assert "\n" not in line and line.startswith("mailroom: error: mailroom inbox serve: Invalid value for "), line
        assert f"'{flag}'" in line and "greater than or equal to 1" in line, line


@pytest.mark.parametrize("stall_after", ["EHLO", "DATA"])
def test_idle_client_is_disconnected(start_server, conn, make_mailbox, stall_after):
    srv = start_server("--idle-timeout", "1s")
    box = make_mailbox()
    with smtplib.SMTP(srv.host, srv.port, timeout=10) as client:
        client.ehlo()
        if stall_after == "DATA":  # half a message, then silence: nothing may be stored
            client.mail("ann@example.com")
            assert client.rcpt(box.address)[0] == 250
            assert client.docmd("DATA")[0] == 354
            client.send(message_of(5000)[:3000])
        started = time.monotonic()
        assert hung_up(client)
        assert time.monotonic() - started < 4
    # A client that keeps talking within the timeout is served.
    with smtplib.SMTP(srv.host, srv.port, timeout=10) as client:
        for _ in range(3):
            time.sleep(0.5)
            assert client.noop()[0] == 250
        assert client.sendmail("ann@example.com", [box.address], message_of(1000)) == {}
    assert stored_count(conn) == 1
