"""Many workers at once through one PgBouncer (3 server connections), with faults.

4 collectors (--enqueue), 4 senders and 2 inbound servers share one database through the
pooler (LISTEN direct); the application creates accounts through the pooler while SMTP clients
deliver to both inbound servers. Mid-run one collector, one sender and one inbound server are
SIGKILLed. Then: every token became exactly one outbound message (one per account), every message
reached the sink exactly once except rows flagged possibly_sent (counted), and every inbound
message answered 250 is stored exactly once. The figures are printed (run with -s to see them).
"""

from __future__ import annotations

import collections
import re
import signal
import smtplib
import threading
import time
from email.message import EmailMessage

import psycopg
import pytest
from outbound_support import Handler, SmtpServer
from pooled_support import wait_until

from mailroom.db.connect import connection_kwargs

ACCOUNTS = 600
INBOUND = 600
SMTP_CLIENTS = 4


def _created(pooled: str, stop_at: threading.Event, done: list[int]) -> None:
    """The application: accounts in small statements through the pooler."""
    with psycopg.connect(pooled, **connection_kwargs(application_name="app")) as app:
        for start in range(0, ACCOUNTS, 10):
            app.execute(
                "SELECT count(mailroom.create_account('many' || g || '@example.test', 'many' || g))"
                " FROM generate_series(%s::int, %s::int) AS g", (start, start + 9))
            done[0] = start + 10
            time.sleep(0.02)
    stop_at.set()


def _deliver(ports: list[int], boxes: list[str], client: int, replies: dict[str, int | None],
             lock: threading.Lock) -> None:
    """An SMTP client: its share of the inbound messages, to its server; on a dead server it moves
    to the next one for the rest (a message whose session broke is not retried: it has no 250)."""
    port_index = client % len(ports)
    smtp: smtplib.SMTP | None = None
    for i in range(client, INBOUND, SMTP_CLIENTS):
        subject = f"inbound {i}"
        code: int | None = None
        for _attempt in range(len(ports)):
            try:
                if smtp is None:
                    smtp = smtplib.SMTP("127.0.0.1", ports[port_index], timeout=20)
                msg = EmailMessage()
                msg["From"] = "client@example.test"
                msg["To"] = boxes[i % len(boxes)]
                msg["Subject"] = subject
                msg.set_content(f"body {i}")
                smtp.send_message(msg)
                code = 250
                break
            except smtplib.SMTPResponseException as exc:
                code = exc.smtp_code
                smtp.rset()
                break
            except (OSError, smtplib.SMTPServerDisconnected):
                smtp = None
                port_index = (port_index + 1) % len(ports)
                if code is None and _attempt == 0:
                    code = -1  # the session broke during this message: outcome unknown to the client
                    break
        with lock:
            replies[subject] = code
    if smtp is not None:
        try:
            smtp.quit()
        except (OSError, smtplib.SMTPException):
            pass


