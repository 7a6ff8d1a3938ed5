"""REST's long poll is the one wait (docs/architecture.md, "The wait"; issue 43, item 2).

It ends with 410 at its inbox's expiry (MR205) as soon as the clock passes expires_at, and at its
deletion (MR206), not at its timeout; `?after=` makes a resend flow wait for the next message; the
waits are capped per credential (MR251) and in total (MR252) with 429 and Retry-After, and a wait
whose client closed its socket gives its place back at once.
"""

from __future__ import annotations

import select
import socket
import threading
import time
import urllib.error

import psycopg
from http_support import EventStream, request


def _expiring_inbox(db_url: str, seconds: float) -> tuple[str, str]:
    """An anonymous inbox made with mailroom.clock() pinned in the past, so that its one-minute TTL ends
    `seconds` from now (the server reads the real clock): its address and session token."""
    with psycopg.connect(db_url, autocommit=True) as c:  # the superuser: a timekeeper
        c.execute("SELECT set_config('mailroom.clock', (clock_timestamp() - interval '60 seconds'"
                  " + make_interval(secs => %s))::text, false)", (seconds,))
        return c.execute("SELECT address, session_token FROM mailroom.create_mailbox(1, 'free')").fetchone()


def _in_thread(url: str, token: str, timeout: float = 90) -> tuple[threading.Thread, list]:
    result: list = []

    def run() -> None:
        started = time.monotonic()
        result.append(request("GET", url, token=token, timeout=timeout))
        result.append(time.monotonic() - started)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_expiry_ends_a_long_poll_with_410_at_once(server, db_url) -> None:
    address, token = _expiring_inbox(db_url, 3)
    thread, result = _in_thread(f"{server.base}/api/v1/mailboxes/{address}/wait?timeout=20", token)
    thread.join(timeout=60)
    answer, took = result
    assert took < 15, f"the wait ran {took:.1f}s: past the inbox's expiry (3 s away), towards its timeout"
    assert (answer.status, answer.error_code) == (410, "MR205"), answer.body


def test_deletion_ends_a_long_poll_with_410_at_once(server, db_url) -> None:
    address, token = _expiring_inbox(db_url, 600)
    thread, result = _in_thread(f"{server.base}/api/v1/mailboxes/{address}/wait?timeout=20", token)
    time.sleep(1)
    assert thread.is_alive()
    started = time.monotonic()
    assert server.request("DELETE", f"/api/v1/mailboxes/{address}", token=token).json() == {"deleted": True}
    thread.join(timeout=60)
    answer = result[0]
    assert time.monotonic() - started < 15, "the wait ran on after the deletion, towards its timeout"
    assert (answer.status, answer.error_code) == (410, "MR206"), answer.body


def test_a_resend_flow_waits_after_the_message_it_has(server, db_url, deliver) -> None:
    address, token = _expiring_inbox(db_url, 600)
    first = deliver(address, "Your code", "your code is 11111")
    wait = f"{server.base}/api/v1/mailboxes/{address}/wait"
    got = request("GET", f"{wait}?subject=Your%25&timeout=5", token=token)
    assert got.status == 200 and got.json()["id"] == first
    # "resend the code": the wait after it does not answer the previous message at once
    thread, result = _in_thread(f"{wait}?subject=Your%25&after={first}&timeout=30", token)
    time.sleep(1)
    assert thread.is_alive(), result
    second = deliver(address, "Your code", "your code is 22222")
    thread.join(timeout=40)
    assert result[0].status == 200 and result[0].json()["id"] == second, result[0].body
    code = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{second}/code", token=token)
    assert code.json()["code"] == "22222", code.body
    # the cursor goes the FastAPI way too (a value the fast path does not take), with the same answer
    slow = request("GET", f"{wait}?subject=Your%25&after=%2B{first}&timeout=5", token=token)
    assert slow.status == 200 and slow.json()["id"] == second, slow.body
    late = request("GET", f"{wait}?after={second}&timeout=0.3", token=token)
    assert (late.status, late.error_code) == (408, "MR212")


def _raw_wait(base: str, address: str, token: str) -> socket.socket:
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(f"GET /api/v1/mailboxes/{address}/wait?timeout=120 HTTP/1.1\r\nHost: {host}\r\n"
                 f"Authorization: Bearer {token}\r\n\r\n".encode())
    return sock


def _armed(base: str, box: tuple[str, str], n: int) -> list[socket.socket]:
    """n long polls of one inbox on raw sockets, each still waiting (one a first look answered, as a busy
    machine's pool timeout can, is replaced)."""
    socks: list[socket.socket] = []
    started = time.monotonic()
    while True:
        answered = select.select(socks, [], [], 1.0)[0] if socks else []
        for sock in answered:
            socks.remove(sock)
            sock.close()
        if len(socks) == n and not answered:
            return socks
        assert time.monotonic() - started < 60, f"{len(socks)} of {n} long polls waiting"
        socks += [_raw_wait(base, *box) for _ in range(n - len(socks))]


