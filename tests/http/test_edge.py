"""The edge (issue 43, item 3; mailroom/api/edge.py): every request bounded and checked before any work.

- A 300 MB body without credentials to a model-bodied route (PUT …/fault, POST …/release) or to the
  page's login form is answered 413 (MR030) while the client is still sending, and the server's
  resident memory grows by under 20 MB; a chunked body without Content-Length is cut at the bound.
- `%00` in a path or a query, on the hot read and on any other route, is 400 (MR031), never a 500;
  a path that is not UTF-8 once decoded is 400 (MR032).
- A JSON body nested deeper than the edge allows (3,000 levels: under 4 KB, past Python's recursion
  limit) is 400 (MR033) on the unauthenticated POST /api/v1/mailboxes and on a model-bodied route.
Every refusal is the REST ErrorResponse, `detail` included, and the log has no traceback.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

MB = 1024 * 1024


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _stream(server, method: str, path: str, total: int, *, chunked: bool = False,  # noqa: ANN001
            content_type: str = "application/json") -> tuple[int, bytes, int]:
    """Send `total` bytes of body as fast as the server takes them while reading its answer; the
    answer's status, body, and the server's largest resident-memory growth meanwhile."""
    host, port = urlsplit(server.base).hostname, urlsplit(server.base).port
    pid = server.proc.pid
    before = _rss(pid)
    peak = [before]
    done = threading.Event()
    length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {total}"
    sock = socket.create_connection((host, port), timeout=60)
    sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
                 f"{length}\r\n\r\n".encode())

    def send_body() -> None:
        chunk = b"{" + b" " * (MB - 1)
        sent = 0
        try:
            while sent < total and not done.is_set():
                data = chunk if not chunked else f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
                sock.sendall(data)
                sent += len(chunk)
                peak[0] = max(peak[0], _rss(pid))
            if chunked and not done.is_set():
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered and closed: what the test wants

    sender = threading.Thread(target=send_body, daemon=True)
    sender.start()
    answer = b""
    try:
        while b"\r\n\r\n" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
        head, _, body = answer.partition(b"\r\n\r\n")
        status = int(head.split()[1])
        length_line = [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
        want = int(length_line[0].split(b":")[1]) if length_line else 0
        while len(body) < want:
            data = sock.recv(65536)
            if not data:
                break
            body += data
    finally:
        done.set()
        peak[0] = max(peak[0], _rss(pid))
        sock.close()
        sender.join(timeout=30)
    return status, body, peak[0] - before


@pytest.mark.parametrize("path", ["/api/v1/mailboxes/nobody@example.com/fault",
                                  "/api/v1/mailboxes/nobody@example.com/messages/1/release"])
def test_300_mb_without_credentials_is_413_and_costs_under_20_mb(server, path):
    status, body, grown = _stream(server, "PUT" if path.endswith("fault") else "POST", path, 300 * MB)
    assert status == 413, body[:300]
    doc = json.loads(body)
    assert doc["error"]["code"] == "MR030" and doc["detail"] == doc["error"]["message"], doc
    assert "16384 bytes" in doc["detail"]
    assert grown < 20 * MB, f"resident memory grew by {grown / MB:.0f} MB"


def test_a_chunked_body_is_cut_at_its_bound(server):
    status, body, grown = _stream(server, "POST", "/api/v1/mailboxes/nobody@example.com/messages/1/release",
                                  300 * MB, chunked=True)
    assert status == 413 and json.loads(body)["error"]["code"] == "MR030", body[:300]
    assert grown < 20 * MB, f"resident memory grew by {grown / MB:.0f} MB"


def test_the_pages_login_form_is_bounded_too(server):
    status, body, grown = _stream(server, "POST", "/inbox/nobody@example.com/login", 200 * MB,
                                  content_type="application/x-www-form-urlencoded")
    assert status == 413, body[:300]
    assert b"MR030" in body and b"<html" in body.lower()  # the page answers its HTML
    assert grown < 20 * MB, f"resident memory grew by {grown / MB:.0f} MB"


def test_a_body_under_its_bound_still_reaches_its_route(server):
    resp = server.request("POST", "/api/v1/mailboxes", body={"ttl_minutes": 5})
    assert resp.status == 201, resp.body
    box = resp.json()
    resp = server.request("PUT", f"/api/v1/mailboxes/{box['address']}/fault", token=box["session_token"],
                          body={"stage": "rcpt", "reply": "450 4.2.1 try later"})
    assert resp.status == 200 or resp.error_code != "MR030", resp.body  # the route's own answer


@pytest.mark.parametrize("path", [
    "/api/v1/mailboxes/a%00b@example.com/messages",  # the hot read
    "/api/v1/mailboxes/a%00b@example.com",
    "/api/v1/mailboxes/x@example.com/messages?tag=%00",
    "/api/v1/mailboxes/x@example.com/wait?subject=a%00&timeout=1",
    "/api/v1/mailboxes/x@example.com/search?q=%00",
])
def test_a_nul_in_a_path_or_query_is_400_with_its_code(server, path):
    resp = server.request("GET", path, token="mrk_whatever")
    assert resp.status == 400, resp.body
    assert resp.error_code == "MR031" and resp.json()["detail"], resp.body
    assert "cannot contain NUL" not in server.log() and "Traceback" not in server.log()


def test_a_path_that_is_not_utf8_is_400(server):
    resp = server.request("GET", "/api/v1/mailboxes/a%FFb@example.com", token="mrk_whatever")
    assert resp.status == 400 and resp.error_code == "MR032", resp.body


def test_a_nul_in_a_json_string_is_400(server):
    resp = server.request("POST", "/api/v1/mailboxes", body=b'{"plan": "a\\u0000b"}',
                          headers={"Content-Type": "application/json"})
    assert resp.status == 400 and resp.error_code == "MR031", resp.body


@pytest.mark.parametrize(("method", "path"), [("POST", "/api/v1/mailboxes"),
                                              ("PUT", "/api/v1/mailboxes/x@example.com/fault")])
def test_json_nested_past_the_bound_is_400_not_500(server, method, path):
    deep = b"[" * 3000 + b"]" * 3000
    resp = server.request(method, path, body=deep, headers={"Content-Type": "application/json"},
                          token="mrk_whatever")
    assert resp.status == 400, resp.body
    assert resp.error_code == "MR033" and "64 levels" in resp.json()["detail"], resp.body
    time.sleep(0.1)
    assert "Traceback" not in server.log() and "RecursionError" not in server.log()


def test_a_regex_that_does_not_compile_is_its_own_code(server, deliver):
    resp = server.request("POST", "/api/v1/mailboxes")
    box = resp.json()
    message_id = deliver(box["address"], "your code", "Your code is 12345")
    resp = server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages/{message_id}/code?pattern=%28%5B0-9%5D%2B",
                          token=box["session_token"])
    assert resp.status == 400, resp.body
    assert resp.error_code == "MR034" and "not a valid regular expression" in resp.json()["detail"], resp.body


def test_a_cookie_that_unquotes_to_a_nul_is_400(server):
    resp = server.request("GET", "/api/v1/mailboxes/x@example.com", headers={"Cookie": 'mailroom_key="\\000abc"'})
    assert resp.status == 400 and resp.error_code == "MR031", resp.body
    assert "cannot contain NUL" not in server.log()


def test_the_json_scan_counts_structure_only():
    from mailroom.api.edge import JSON_DEPTH, json_refusal

    assert json_refusal(b"[" * JSON_DEPTH + b"]" * JSON_DEPTH) is None
    assert json_refusal(b"[" * (JSON_DEPTH + 1) + b"]" * (JSON_DEPTH + 1)) == "json_depth"
    assert json_refusal(b'{"a":' * (JSON_DEPTH + 1) + b"1" + b"}" * (JSON_DEPTH + 1)) == "json_depth"
    assert json_refusal(b"[" * 200_000) == "json_depth"  # never closed: a parser descends them all the same
    assert json_refusal(b'["' + b"[" * 5000 + b'"]') is None  # brackets in a string are text
    assert json_refusal(b'["\\"' + b"[" * 5000 + b'"]') is None  # an escaped quote does not end it
    assert json_refusal(b"[" + b"[1]," * 100_000 + b"1]") is None  # wide is not deep
    assert json_refusal(b'{"a": "x\\u0000"}') == "nul"
    assert json_refusal(b'{"a": "x\\\\u0000"}') is None  # an escaped backslash, then the text u0000
    assert json_refusal(b'{"a": "x\\\\\\u0000"}') == "nul"


@pytest.mark.parametrize(("path", "bound"), [("/unsubscribe/sometoken", 4096), ("/hooks/ses", 1024 * 1024),
                                             ("/api/v1/mailboxes/x@example.com/messages/delete", 64 * 1024)])
def test_every_bodied_route_answers_its_bound_with_mr030(server, path, bound):
    """The answer comes before a byte of the body is read: the client sends the headers (a Content-Length
    one over the bound) and reads the answer without sending the body (sending it raced the server's close
    of a connection whose body it never reads: a broken pipe, once in CI)."""
    import http.client
    from urllib.parse import urlsplit

    base = urlsplit(server.base)
    conn = http.client.HTTPConnection(base.hostname, base.port, timeout=30)
    try:
        conn.putrequest("POST", path)
        conn.putheader("Content-Type", "text/plain")
        conn.putheader("Content-Length", str(bound + 1))
        conn.endheaders()
        reply = conn.getresponse()
        status, body = reply.status, reply.read()
    finally:
        conn.close()
    assert status == 413, body
    assert json.loads(body)["error"]["code"] == "MR030" and f"{bound} bytes" in json.loads(body)["detail"], body


def test_the_depth_scan_is_linear_on_strings_never_closed():
    """The attacker review (issue 45, item 5): a body of 65 brackets then '"\\' repeated, ending in a lone
    backslash, left every quote a failed match scanning to the end (32 KB took 2.9 s, 1 MiB ~50 min,
    before any key check). A string never closed now runs to the end of the body in one match."""
    from mailroom.api.edge import JSON_DEPTH, json_refusal

    started = time.monotonic()
    for body in (b"[" * (JSON_DEPTH + 1) + b'"\\' * (1 << 19), b"[" * (JSON_DEPTH + 1) + b'"' * (1 << 20)):
        assert json_refusal(body) == "json_depth"
    assert json_refusal(b'["' + b'\\"' * (1 << 19)) is None
    assert time.monotonic() - started < 5  # linear: about 0.1 s here; quadratic: hours


def test_the_faces_listening_socket_gives_each_connection_tcp_nodelay():
    """uvicorn takes `http serve`'s socket by its fd as a unix socket, so neither asyncio nor uvloop set
    TCP_NODELAY on the connections it accepted: Nagle held each response's second write (its body, after
    the headers) until the client's delayed ACK, ~40 ms a request (wrk's p50 was 44 ms at a third of the
    machine's CPU; issue 46). The socket both faces listen on now carries it, and Linux passes it on."""
    from mailroom.core.sockets import listening_socket

    with listening_socket("127.0.0.1", 0) as sock, socket.create_connection(sock.getsockname()):
        accepted, _ = sock.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1


def test_requests_on_a_kept_alive_connection_do_not_wait_for_delayed_acks(server):
    """The same defect seen from a client: 40 requests one after another on one kept-alive connection.
    Without TCP_NODELAY each took 44 ms (Nagle held the body until the client's delayed ACK, whose
    floor on Linux is 40 ms); with it, ~2 ms here. The bound is the median's, and half that floor."""
    import http.client
    import statistics

    host, port = urlsplit(server.base).hostname, urlsplit(server.base).port
    conn = http.client.HTTPConnection(host, port, timeout=10)
    took = []
    try:
        for _ in range(40):
            started = time.perf_counter()
            conn.request("GET", "/api/v1/release")
            resp = conn.getresponse()
            assert resp.status == 200, resp.read()
            resp.read()
            took.append(time.perf_counter() - started)
    finally:
        conn.close()
    assert statistics.median(took) < 0.020, f"median {statistics.median(took) * 1000:.1f} ms"
