"""The inbox page's count says what it counts (issue 35, item 2): the inbox's messages in the header,
the matches of a search beside the query. Before, a search that found 1 of 2 messages said "1 message(s)"."""

from __future__ import annotations

import http.client
import re
from urllib.parse import quote, urlsplit


def test_search_view_counts_the_inbox_and_its_matches_apart(server, deliver):
    box = server.request("POST", "/api/v1/mailboxes").json()
    deliver(box["address"], "Your invoice 42", "pay it")
    deliver(box["address"], "Welcome", "hello there")
    host = urlsplit(server.base)
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=10)
    conn.request("GET", f"/inbox/{box['address']}?token={box['session_token']}", headers={"Sec-Fetch-Site": "none"})
    first = conn.getresponse()
    first.read()
    jar = first.headers["set-cookie"].split(";", 1)[0]
    conn.request("GET", f"/inbox/{quote(box['address'])}?q=invoice", headers={"Cookie": jar})
    page = conn.getresponse().read().decode()
    assert re.search(r'<span id="count">2</span> message\(s\)', page), page
    assert re.search(r'id="matches">1 matching message\(s\)', page), page