def _probe(base: str, address: str, token: str):
    return request("GET", f"{base}/api/v1/mailboxes/{address}/wait?timeout=0.3", token=token)


def test_waits_are_capped_and_a_closed_socket_frees_its_place(start_server, db_url, deliver) -> None:
    """wait.max_per_credential 2, wait.max_total 3 (settings read by the server): the third wait of a
    token is 429 MR251, the fourth of the server 429 MR252, both with Retry-After: 1; once the waiting
    clients close their sockets, waits are admitted again within a second or two."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("SELECT mailroom.set_setting('wait.max_per_credential', '2')")
        c.execute("SELECT mailroom.set_setting('wait.max_total', '3')")
    try:
        server = start_server()
        a, b, c_ = (_expiring_inbox(db_url, 600) for _ in range(3))
        socks = _armed(server.base, a, 2)

        def refused(box, code: str, timeout: float = 20):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                answer = _probe(server.base, *box)
                if answer.status == 429:
                    assert answer.error_code == code and answer.headers["retry-after"] == "1", answer.body
                    return answer
                assert (answer.status, answer.error_code) == (408, "MR212"), answer.body  # admitted: not yet armed
            raise AssertionError(f"no {code} within {timeout}s")

        assert "wait.max_per_credential" in refused(a, "MR251").json()["detail"]
        socks += _armed(server.base, b, 1)  # b's wait armed before c's probes take a place
        assert "wait.max_total" in refused(c_, "MR252").json()["detail"]
        # a wait answered by its first look is never refused: a message already there needs no place
        deliver(c_[0], "Hi", "there")
        assert _probe(server.base, *c_).status == 200
        for sock in socks:
            sock.close()
        started = time.monotonic()
        while _probe(server.base, *a).status == 429:
            assert time.monotonic() - started < 10, "the closed clients' waits still hold their places"
        print(f"\nplaces given back {time.monotonic() - started:.2f}s after the sockets closed")
    finally:
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("SELECT mailroom.set_setting('wait.max_per_credential', '100')")
            c.execute("SELECT mailroom.set_setting('wait.max_total', '2000')")


def test_an_event_stream_closes_at_expiry_and_at_deletion(server, db_url) -> None:
    """The event stream's wait ends as the long poll's: `closed` when its inbox expires (not at the next
    keepalive, 15 s) and as soon as it is deleted."""
    address, token = _expiring_inbox(db_url, 2)
    stream = EventStream(f"{server.base}/api/v1/mailboxes/{address}/events", token, timeout=30)
    try:
        stream.next_event("mailbox")
        started = time.monotonic()
        closed = stream.next_event("closed", timeout=30)
        assert closed["error"]["code"] == "MR205", closed
        assert time.monotonic() - started < 10, "closed at the keepalive, not at the expiry"
    finally:
        stream.close()
    address, token = _expiring_inbox(db_url, 600)
    stream = EventStream(f"{server.base}/api/v1/mailboxes/{address}/events", token, timeout=30)
    try:
        stream.next_event("mailbox")
        started = time.monotonic()
        assert server.request("DELETE", f"/api/v1/mailboxes/{address}", token=token).json() == {"deleted": True}
        closed = stream.next_event("closed", timeout=30)
        assert closed["error"]["code"] == "MR206", closed
        assert time.monotonic() - started < 10, "closed at the keepalive, not at the deletion"
    finally:
        stream.close()


def test_event_streams_are_capped(start_server, db_url) -> None:
    """events.max_per_credential 1: a token's second stream is 429 MR251; closing the first frees its place."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("SELECT mailroom.set_setting('events.max_per_credential', '1')")
    try:
        server = start_server()
        address, token = _expiring_inbox(db_url, 600)
        url = f"{server.base}/api/v1/mailboxes/{address}/events"
        first = EventStream(url, token)
        first.next_event("mailbox")
        refused = request("GET", url, token=token)
        assert (refused.status, refused.error_code) == (429, "MR251"), refused.body
        assert refused.headers["retry-after"] == "1" and "events.max_per_credential" in refused.json()["detail"]
        first.close()
        started = time.monotonic()
        while True:
            try:
                again = EventStream(url, token)
                break
            except urllib.error.HTTPError as err:
                assert err.code == 429 and time.monotonic() - started < 10, err.code
                time.sleep(0.1)
        assert again.next_event("mailbox")["address"] == address
        again.close()
    finally:
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("SELECT mailroom.set_setting('events.max_per_credential', '500')")


def _get_from(base: str, path: str, token: str, source: str, headers: dict[str, str] | None = None):
    """GET path as a client at `source` (Linux routes all of 127/8 to lo): (status, headers, JSON or None)."""
    import http.client
    import json

    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(source, 0))
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}", **(headers or {})})
        resp = conn.getresponse()
        body = resp.read() if resp.status != 200 or "event-stream" not in (resp.getheader("content-type") or "") \
            else b""
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(body) if body else None
    finally:
        conn.close()


def _held_from(base: str, path: str, token: str, source: str, headers: dict[str, str] | None = None) -> socket.socket:
    """A request left waiting on a raw socket from `source` (a long poll or an event stream)."""
    host, port = base.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0))
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n{extra}\r\n".encode())
    return sock