@pytest.mark.slow
def test_many_workers_through_the_pooler_with_faults(conn, urls, workers, pooler):
    t0 = time.monotonic()
    sink = SmtpServer(Handler(delay=0.01)).start()  # a relay takes a moment: claims are in flight
    try:
        conn.execute("SELECT mailroom.upsert_sender('mailroom', 'noreply@example.test', '127.0.0.1', %s)", (sink.port,))
        boxes = [conn.execute("SELECT address FROM mailroom.create_mailbox(60, 'pro')").fetchone()[0] for _ in range(5)]
        c, s, i, app = urls("collector"), urls("sender"), urls("inbound"), urls("app")

        collectors = [workers("collect", "--enqueue", "--poll-interval", "500ms",
                              env={"MAILROOM_DATABASE_URL": c.database, "MAILROOM_LISTEN_URL": c.listen,
                                   "MAILROOM_BATCH_LIMIT": "20",
                                   "MAILROOM_BATCH_TIMEOUT": "100ms", "MAILROOM_HEALTHCHECK_INTERVAL": "2s"})
                      for _ in range(4)]
        senders = [workers("send", "--worker", f"many:send{n}", "--poll-interval", "0.5s", "--lease", "5s",
                           "--reap-after", "5s", "--smtp-timeout", "5s", "--shutdown-grace", "1s",
                           env={"MAILROOM_DATABASE_URL": s.database, "MAILROOM_LISTEN_URL": s.listen})
                   for n in range(4)]
        servers = [workers("inbox", "serve", "--host", "127.0.0.1", "--port", "0",
                           env={"MAILROOM_DATABASE_URL": i.database}) for _ in range(2)]
        for w in collectors:
            w.wait_stderr("waiting for notifications", timeout=30)
        for w in servers:
            w.wait_stderr("listening on 127.0.0.1:", timeout=30)
        wait_until(lambda: conn.execute("SELECT count(*) FROM pg_stat_activity"
                                        " WHERE application_name = 'mailroom-send-listen'").fetchone()[0] == 4,
                   timeout=30, what="4 senders listening")
        ports = [int(re.search(r"listening on 127\.0\.0\.1:(\d+)", w.stderr()).group(1)) for w in servers]
        started = time.monotonic()

        created = [0]
        app_done = threading.Event()
        replies: dict[str, int | None] = {}
        lock = threading.Lock()
        threads = [threading.Thread(target=_created, args=(app.database, app_done, created))]
        threads += [threading.Thread(target=_deliver, args=(ports, boxes, n, replies, lock)) for n in range(SMTP_CLIENTS)]
        for t in threads:
            t.start()
        # mid-run: one of each dies without a word
        wait_until(lambda: created[0] >= ACCOUNTS // 2 and len(replies) >= INBOUND // 3, timeout=40, what="mid-run")
        # the sender dies holding a claim when it can be caught with one (its rows wait for the lease)
        held = 0
        deadline = time.monotonic() + 5
        while not held and time.monotonic() < deadline:
            held = conn.execute("SELECT count(*) FROM mailroom.outbound_messages WHERE status = 'processing'"
                                " AND claimed_by = 'many:send0'").fetchone()[0]
        killed = [collectors[0], senders[0], servers[0]]
        for w in killed:
            w.proc.send_signal(signal.SIGKILL)
        for t in threads:
            t.join(timeout=60)

        def outbound() -> dict[str, int]:
            return dict(conn.execute("SELECT status::text, count(*) FROM mailroom.outbound_messages GROUP BY 1").fetchall())

        wait_until(lambda: outbound() == {"sent": ACCOUNTS}, timeout=45,
                   what=f"{ACCOUNTS} messages sent (the killed sender's after the lease and the reaper)")
        seconds = time.monotonic() - started
        for w in collectors[1:] + senders[1:] + servers[1:]:
            assert w.stop() == 0, w.stderr()

        # tokens: each account exactly one message (idempotency key token:<id>)
        per_account = collections.Counter(
            a for (a,) in conn.execute("SELECT to_addrs[1] FROM mailroom.outbound_messages").fetchall())
        assert len(per_account) == ACCOUNTS and set(per_account.values()) == {1}
        assert conn.execute("SELECT count(*) FROM mailroom.tokens WHERE dispatched_at IS NULL").fetchone()[0] == 0
        # outbound: every message at the sink, more than once only when flagged possibly_sent
        received = collections.Counter(sink.handler.message_ids())
        rows = conn.execute("SELECT message_id, possibly_sent FROM mailroom.outbound_messages").fetchall()
        assert {m for m, _ in rows} == set(received), "every queued message received, nothing else"
        flagged = {m for m, p in rows if p}
        duplicated = {m: n - 1 for m, n in received.items() if n > 1}
        assert set(duplicated) <= flagged, f"duplicates without possibly_sent: {set(duplicated) - flagged}"
        # inbound: every 250 stored exactly once; a broken session's message may be stored or not
        stored = collections.Counter(
            subj for (subj,) in conn.execute("SELECT subject FROM mailroom.messages").fetchall())
        accepted = {subj for subj, code in replies.items() if code == 250}
        unconfirmed = {subj for subj, code in replies.items() if code != 250}
        assert len(replies) == INBOUND
        assert all(stored[subj] == 1 for subj in accepted), "every 250 stored exactly once"
        assert set(stored) <= accepted | unconfirmed and all(n == 1 for n in stored.values())
        for w in collectors[1:] + senders[1:] + servers[1:]:
            assert "prepared statement" not in w.stderr() and "Traceback" not in w.stderr(), w.stderr()
        health = conn.execute("SELECT kind, count(*) FROM mailroom.worker_health() GROUP BY 1 ORDER BY 1").fetchall()
        print(
            f"\nmany workers through PgBouncer ({pooler.pool_size} server connections; 4 collectors, 4 senders, "
            f"2 inbound servers; one of each SIGKILLed mid-run):\n"
            f"  tokens {ACCOUNTS}: {ACCOUNTS} messages, one per account\n"
            f"  the killed sender held {held} claimed message(s)\n"
            f"  outbound {len(rows)} messages: {sum(received.values())} deliveries at the sink, "
            f"{sum(duplicated.values())} duplicate(s), {len(flagged)} flagged possibly_sent\n"
            f"  inbound {INBOUND} messages: {len(accepted)} answered 250 and stored once, "
            f"{len(unconfirmed)} cut off by the kill ({sum(1 for s_ in unconfirmed if s_ in stored)} of them stored)\n"
            f"  {seconds:.1f} s from the first account to the last message sent ({time.monotonic() - t0:.1f} s in all); "
            f"heartbeats: {dict(health)}"
        )
    finally:
        sink.stop()
