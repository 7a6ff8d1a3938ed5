"""Queue health through PgBouncer: worker heartbeats (collector, sender, expiry), the rows of
mailroom.queue_health in `mailroom outbound status`, and the sender's queue gauges."""

from __future__ import annotations

import time
import urllib.request

from collector_support import create_accounts
from outbound_support import add_sender, counts, enqueue, free_port
from pooled_support import wait_until
from psycopg.rows import dict_row


def health(conn) -> dict[str, dict]:
    rows = conn.cursor(row_factory=dict_row).execute("SELECT * FROM mailroom.worker_health()").fetchall()
    return {r["kind"]: r for r in rows}


def test_workers_report_heartbeats_through_the_pooler(conn, urls, workers, pooler):
    conn.execute("SELECT mailroom.upsert_sender('mailroom', 'noreply@example.test', '127.0.0.1', %s)", (free_port(),))
    u = urls("collector")
    collector = workers("collect", "--enqueue", env={"MAILROOM_DATABASE_URL": u.database, "MAILROOM_LISTEN_URL": u.listen,
                                                      "MAILROOM_BATCH_TIMEOUT": "100ms"})
    s = urls("sender")
    sender = workers("send", "--worker", "hosta:send1", "--reap-after", "0",
                     env={"MAILROOM_DATABASE_URL": s.database, "MAILROOM_LISTEN_URL": s.listen})
    expiry = workers("expire", "--interval", "1s", env={"MAILROOM_DATABASE_URL": urls("expiry").database,
                                                        "MAILROOM_LISTEN_URL": "none"})
    # the listeners come up after the first heartbeat: the change is reported at once
    wait_until(lambda: {k: r["listening"] for k, r in health(conn).items()}
               == {"collector": True, "sender": True, "expiry": False}, timeout=15, what="three workers, two listening")
    h = health(conn)
    assert h["sender"]["worker"] == "hosta:send1"
    assert all(r["heartbeat_age_seconds"] < 5 for r in h.values())
    assert h["collector"]["last_claim_age_seconds"] is None
    logins = create_accounts(conn, "hb", 5)
    wait_until(lambda: counts(conn).get("queued", 0) + counts(conn).get("processing", 0) + counts(conn).get("failed", 0)
               >= len(logins), what="5 messages enqueued")
    # claims are reported by the next periodic heartbeat (about every 10 s)
    wait_until(lambda: health(conn)["collector"]["claimed"] == 5, timeout=15, what="the collector's claims reported")
    wait_until(lambda: health(conn)["sender"]["claimed"] >= 5, timeout=15, what="the sender's claims reported")
    h = health(conn)
    assert h["collector"]["last_claim_age_seconds"] < 15 and h["sender"]["last_claim_age_seconds"] < 15
    # heartbeats keep coming (every ~10 s): a sample may fall just before a beat the load delayed
    # (it failed once so, under load), so the next beats get a few seconds; a worker that stopped
    # beating never gets under the bound again
    wait_until(lambda: all(health(conn)[k]["heartbeat_age_seconds"] < 12 for k in ("collector", "expiry")),
               timeout=10, what="a collector and an expiry heartbeat younger than 12 s")
    for w in (collector, sender, expiry):
        assert w.stop() == 0, w.stderr()
        assert "heartbeats off" not in w.stderr() and "heartbeat failed" not in w.stderr()


def test_outbound_status_prints_queue_health(conn, urls, cli):
    add_sender(conn, 2525)
    enqueue(conn, 3)
    conn.execute("SELECT count(*) FROM mailroom.claim_messages(1, 'gone:1', '1 millisecond')")
    create_accounts(conn, "st", 2)
    conn.execute(
        """INSERT INTO mailroom.mailboxes (address, plan, session_token_digest, expires_at, created_at)
           SELECT format('due-%s@mailroom.test', g), 'free', '\\x00', now() - interval '2 minutes', now() - interval '1 hour'
           FROM generate_series(1, 4) AS g"""
    )
    conn.execute("SELECT mailroom.worker_heartbeat('hostb:42', 'sender', false, 1)")
    time.sleep(0.01)
    out = cli("outbound", "status", env={"MAILROOM_DATABASE_URL": urls("monitor").database})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["queued", "2"]
    start = lines.index("queue health:")
    assert lines[start + 1].split() == ["QUEUE", "DUE", "OLDEST_DUE_AGE_SECONDS", "EXPIRED_LEASES"]
    table = {line.split()[0]: line.split()[1:] for line in lines[start + 2:start + 5]}
    assert table["outbound"][0] == "2" and table["outbound"][2] == "1", out.stdout
    assert table["tokens"][0] == "2" and table["tokens"][2] == "-"
    assert table["inbox_expiry"][0] == "4" and 119 <= int(table["inbox_expiry"][1]) <= 130
    workers = lines[lines.index("worker heartbeats:") + 1:]
    assert workers[0].split()[:3] == ["WORKER", "KIND", "STATE"]
    assert workers[1].split()[:3] == ["hostb:42", "sender", "running"]


def test_sender_metrics_expose_queue_health(conn, urls, workers):
    add_sender(conn, free_port())
    enqueue(conn, 1)
    conn.execute("SELECT count(*) FROM mailroom.claim_messages(1, 'gone:1', '1 millisecond')")
    create_accounts(conn, "met", 3)
    port = free_port()
    w = workers("send", "--reap-after", "0", "--poll-interval", "0.2s", "--metrics-port", str(port),
                env={"MAILROOM_DATABASE_URL": urls("sender").database})
    want = ['mailroom_queue_due{queue="outbound"} 0.0', 'mailroom_queue_due{queue="tokens"} 3.0',
            'mailroom_queue_due{queue="inbox_expiry"} 0.0', 'mailroom_queue_expired_leases{queue="outbound"} 1.0']
    text = ""

    def scraped() -> bool:
        nonlocal text
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return False
        return all(line in text for line in want)

    wait_until(scraped, timeout=15, what=f"the queue gauges; last scrape:\n{text}")
    assert 'mailroom_queue_oldest_due_age_seconds{queue="tokens"}' in text
    assert 'mailroom_queue_expired_leases{queue="tokens"}' not in text  # no leases there
    assert "@" not in text
    assert w.stop() == 0
