"""Paging over REST (issue 44 item 4): `?before_id=` (keyset, the last id of the previous page) beside
`?limit=&offset=` on GET …/messages, which still answers a bare JSON array (the original service's client
pages with limit/offset), on …/search (best first; a cursor that is gone: 409, MR218), and `?q=` on
GET /api/v1/messages (the owner's mail searched, newest first)."""

from __future__ import annotations

import json
from urllib.parse import quote


def _ids(resp) -> list[int]:
    assert resp.status == 200, resp.body
    body = resp.json()
    return [m["id"] for m in (body["messages"] if isinstance(body, dict) else body)]


def test_before_id_pages_the_list_and_the_search_beside_limit_and_offset(server, deliver):
    box = server.request("POST", "/api/v1/mailboxes").json()
    address, token = box["address"], box["session_token"]
    ids = [deliver(address, f"Order {n}", "thanks for your order") for n in range(5)]
    newest = ids[::-1]
    url = f"/api/v1/mailboxes/{address}/messages"
    first = server.request("GET", f"{url}?limit=2", token=token)
    assert isinstance(first.json(), list) and _ids(first) == newest[:2]  # a bare JSON array, newest first
    assert _ids(server.request("GET", f"{url}?limit=2&before_id={newest[1]}", token=token)) == newest[2:4]
    assert _ids(server.request("GET", f"{url}?limit=2&offset=2", token=token)) == newest[2:4]
    assert _ids(server.request("GET", f"{url}?before_id={newest[3]}", token=token)) == newest[4:]

    search = f"/api/v1/mailboxes/{address}/search?q={quote('order')}&limit=2"
    page1 = _ids(server.request("GET", search, token=token))
    page2 = _ids(server.request("GET", f"{search}&before_id={page1[-1]}", token=token))
    page3 = _ids(server.request("GET", f"{search}&before_id={page2[-1]}", token=token))
    assert page1 + page2 + page3 == newest  # equal ranks: newest first by id, every match once
    assert server.request("DELETE", f"/api/v1/mailboxes/{address}/messages/{page1[-1]}", token=token).status == 200
    gone = server.request("GET", f"{search}&before_id={page1[-1]}", token=token)
    assert gone.status == 409 and gone.json()["error"]["code"] == "MR218"
    # the page, given that gone cursor, goes back to the first page of the results (a 303 the client follows)
    page = server.request("GET", f"/inbox/{address}?q=order&before_id={page1[-1]}", token=token)
    assert page.status == 200 and b'id="matches"' in page.body and b"a later page" not in page.body


def test_all_mail_searched_with_q(server, deliver, cli):
    key = json.loads(cli("apikey", "create", "paging-api", "--json").stdout)["api_key"]
    boxes = [server.request("POST", "/api/v1/mailboxes", token=key).json() for _ in range(2)]
    found = [deliver(b["address"], "Your invoice", "number 7") for b in boxes]
    deliver(boxes[0]["address"], "Welcome", "hello")
    got = server.request("GET", "/api/v1/messages?q=invoice&limit=1", token=key)
    assert _ids(got) == [found[1]] and got.json()[0]["mailbox"] == boxes[1]["address"]
    assert _ids(server.request("GET", f"/api/v1/messages?q=invoice&before_id={found[1]}", token=key)) == [found[0]]
    assert server.request("GET", "/api/v1/messages?q=invoice&tag=x", token=key).status == 400
