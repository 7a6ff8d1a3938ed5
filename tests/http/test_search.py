"""Search (issue 35, item 2): `mailroom inbox search` and GET /api/v1/mailboxes/{address}/search?q= are the
same rule (mailroom.search_messages / _search_mailbox, sql/27_search.sql), so they give the same answers,
for each kind of term: prefixes, substrings, addresses by their parts, qualifiers, phrases, -negation, or;
the same refusals (HTTP 400 and the MR code, the CLI one line and exit 2); every match up to the limit."""

from __future__ import annotations

import json
from urllib.parse import quote

import psycopg

ATTACHMENT = '[{"filename": "invoice.pdf", "content_type": "application/pdf", "size": 3}]'


def _api(server, address: str, token: str, query: str, limit: int = 50):
    return server.request("GET", f"/api/v1/mailboxes/{address}/search?q={quote(query)}&limit={limit}", token=token)


def _cli(cli, address: str, token: str, query: str, limit: int = 50):
    # options first, then `--`: a query may start with - (a negated term)
    return cli("inbox", "search", "--token", token, "--json", "--limit", str(limit), "--", address, query)


def test_cli_and_api_give_the_same_answers(server, deliver, cli, db_url):
    box = server.request("POST", "/api/v1/mailboxes").json()
    address, token = box["address"], box["session_token"]
    welcome = deliver(address, "Welcome to Example", "Activate your account with code 48213, and enjoy a pineapple")
    invoice = deliver(address, "Your invoice", None, html="<p>Invoice <b>number</b> 7 for your account</p>",
                      from_header="Shop <billing@shop.example.org>", attachments=ATTACHMENT)
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("UPDATE mailroom.messages SET is_read = true WHERE id = %s", (welcome,))
    both = sorted([welcome, invoice])
    # one query of each kind (each a CLI process: about a second each); pgTAP has them all
    expected = {
        "pine*": [welcome], "voic": [invoice], "example.org": both, "from:billing subject:invoice": [invoice],
        f"to:{address}": both, "is:unread": [invoice], "-has:attachment": [welcome],
        '"invoice number"': [invoice], "account -invoice": [welcome], "pineapple or invoice": both,
        "after:2000-01-01 tag:x": [],
    }
    got = {}
    for query, want in expected.items():
        resp = _api(server, address, token, query)
        assert resp.status == 200, (query, resp.body)
        api = [m["id"] for m in resp.json()["messages"]]
        run = _cli(cli, address, token, query)
        assert run.returncode == 0, (query, run.stderr)
        cli_ids = [json.loads(line)["message_id"] for line in run.stdout.splitlines()]
        assert api == cli_ids, query  # the same messages in the same order
        got[query] = sorted(api) if len(want) > 1 else api
    assert got == expected


def test_the_same_refusals_and_every_match_up_to_the_limit(server, deliver, cli):
    box = server.request("POST", "/api/v1/mailboxes").json()
    address, token = box["address"], box["session_token"]
    ids = [deliver(address, f"Receipt {n}", "thanks for your order") for n in range(3)]
    for query, code in (("is:new", "MR227"), ("before:2026-02-30", "MR227"), ("ab " * 17, "MR226"),
                        ("x" * 1001, "MR225"), (" - ", "MR246")):
        resp = _api(server, address, token, query)
        assert (resp.status, resp.error_code) == (400, code), query
        run = _cli(cli, address, token, query)
        assert run.returncode == 2 and run.stdout == "", (query, run.stderr)
        assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr, run.stderr
    # the count is the matches: every one, up to the limit (the newest first among equals)
    assert [m["id"] for m in _api(server, address, token, "order").json()["messages"]] == ids[::-1]
    assert [m["id"] for m in _api(server, address, token, "order", limit=2).json()["messages"]] == ids[:0:-1]
    run = _cli(cli, address, token, "order", limit=2)
    assert [json.loads(line)["message_id"] for line in run.stdout.splitlines()] == ids[:0:-1]
