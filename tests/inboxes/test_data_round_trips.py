"""What one message costs in round trips to PostgreSQL (issue 37, item 3), counted on the wire: the real
`mailroom inbox serve` talks to the database through the fault suite's TCP proxy (tests/faults/proxy.py,
no fault set), which notes every chunk a client sends upstream.

- RCPT: one round trip (check_bounce_recipient: the recipient's answer stays at RCPT time);
- DATA: one round trip, `deliver_messages` with its receipt key as ONE autocommit statement. It was two
  round trips (set_delivery_receipt and deliver_messages in a pipeline: its Flush, then the Sync that
  commits), sent as 3 to 5 writes: this test, run against that driver, counted [4, 3, 5].

What is counted is the writes the server sends upstream during the exchange (one write, one answer: one
round trip), with nothing else in flight; the median of three messages, so a heartbeat that happens to
fall in one window (one every ~10 s) does not decide it.
"""

from __future__ import annotations

import smtplib
import statistics
import sys
import time
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

sys.path.append(str(Path(__file__).resolve().parent.parent / "faults"))
from proxy import Proxy, ProxyLoop  # noqa: E402

BODY = b"Subject: round trips\r\nFrom: a@example.net\r\n\r\n" + b"x" * 70 + b"\r\n"


def _requests_during(proxy: Proxy, exchange) -> tuple[int, object]:
    time.sleep(0.2)  # whatever was in flight is answered
    before = len(proxy.requests)
    result = exchange()
    time.sleep(0.05)  # nothing is sent after the reply, but give a straggler the chance to be counted
    return len(proxy.requests) - before, result


def test_rcpt_and_data_are_one_round_trip_each(db_url, start_server, make_mailbox, conn):
    box = make_mailbox()
    info = conninfo_to_dict(db_url)
    host = info.get("host", "")
    upstream = f"{host}/.s.PGSQL.{info['port']}" if host.startswith("/") else (host, int(info["port"]))
    loop = ProxyLoop()
    try:
        proxy = Proxy(loop, "inbox", upstream)
        server = start_server(env={"MAILROOM_DATABASE_URL": make_conninfo(db_url, host="127.0.0.1",
                                                                            port=str(proxy.port))})
        rcpt_trips, data_trips = [], []
        with smtplib.SMTP(server.host, server.port, timeout=30) as smtp:
            smtp.ehlo("test.localhost")
            for _ in range(3):
                assert smtp.mail("a@example.net")[0] == 250
                trips, (code, _) = _requests_during(proxy, lambda: smtp.rcpt(box.address))
                assert code == 250
                rcpt_trips.append(trips)
                trips, (code, reply) = _requests_during(proxy, lambda: smtp.data(BODY))
                assert code == 250, reply
                data_trips.append(trips)
        stored = conn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id = %s",
                              (box.id,)).fetchone()[0]
        assert stored == 3
        assert statistics.median(rcpt_trips) == 1, rcpt_trips
        assert statistics.median(data_trips) == 1, data_trips
    finally:
        loop.stop()
