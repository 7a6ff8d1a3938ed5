"""The sender's Prometheus endpoint: loopback only, counters by closed label sets, no PII."""

from __future__ import annotations

import signal
import time
import urllib.request

from outbound_support import SEND_FLAGS, add_sender, counts, enqueue, free_port


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def listening_addresses(port: int) -> set[str]:
    found = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, p = local.rsplit(":", 1)
                if state == "0A" and int(p, 16) == port:
                    found.add(addr)
    return found


def test_metrics_endpoint_scraped(conn, cli_popen, smtp_server):
    good = smtp_server()
    bad = smtp_server("reply_rcpt", "550 5.1.1 <secret.user@example.com> user unknown")
    add_sender(conn, good.port, name="good")
    add_sender(conn, bad.port, name="bad")
    enqueue(conn, 3, sender="good", subject="Confidential subject")
    enqueue(conn, 1, sender="bad", to=["secret.user@example.com"], subject="Confidential subject")
    port = free_port()
    proc = cli_popen("send", *SEND_FLAGS, "--metrics-port", str(port))
    try:
        deadline = time.monotonic() + 15
        text = ""
        while time.monotonic() < deadline:
            try:
                text = scrape(port)
            except OSError:
                text = ""
            if 'mailroom_outbound_queue_messages{status="sent"} 3.0' in text and counts(conn) == {"sent": 3, "failed": 1}:
                break
            time.sleep(0.1)
        assert 'mailroom_outbound_messages_total{result="sent",smtp_class="2xx"} 3.0' in text
        assert 'mailroom_outbound_messages_total{result="failed",smtp_class="5xx"} 1.0' in text
        assert 'mailroom_outbound_queue_messages{status="failed"} 1.0' in text
        assert 'mailroom_outbound_queue_messages{status="sent"} 3.0' in text
        assert "mailroom_outbound_send_seconds_bucket" in text
        assert "mailroom_outbound_oldest_queued_age_seconds" in text
        assert "@" not in text and "secret" not in text and "Confidential" not in text and "unknown" not in text
        assert listening_addresses(port) == {"0100007F"}, "metrics bind 127.0.0.1 only"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    err = proc.stderr.read().decode()
    assert "secret" not in err and "@example.com" not in err
