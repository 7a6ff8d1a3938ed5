"""Search (issue 35, item 2): `mailroom inbox search` and GET /api/v1/mailboxes/{address}/search?q= are the
same rule (mailroom.search_messages / _search_mailboxes, sql/27_search.sql), so they give the same answers,
for each kind of term: prefixes, substrings, addresses by their parts, qualifiers, phrases, -negation, or;
the same refusals (HTTP 400 and the MR code, the CLI one line and exit 2); every match up to the limit."""

from __future__ import annotations

import json
import signal
import time
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
    for query, code in (("before:2026-02-30", "MR227"), ("ab " * 17, "MR226"), ("x" * 1001, "MR225"),
                        (" - ", "MR246")):
        resp = _api(server, address, token, query)
        assert (resp.status, resp.error_code) == (400, code), query
        if code not in ("MR227", "MR246"):
            continue  # the CLI: a parser refusal and a query without a word
        run = _cli(cli, address, token, query)
        assert run.returncode == 2 and run.stdout == "", (query, run.stderr)
        assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr, run.stderr
    # the count is the matches: every one, up to the limit (the newest first among equals)
    assert [m["id"] for m in _api(server, address, token, "order").json()["messages"]] == ids[::-1]
    assert [m["id"] for m in _api(server, address, token, "order", limit=2).json()["messages"]] == ids[:0:-1]
    run = _cli(cli, address, token, "order", limit=2)
    assert [json.loads(line)["message_id"] for line in run.stdout.splitlines()] == ids[:0:-1]


def test_the_maintenance_worker_rebuilds_vectors_of_an_older_definition(server, deliver, cli_popen, db_url):
    """After an upgrade that changes the vector, stored vectors are of the old definition: searches
    complete them on the fly (right answers at once), `mailroom maintain --every` rebuilds them."""
    box = server.request("POST", "/api/v1/mailboxes").json()
    address, token = box["address"], box["session_token"]
    ids = [deliver(address, f"Statement {n}", "your monthly balance", from_header="Bank <alerts@bank.example.net>")
           for n in range(2)]
    with psycopg.connect(db_url, autocommit=True) as c:
        deadline = time.monotonic() + 10  # the server's LISTEN hub fills them first (index_messages)
        while time.monotonic() < deadline and c.execute(
                "SELECT count(*) FROM mailroom.messages WHERE id = ANY(%s) AND search_version = 2", (ids,)).fetchone()[0] < 2:
            time.sleep(0.1)
        # then they are as the first definition left them (here: the subject only)
        c.execute("UPDATE mailroom.messages SET search_vector = setweight(to_tsvector('simple', subject), 'A'),"
                  " search_version = NULL WHERE id = ANY(%s)", (ids,))
    assert sorted(m["id"] for m in _api(server, address, token, "example.net").json()["messages"]) == ids
    worker = cli_popen("maintain", "--every", "1h")  # runs at its start, then hourly
    try:
        deadline, versions = time.monotonic() + 30, []
        while versions != [2, 2] and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.2)
            with psycopg.connect(db_url, autocommit=True) as c:
                versions = [r[0] for r in c.execute(
                    "SELECT search_version FROM mailroom.messages WHERE id = ANY(%s) ORDER BY id", (ids,))]
        assert versions == [2, 2], "the maintenance worker rebuilt the old vectors"
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=10)
    assert worker.returncode == 0, stderr
    assert b"search vectors rebuilt" in stderr
    # the rebuilt vectors hold the text again
    assert sorted(m["id"] for m in _api(server, address, token, "balance from:bank").json()["messages"]) == ids
