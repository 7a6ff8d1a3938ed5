"""The hot reads' fast path (mailroom.http.app._fast_get): GET …/messages and …/wait are answered by
their endpoint without FastAPI's parameter solving when the query is plain, and by the FastAPI route
otherwise. Both ways must answer the same: the same body for the same values, FastAPI's 422 for a
value it refuses, the same access-log route; and a long poll whose message is already there answers
at once (its first look before anything else), one whose deadline passed is still 408.
"""

from __future__ import annotations

import time

from http_support import request


def _box(server, deliver, subjects: list[str]) -> tuple[str, str]:
    created = server.request("POST", "/api/v1/mailboxes")
    assert created.status == 201, created.body
    box = created.json()
    for subject in subjects:
        deliver(box["address"], subject, "body of " + subject)
    return box["address"], box["session_token"]


def test_plain_and_declared_queries_answer_alike(server, deliver):
    address, token = _box(server, deliver, ["one", "two", "three"])
    path = f"/api/v1/mailboxes/{address}/messages"

    def get(query: str):
        return server.request("GET", path + query, token=token)

    # each pair: a plain query (the fast path) and one only FastAPI parses (a sign, a space, "yes",
    # a repeated name), meaning the same
    for plain, declared in (("?limit=2", "?limit=+2"), ("?limit=2&offset=1", "?limit=2&offset=%201"),
                            ("?unread=true", "?unread=yes"), ("?unread=false", "?unread=0"),
                            ("?limit=1", "?limit=3&limit=1")):
        fast, slow = get(plain), get(declared)
        assert fast.status == slow.status == 200, (plain, fast.body, declared, slow.body)
        assert fast.body == slow.body, (plain, declared)
    assert [m["subject"] for m in get("?limit=2").json()] == ["three", "two"]
    assert get("?after=999999999").json() == []
    # names the route does not declare are ignored both ways
    assert get("?limit=1&foo=bar").body == get("?limit=1").body
    # FastAPI's refusals stay FastAPI's: 422 with the parameter named, the ErrorResponse shape
    for query in ("?limit=many", "?limit=", "?unread=maybe", "?limit=1e3"):
        refused = get(query)
        assert refused.status == 422, (query, refused.status, refused.body)
        assert refused.json()["error"]["code"] == "22023" and refused.json()["detail"].startswith("query.")
    # SQL's refusals and the credentials rule the same as before
    assert get("?limit=0").status == 400
    assert server.request("GET", path + "?limit=2").status == 401
    assert server.request("GET", path + "?limit=2", token="not-the-token").status in (401, 403, 404)


def test_a_long_poll_with_its_message_there_answers_at_once(server, deliver):
    address, token = _box(server, deliver, ["Your code", "Other"])
    started = time.monotonic()
    found = server.request("GET", f"/api/v1/mailboxes/{address}/wait?subject=Your%25&timeout=20", token=token)
    assert found.status == 200 and found.json()["subject"] == "Your code", found.body
    assert time.monotonic() - started < 5
    # a float the fast path does not take (an exponent) goes the FastAPI way, with the same answer
    again = server.request("GET", f"/api/v1/mailboxes/{address}/wait?subject=Your%25&timeout=2e1", token=token)
    assert again.status == 200 and again.body == found.body
    # timeout=0: the first look is the last, and nothing matching is 408 MR212 at once
    late = server.request("GET", f"/api/v1/mailboxes/{address}/wait?subject=Never%25&timeout=0", token=token)
    assert (late.status, late.error_code) == (408, "MR212")
    refused = server.request("GET", f"/api/v1/mailboxes/{address}/wait?timeout=soon", token=token)
    assert refused.status == 422 and "timeout" in refused.json()["detail"]
    assert server.request("GET", f"/api/v1/mailboxes/{address}/wait?timeout=1").status == 401
    unknown = request("GET", f"{server.base}/api/v1/mailboxes/nobody@mailroom.test/wait?timeout=1", token=token)
    assert unknown.status in (401, 403, 404), unknown.body
