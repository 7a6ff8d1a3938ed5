"""inbox serve's per-session and per-message costs kept off the hot path (issue 37, item 3):
- aiosmtpd's per-connection introspection answered from a per-class list, with the same tables;
- one summary line every --log-every instead of a line per message, and none while idle;
- uvloop as the event loop when installed (--event-loop / MAILROOM_INBOX_EVENT_LOOP to refuse it).
"""

from __future__ import annotations

import asyncio
import re
import smtplib
import time

import pytest
from aiosmtpd.smtp import SMTP

from mailroom.inboxes.metrics import InboundTally
from mailroom.inboxes.smtp import InboxHandler, _smtp_class


class _Delivery:
    """What InboxHandler reads of its delivery when it is built (no database needed here)."""

    def __init__(self) -> None:
        self.tally = InboundTally()


def _stock_tables(smtp: SMTP, handler: object) -> tuple[set[str], set[str], set[str]]:
    """The command, hook and AUTH names aiosmtpd 1.4.6's __init__ finds with the full dir()."""
    def names(obj: object, prefix: str) -> set[str]:
        return {n for n in object.__dir__(obj) if n.startswith(prefix)}

    commands = {n.replace("smtp_", "") for n in names(smtp, "smtp_")}
    hooks = {n.replace("handle_", "") for n in names(handler, "handle_")}
    auth = {getattr(getattr(o, n), "__auth_mechanism_name__", n.replace("auth_", "").replace("__", "-"))
            for o in (smtp, handler) for n in names(o, "auth_") if callable(getattr(o, n))}
    return commands, hooks, auth


def test_aiosmtpd_builds_the_same_tables_from_the_per_class_list() -> None:
    loop = asyncio.new_event_loop()
    try:
        handler = InboxHandler(_Delivery())  # type: ignore[arg-type]
        smtp = _smtp_class(998)(handler, hostname="mx.test", loop=loop, decode_data=False)
        commands, hooks, auth = _stock_tables(smtp, handler)
        assert set(smtp._smtp_methods) == commands and {"DATA", "RCPT", "STARTTLS", "EHLO"} <= commands
        assert set(smtp._handle_hooks) == hooks == {"RCPT", "DATA"}
        assert set(smtp._auth_methods) == auth and auth
        # bound to this session and this handler, the overrides included
        assert smtp._smtp_methods["DATA"].__self__ is smtp
        assert smtp._smtp_methods["DATA"].__func__ is type(smtp).smtp_DATA
        assert smtp._handle_hooks["RCPT"].__self__ is handler
    finally:
        loop.close()


def test_the_tally_says_what_happened_once_and_nothing_while_idle() -> None:
    tally = InboundTally()
    start = tally.since
    assert tally.line(start + 60) is None  # idle: no line
    tally.sessions += 2
    tally.stored += 3
    tally.statements += 2
    tally.refused_recipient("unknown")
    tally.refused_recipient("unknown")
    tally.refused_recipient("expired")
    tally.answered("552 5.3.4 Message too big for this mailbox")
    tally.answered("451 4.3.0 Temporary failure, please try again later")
    tally.answered("250 OK", bounce=True)
    line = tally.line(start + 120)
    assert line == ("in 60s: stored 3 message(s) in 2 session(s) (2 statement(s)), refused 3 recipient(s)"
                    " (unknown 2, expired 1) and 1 message(s) (552 5.3.4 1), answered 4xx 1 time(s),"
                    " recorded 1 bounce(s)")
    assert tally.line(start + 180) is None  # counted once


def _send(server, mailbox, subject: str) -> None:
    with smtplib.SMTP(server.host, server.port, timeout=30) as client:
        client.ehlo("client.test")
        code, _ = client.mail("sender@example.org")
        assert code == 250
        assert client.rcpt("nobody-here@mailroom.test")[0] == 550
        for n in range(2):
            assert client.rcpt(mailbox.address)[0] == 250
            assert client.data(f"Subject: {subject} {n}\r\n\r\nhello\r\n".encode())[0] == 250
            client.mail("sender@example.org")
        client.rset()


def _summed(log: str) -> dict[str, int]:
    """The summary lines' counts added up (a session and its messages may fall in two periods)."""
    total = {"stored": 0, "sessions": 0, "statements": 0, "unknown": 0, "lines": 0}
    for m in re.finditer(r"\] in \d+s: stored (\d+) message\(s\) in (\d+) session\(s\)(?: \((\d+) statement\(s\)\))?"
                         r"(?:, refused \d+ recipient\(s\) \(unknown (\d+)\))?", log):
        for key, value in zip(("stored", "sessions", "statements", "unknown"), m.groups(), strict=True):
            total[key] += int(value or 0)
        total["lines"] += 1
    return total


def test_a_summary_line_instead_of_a_line_per_message_on_uvloop(start_server, make_mailbox) -> None:
    server = start_server("--log-every", "0.3s")
    assert re.search(r"listening on .*, event loop uvloop\)", server.log()), server.log()
    box = make_mailbox()
    _send(server, box, "summary")
    deadline = time.monotonic() + 10
    while _summed(server.log())["stored"] < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.4)  # the period in progress, if any
    log = server.log()
    summed = _summed(log)
    assert summed == {"stored": 2, "sessions": 1, "statements": 2, "unknown": 1, "lines": summed["lines"]}, log
    assert 1 <= summed["lines"] <= 3, log
    assert "refused a recipient at RCPT" not in log and "stored 1 message(s) of" not in log  # no line each
    assert box.address not in log and "nobody-here" not in log
    time.sleep(1.0)  # three periods with nothing done: no line
    assert server.log() == log


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_the_asyncio_loop_when_uvloop_is_refused(start_server, make_mailbox, conn, how) -> None:
    server = (start_server("--event-loop", "asyncio") if how == "flag"
              else start_server(env={"MAILROOM_INBOX_EVENT_LOOP": "asyncio"}))
    assert re.search(r"listening on .*, event loop asyncio\)", server.log()), server.log()
    box = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=30) as client:
        client.sendmail("sender@example.org", [box.address], b"Subject: on asyncio\r\n\r\nhello\r\n")
    assert conn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id = %s", (box.id,)).fetchone()[0] == 1
    assert server.stop() == 0
    assert "stored 1 message(s) in 1 session(s)" in server.log()  # the summary at the stop


def test_a_bad_event_loop_is_one_line_exit_2(cli) -> None:
    result = cli("inbox", "serve", "--event-loop", "tokio")
    assert result.returncode == 2
    assert result.stderr.strip() == "mailroom: error: --event-loop must be one of auto, uvloop, asyncio, got 'tokio'"


def test_the_per_class_list_is_what_aiosmtpd_reads_exactly_when_switched_on() -> None:
    """aiosmtpd finds its tables with dir() of the session and of the handler (inspect.getmembers calls
    dir too): if it stopped, the per-class answer would go quiet; with MAILROOM_FAST_PATHS=off, dir() is
    Python's own."""
    import inspect

    from mailroom.core import fastpaths
    from mailroom.inboxes.smtp import _hook_members

    source = inspect.getsource(SMTP.__init__)
    assert "dir(self)" in source and "dir(handler)" in source and "getmembers(" in source
    loop = asyncio.new_event_loop()
    try:
        handler = InboxHandler(_Delivery())  # type: ignore[arg-type]
        smtp = _smtp_class(998)(handler, hostname="mx.test", loop=loop, decode_data=False)
        for obj in (smtp, handler):
            assert (dir(obj) == _hook_members(type(obj))) is fastpaths.enabled()
    finally:
        loop.close()
