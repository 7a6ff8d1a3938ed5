"""`mailroom http serve` through a real PgBouncer in transaction mode, as mr_http: the API, the long
poll and the event stream work with LISTEN on the direct URL, and by polling without it (a listen
URL through the pooler, whose self-test fails: the same polling as with none)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))
from http_support import EventStream, start_http, wait_for_log  # noqa: E402

from mailroom import testing  # noqa: E402


def _serve(tmp_path: Path, database: str, listen: str, *args: str):
    def popen(*cmd: str, env=None, **kwargs):
        merged = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
        merged.update(PYTHONUNBUFFERED="1", MAILROOM_DATABASE_URL=database, MAILROOM_LISTEN_URL=listen)
        return subprocess.Popen([sys.executable, "-m", "mailroom", *cmd], env=testing.driver_env(merged, cmd), **kwargs)

    return start_http(popen, tmp_path / "http.log", *args)


@pytest.mark.parametrize("listen", ["direct", "pooled"])
def test_http_through_the_pooler(pooler, db_url, tmp_path, listen):
    as_http = testing.as_login(db_url, "mr_http")
    pooler.fill(as_http)
    pooled = pooler.pooled_url(as_http)
    listen_url = {"direct": db_url, "pooled": pooled}[listen]
    server = _serve(tmp_path, pooled, listen_url, "--poll-interval", "300ms", "--pool-size", "2")
    try:
        box = server.request("POST", "/api/v1/mailboxes?ttl_minutes=5").json()
        stream = EventStream(f"{server.base}/api/v1/mailboxes/{box['address']}/events", box["session_token"])
        try:
            assert stream.next_event("mailbox")["address"] == box["address"]
            with psycopg.connect(testing.as_login(db_url, "mr_inbound"), autocommit=True) as c:
                for n in range(3):
                    c.execute("SELECT mailroom.deliver_message(%s, %s, '', %s, null, 'x')",
                              (box["address"], b"Subject: x\r\n\r\nx", f"Message {n}"))
            got = [stream.next_event("message", timeout=5)["subject"] for _ in range(3)]
            assert got == ["Message 0", "Message 1", "Message 2"]  # each once, in order
        finally:
            stream.close()
        waited = server.request("GET", f"/api/v1/mailboxes/{box['address']}/wait?subject=Message%25&timeout=5",
                                token=box["session_token"])
        assert waited.status == 200 and waited.json()["subject"] == "Message 2"
        listed = server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages", token=box["session_token"])
        assert [m["subject"] for m in listed.json()] == ["Message 2", "Message 1", "Message 0"]
        if listen == "pooled":
            wait_for_log(server.log_path, "self-test NOTIFY did not come back", server.proc, timeout=10)
    finally:
        server.stop()