def _refused_past(base: str, held: list[tuple], probe: tuple) -> tuple[dict, dict, list[socket.socket]]:
    """Hold the requests `held` (each (path, token, source, headers)) and probe (a wait, timeout 0.3) until
    the server answers 429 while every held one still waits: (headers, body, the held sockets). A probe
    admitted meanwhile times out (408); a held one answered meanwhile (refused while a probe held a place)
    is held again."""
    socks = [_held_from(base, *h) for h in held]
    started = time.monotonic()
    while time.monotonic() - started < 30:
        status, head, body = _get_from(base, *probe)
        answered = select.select(socks, [], [], 0)[0]
        for i, sock in enumerate(socks):
            if sock in answered:
                sock.close()
                socks[i] = _held_from(base, *held[i])
        if status == 429 and not answered:
            return head, body, socks
        assert status in (408, 429), (status, body)
    for sock in socks:
        sock.close()
    raise AssertionError("no 429 within 30 s")


def test_waits_are_capped_per_client_address(start_server, db_url) -> None:
    """wait.max_per_client 2: one client's anonymous inboxes, each with a session token of its own (so
    each under wait.max_per_credential), hold at most two waits together; the third is 429 MR253 with
    Retry-After: 1, while another client address's wait is admitted (the attacker review after issue 45:
    one client could otherwise take the whole wait.max_total)."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("SELECT mailroom.set_setting('wait.max_per_client', '2')")
    try:
        server = start_server()
        boxes = [_expiring_inbox(db_url, 600) for _ in range(3)]
        address, token = boxes[2]
        head, body, socks = _refused_past(
            server.base, [(f"/api/v1/mailboxes/{a}/wait?timeout=120", t, "127.0.0.1") for a, t in boxes[:2]],
            (f"/api/v1/mailboxes/{address}/wait?timeout=0.3", token, "127.0.0.1"))
        try:
            assert body["error"]["code"] == "MR253" and head["retry-after"] == "1", body
            assert "wait.max_per_client" in body["detail"], body
            status, _, body = _get_from(server.base, f"/api/v1/mailboxes/{address}/wait?timeout=0.3", token,
                                        "127.0.0.2")
            assert (status, body["error"]["code"]) == (408, "MR212"), body  # another client: admitted
        finally:
            for sock in socks:
                sock.close()
    finally:
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("SELECT mailroom.set_setting('wait.max_per_client', '200')")


def test_behind_a_proxy_the_client_is_its_forwarded_address(start_server, db_url) -> None:
    """With --proxy, the per-client cap counts the address the proxy forwards (X-Forwarded-For), as the
    creation rate limit does: two clients behind one proxy are two, and one client is one."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("SELECT mailroom.set_setting('wait.max_per_client', '1')")
    try:
        server = start_server("--proxy", "127.0.0.1")
        (a, ta), (b, tb) = _expiring_inbox(db_url, 600), _expiring_inbox(db_url, 600)
        first = {"X-Forwarded-For": "198.51.100.7"}
        _, body, (sock,) = _refused_past(server.base, [(f"/api/v1/mailboxes/{a}/wait?timeout=120", ta, "127.0.0.1", first)],
                                         (f"/api/v1/mailboxes/{b}/wait?timeout=0.3", tb, "127.0.0.1", first))
        try:
            assert body["error"]["code"] == "MR253", body
            status, _, body = _get_from(server.base, f"/api/v1/mailboxes/{b}/wait?timeout=0.3", tb, "127.0.0.1",
                                        {"X-Forwarded-For": "198.51.100.8"})
            assert (status, body["error"]["code"]) == (408, "MR212"), body
        finally:
            sock.close()
    finally:
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("SELECT mailroom.set_setting('wait.max_per_client', '200')")


def test_event_streams_are_capped_per_client_address(start_server, db_url) -> None:
    """events.max_per_client 1: a client's second stream, on another anonymous inbox, is 429 MR253;
    another client address's is served."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("SELECT mailroom.set_setting('events.max_per_client', '1')")
    try:
        server = start_server()
        (a, ta), (b, tb) = _expiring_inbox(db_url, 600), _expiring_inbox(db_url, 600)
        first = EventStream(f"{server.base}/api/v1/mailboxes/{a}/events", ta)
        try:
            first.next_event("mailbox")
            status, head, body = _get_from(server.base, f"/api/v1/mailboxes/{b}/events", tb, "127.0.0.1")
            assert status == 429, f"a second stream from one client address was answered {status}"
            assert (body["error"]["code"], head["retry-after"]) == ("MR253", "1"), body
            assert "events.max_per_client" in body["detail"], body
            sock = _held_from(server.base, f"/api/v1/mailboxes/{b}/events", tb, "127.0.0.2")
            try:
                assert sock.recv(64).startswith(b"HTTP/1.1 200"), "another client's stream was refused"
            finally:
                sock.close()
        finally:
            first.close()
    finally:
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute("SELECT mailroom.set_setting('events.max_per_client', '1000')")
