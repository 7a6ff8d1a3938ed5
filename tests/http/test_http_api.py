"""The REST API over real HTTP: `mailroom http serve` as mr_http against a real PostgreSQL.

The original system's paths (POST /api/v1/mailboxes?ttl_minutes=…, DELETE /api/v1/mailboxes/{address},
a clear 404 for an expired inbox) and shapes (the REST v1 contract: an API key's inbox list and a
message list are JSON arrays, from_address, body_text, body_html, `detail` in every error; each answer
has exactly the keys of its model in mailroom.http.models, the OpenAPI document names those models),
credentials (session token, API keys made by `mailroom apikey`, an API key reading its owner's mcp inboxes),
messages, raw source and attachments, links and codes, search, the long poll, the event stream,
the page's cookie and CSRF rule, the creation rate limit, what the logs never carry, and the hot reads'
fast path answering as their FastAPI routes do.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import threading
import time
from email.message import EmailMessage

import psycopg
from http_support import EventStream, request
from pydantic import BaseModel

from mailroom.http import models
from mailroom.inboxes.mime import parse_message


def keys_of(model: type[BaseModel]) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


def assert_shape(doc: dict, model: type[BaseModel]) -> None:
    """The answer has exactly its model's keys (a key added in SQL needs its field, and the reverse),
    and validates against it."""
    assert set(doc) == keys_of(model), (set(doc) ^ keys_of(model), model.__name__)
    model.model_validate(doc)


def _create(server, **query) -> dict:
    path = "/api/v1/mailboxes" + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")
    resp = server.request("POST", path)
    assert resp.status == 201, resp.body
    return resp.json()


def test_the_original_paths_create_read_delete_then_404(server):
    resp = server.request("POST", "/api/v1/mailboxes?ttl_minutes=1")
    assert resp.status == 201
    box = resp.json()
    created = dt.datetime.fromisoformat(box["created_at"])
    assert dt.datetime.fromisoformat(box["expires_at"]) - created == dt.timedelta(minutes=1)
    assert box["plan"] == "free" and box["owner_type"] == "anonymous" and len(box["session_token"]) == 32
    assert_shape(box, models.CreatedMailbox)
    assert resp.headers["location"].endswith(box["address"].replace("@", "%40"))
    path = f"/api/v1/mailboxes/{box['address']}"
    got = server.request("GET", path, token=box["session_token"])
    assert got.status == 200 and got.json()["address"] == box["address"] and "session_token" not in got.json()
    assert_shape(got.json(), models.Mailbox)
    deleted = server.request("DELETE", path, token=box["session_token"])
    assert (deleted.status, deleted.json()) == (200, {"deleted": True})
    gone = server.request("GET", path + "/messages", token=box["session_token"])
    assert gone.status == 404 and gone.headers["content-type"] == "application/json"
    assert gone.error_code == "MR206"
    # FastAPI's `detail` (what the original service's clients read) beside mailroom's code and kind
    assert_shape(gone.json(), models.ErrorResponse)
    assert gone.json()["detail"] == gone.json()["error"]["message"] and "deleted" in gone.json()["detail"]


def test_an_expired_inbox_is_a_clear_404(server, conn):
    box = _create(server, ttl_minutes=1)
    conn.execute("UPDATE mailroom.mailboxes SET expires_at = now() - interval '1 second' WHERE address = %s",
                 (box["address"],))
    resp = server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages", token=box["session_token"])
    assert resp.status == 404
    assert resp.json()["error"]["code"] == "MR205" and "expired" in resp.json()["error"]["message"]


def test_credentials_and_bad_input(server):
    box = _create(server)
    path = f"/api/v1/mailboxes/{box['address']}"
    none = server.request("GET", path)
    assert (none.status, none.error_code) == (401, "MR240") and none.headers["www-authenticate"].startswith("Bearer")
    assert server.request("GET", path, token="not-the-token").error_code == "MR204"
    assert server.request("GET", path, token="not-the-token").status == 403
    assert server.request("GET", "/api/v1/mailboxes/nobody@mailroom.test", token="x").status == 404
    plan = server.request("POST", "/api/v1/mailboxes?plan=pro")
    assert (plan.status, plan.error_code) == (403, "MR242")
    ttl = server.request("POST", "/api/v1/mailboxes", body={"ttl_minutes": -5})
    assert (ttl.status, ttl.error_code) == (400, "MR202")
    assert server.request("POST", "/api/v1/mailboxes", token="a-session-token").status == 401
    assert server.request("GET", path + "/messages/abc", token=box["session_token"]).status == 400
    assert server.request("GET", path + "/messages?limit=0", token=box["session_token"]).status == 400
    # the router's own refusals answer the same ErrorResponse
    for method, route, status in (("GET", "/api/v1/nowhere", 404), ("PUT", "/api/v1/mailboxes", 405)):
        refused = server.request(method, route)
        assert refused.status == status, (route, refused.body)
        assert_shape(refused.json(), models.ErrorResponse)
        assert refused.json()["error"]["code"] == "" and refused.json()["detail"] in ("Not Found", "Method Not Allowed")
    wrong_type = server.request("GET", path + "/messages?limit=many", token=box["session_token"])
    assert wrong_type.status == 422 and "limit" in wrong_type.json()["detail"]
    assert_shape(wrong_type.json(), models.ErrorResponse)


def _mime_message() -> bytes:
    msg = EmailMessage()
    msg["From"] = "App <app@example.org>"
    msg["To"] = "someone"
    msg["Subject"] = "Activate your account"
    msg.set_content("Welcome! Activate: https://app.example.org/activate?t=abc123\nYour code: 48213\n")
    msg.add_alternative('<p>Welcome <a href="https://app.example.org/activate?t=abc123">activate</a></p>'
                        "<script>document.title='ran'</script>", subtype="html")
    msg.add_attachment(b"\x00\x01binary payload\xff", maintype="application", subtype="octet-stream",
                       filename="data.bin")
    return msg.as_bytes()


def test_messages_read_raw_attachment_link_code_delete(server, deliver):
    box = _create(server)
    token, base = box["session_token"], f"/api/v1/mailboxes/{box['address']}"
    raw = _mime_message()
    parsed = parse_message(raw)
    import json

    first = deliver(box["address"], parsed.subject, parsed.text_body, parsed.html_body, raw=raw,
                    attachments=json.dumps(parsed.attachments))
    second = deliver(box["address"], "Second", "no link here")
    listed = server.request("GET", base + "/messages", token=token).json()
    assert isinstance(listed, list)  # the original service's shape: a JSON array
    assert [m["id"] for m in listed] == [second, first]  # newest first
    for summary in listed:
        assert_shape(summary, models.MessageSummary)
    assert (listed[1]["from_address"], listed[1]["from"], listed[1]["to_address"]) == (
        "app@example.org", "App <app@example.org>", box["address"])
    assert (listed[1]["has_attachments"], listed[1]["attachment_count"], listed[0]["has_attachments"]) == (True, 1, False)
    assert [m["is_read"] for m in listed] == [False, False]
    page2 = server.request("GET", base + "/messages?limit=1&offset=1", token=token).json()
    assert [m["id"] for m in page2] == [first]

    message = server.request("GET", f"{base}/messages/{first}", token=token).json()
    assert_shape(message, models.Message)
    assert message["subject"] == "Activate your account" and "Welcome!" in message["body_text"]
    assert message["body_html"].startswith("<p>Welcome") and message["from_address"] == "app@example.org"
    assert message["link"] == "https://app.example.org/activate?t=abc123" and message["code"] == "48213"
    assert ["Subject", "Activate your account"] in message["headers"]
    assert message["attachments"][0]["filename"] == "data.bin" and message["attachments"][0]["index"] == 0
    for attachment in message["attachments"]:
        assert_shape(attachment, models.Attachment)
    assert message["is_read"] is True
    # reading marked it read: the list says so
    assert [m["is_read"] for m in server.request("GET", base + "/messages", token=token).json()] == [False, True]

    got_raw = server.request("GET", f"{base}/messages/{first}/raw", token=token)
    assert got_raw.status == 200 and got_raw.body == raw
    attachment = server.request("GET", f"{base}/messages/{first}/attachments/0", token=token)
    assert attachment.body == b"\x00\x01binary payload\xff"
    assert attachment.headers["content-disposition"].startswith("attachment;")
    assert server.request("GET", f"{base}/messages/{first}/attachments/1", token=token).error_code == "MR250"

    assert server.request("GET", f"{base}/messages/{first}/links?like=%25activate%25", token=token).json() == {
        "link": "https://app.example.org/activate?t=abc123"}
    assert server.request("GET", f"{base}/messages/{first}/code", token=token).json() == {"code": "48213"}
    nolink = server.request("GET", f"{base}/messages/{second}/links", token=token)
    assert (nolink.status, nolink.error_code) == (404, "MR215")

    frame = server.request("GET", f"{base}/messages/{first}/html", token=token)
    csp = frame.headers["content-security-policy"]
    assert csp.startswith("sandbox") and "default-src 'none'" in csp and "script-src" not in csp
    assert "img-src data: cid:;" in csp
    assert "https:" in server.request("GET", f"{base}/messages/{first}/html?images=1", token=token).headers[
        "content-security-policy"]

    assert server.request("DELETE", f"{base}/messages/{second}", token=token).json() == {"deleted": True}
    assert server.request("GET", f"{base}/messages/{second}", token=token).error_code == "MR209"
    assert server.request("GET", base, token=token).json()["message_count"] == 1


def test_search(server, deliver):
    box = _create(server)
    token, base = box["session_token"], f"/api/v1/mailboxes/{box['address']}"
    welcome = deliver(box["address"], "Welcome aboard", "your code is 48213")
    deliver(box["address"], "Invoice 7", "total due", from_header="Shop <billing@shop.example>")
    found = server.request("GET", base + "/search?q=48213", token=token).json()
    assert [m["id"] for m in found["messages"]] == [welcome]
    assert set(found) == keys_of(models.SearchResult)
    assert_shape(found["messages"][0], models.SearchHit)
    assert [m["subject"] for m in server.request("GET", base + "/search?q=shop", token=token).json()["messages"]] == [
        "Invoice 7"]
    bad = server.request("GET", base + "/search?q=-", token=token)
    assert (bad.status, bad.error_code) == (400, "MR246")


def test_api_keys_owner_inboxes_and_revocation(server, cli):
    made = cli("apikey", "create", "team-1", "--label", "ci", "--json")
    assert made.returncode == 0, made.stderr
    key = __import__("json").loads(made.stdout)["api_key"]
    other = __import__("json").loads(cli("apikey", "create", "team-2", "--json").stdout)["api_key"]
    assert key.startswith("mrk_")
    resp = server.request("POST", "/api/v1/mailboxes?plan=pro", token=key)
    assert resp.status == 201
    box = resp.json()
    assert (box["plan"], box["owner_type"], box["session_token"]) == ("pro", "api", None)
    path = f"/api/v1/mailboxes/{box['address']}"
    assert server.request("GET", path, token=key).status == 200
    assert server.request("GET", path, headers={"X-API-Key": key}).status == 200
    assert server.request("GET", path, token=other).status == 403
    listed = cli("apikey", "list", "--owner", "team-1")
    assert key not in listed.stdout and f"hint={key[-4:]}" in listed.stdout
    key_id = re.search(r"key_id=(\d+)", listed.stdout).group(1)
    assert cli("apikey", "revoke", key_id).stdout.strip() == "revoked"
    revoked = server.request("GET", path, token=key)
    assert (revoked.status, revoked.error_code) == (401, "MR241")


def test_creation_rate_limit(server, conn):
    conn.execute("DELETE FROM mailroom.http_rate_limits")
    conn.execute("SELECT mailroom.set_setting('http.create_limit', '2')")
    try:
        assert [server.request("POST", "/api/v1/mailboxes").status for _ in range(2)] == [201, 201]
        refused = server.request("POST", "/api/v1/mailboxes")
        assert (refused.status, refused.error_code) == (429, "MR243")
        assert refused.headers["retry-after"].isdigit() and 1 <= int(refused.headers["retry-after"]) <= 60
    finally:
        conn.execute("SELECT mailroom.set_setting('http.create_limit', '1000000')")


def test_long_poll_returns_when_the_mail_arrives(server, deliver):
    box = _create(server)
    url = f"{server.base}/api/v1/mailboxes/{box['address']}/wait?subject=Activate%25&timeout=20"
    result: list = []
    waiter = threading.Thread(target=lambda: result.append(request("GET", url, token=box["session_token"], timeout=30)))
    waiter.start()
    deliver(box["address"], "Something else", "x")
    deliver(box["address"], "Activate your account", "https://example.org/a")
    waiter.join(timeout=25)
    assert result and result[0].status == 200 and result[0].json()["subject"] == "Activate your account"
    assert_shape(result[0].json(), models.MessageSummary)
    late = server.request("GET", f"/api/v1/mailboxes/{box['address']}/wait?subject=Never%25&timeout=0.3",
                          token=box["session_token"])
    assert (late.status, late.error_code) == (408, "MR212")


def test_event_stream_sends_each_new_message(server, deliver, conn):
    box = _create(server)
    stream = EventStream(f"{server.base}/api/v1/mailboxes/{box['address']}/events", box["session_token"])
    try:
        opened = stream.next_event("mailbox")
        assert opened["address"] == box["address"]
        assert_shape(opened, models.Mailbox)
        first = deliver(box["address"], "First", "one")
        got = stream.next_event("message", timeout=5)
        assert (got["id"], got["subject"]) == (first, "First")
        assert_shape(got, models.MessageSummary)  # the list's shape
        second = deliver(box["address"].replace("@", "+live@"), "Second", "two")  # plus-addressed: tagged
        got = stream.next_event("message", timeout=5)
        assert (got["id"], got["tags"]) == (second, ["live"])
    finally:
        stream.close()
    # the LISTEN hub filled their search vectors after delivery
    deadline = __import__("time").monotonic() + 5
    while __import__("time").monotonic() < deadline:
        filled = conn.execute("SELECT count(*) FROM mailroom.messages WHERE id IN (%s, %s) AND search_vector IS NOT NULL",
                              (first, second)).fetchone()[0]
        if filled == 2:
            break
    assert filled == 2


def test_page_cookie_and_csrf(server):
    box = _create(server)
    address, token = box["address"], box["session_token"]
    opened = server.request("GET", f"/inbox/{address}?token={token}", headers={"Sec-Fetch-Site": "none"})
    # urllib follows the 303: the page itself, without the token in its address
    assert opened.status == 401  # urllib keeps no cookie: the login form
    import http.client
    from urllib.parse import urlsplit

    host = urlsplit(server.base)
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=10)
    # the address typed or pasted (what a browser says with Sec-Fetch-Site: none)
    conn.request("GET", f"/inbox/{address}?token={token}", headers={"Sec-Fetch-Site": "none"})
    first = conn.getresponse()
    first.read()
    cookie = first.headers["set-cookie"]
    assert first.status == 303 and first.headers["location"] == f"/inbox/{address.replace('@', '%40')}"
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and token in cookie
    jar = cookie.split(";", 1)[0]
    conn.request("GET", f"/inbox/{address}", headers={"Cookie": jar})
    page = conn.getresponse()
    html = page.read().decode()
    assert page.status == 200 and address in html and token not in html
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    csrf = re.search(r'name="csrf-token" content="([0-9a-f]+)"', html).group(1)
    assert csrf == hashlib.sha256(b"mailroom-csrf:" + token.encode()).hexdigest()[:32]
    conn.request("DELETE", f"/api/v1/mailboxes/{address}", headers={"Cookie": jar})
    forged = conn.getresponse()
    assert forged.status == 403 and b"X-CSRF-Token" in forged.read()
    # so do the changes of issue 35 (clear, extend, delete selected, PATCH)
    for method, path, body in (("DELETE", "/messages", None), ("POST", "/extend", b'{"ttl_seconds": 60}'),
                               ("POST", "/messages/delete", b'{"ids": [1]}'), ("PATCH", "/messages/1", b'{"is_read": "x"}')):
        conn.request(method, f"/api/v1/mailboxes/{address}{path}", body=body, headers={"Cookie": jar})
        refused = conn.getresponse()
        assert (refused.status, json.loads(refused.read())["error"]["code"]) == (403, "42501"), path
    conn.request("DELETE", f"/api/v1/mailboxes/{address}/messages", headers={"Cookie": jar, "X-CSRF-Token": csrf})
    cleared = conn.getresponse()
    assert (cleared.status, cleared.read()) == (200, b'{"deleted": 0}')
    conn.request("DELETE", f"/api/v1/mailboxes/{address}", headers={"Cookie": jar, "X-CSRF-Token": csrf})
    real = conn.getresponse()
    assert real.status == 200 and real.read() == b'{"deleted":true}'


def _schema_of(doc: dict, path: str, method: str, status: str) -> dict:
    return doc["paths"][path][method]["responses"][status]["content"]["application/json"]["schema"]


def test_openapi_document_and_cors_off(server):
    doc = server.request("GET", "/openapi.json").json()
    for path in ("/api/v1/mailboxes", "/api/v1/mailboxes/{address}", "/api/v1/mailboxes/{address}/messages",
                 "/api/v1/mailboxes/{address}/messages/{message_id}/raw", "/api/v1/mailboxes/{address}/wait",
                 "/api/v1/mailboxes/{address}/events", "/api/v1/mailboxes/{address}/search", "/hooks/ses"):
        assert path in doc["paths"], path
    # every JSON route declares its model: the document carries the REST v1 shapes
    ref = "#/components/schemas/"
    listed = _schema_of(doc, "/api/v1/mailboxes", "get", "200")
    assert (listed["type"], listed["items"]) == ("array", {"$ref": ref + "Mailbox"})
    assert _schema_of(doc, "/api/v1/mailboxes", "post", "201") == {"$ref": ref + "CreatedMailbox"}
    assert _schema_of(doc, "/api/v1/mailboxes/{address}/messages", "get", "200")["items"] == {"$ref": ref + "MessageSummary"}
    assert _schema_of(doc, "/api/v1/mailboxes/{address}/messages/{message_id}", "get", "200") == {"$ref": ref + "Message"}
    assert _schema_of(doc, "/api/v1/mailboxes/{address}/wait", "get", "200") == {"$ref": ref + "MessageSummary"}
    assert _schema_of(doc, "/api/v1/mailboxes/{address}/messages", "get", "404") == {"$ref": ref + "ErrorResponse"}
    # a parameter of the wrong type answers our ErrorResponse, and the document says so (not FastAPI's default)
    assert _schema_of(doc, "/api/v1/mailboxes/{address}/messages", "get", "422") == {"$ref": ref + "ErrorResponse"}
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    for name, model in (("Mailbox", models.Mailbox), ("MessageSummary", models.MessageSummary),
                        ("Message", models.Message), ("ErrorResponse", models.ErrorResponse)):
        assert set(schemas[name]["properties"]) == keys_of(model), name
    assert {"body_text", "body_html", "attachments"} <= set(schemas["Message"]["required"])
    assert "text/event-stream" in doc["paths"]["/api/v1/mailboxes/{address}/events"]["get"]["responses"]["200"]["content"]
    assert server.request("GET", "/docs").status == 200
    preflight = server.request("OPTIONS", "/api/v1/mailboxes", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in {k.lower() for k in preflight.headers}


def test_logs_carry_no_address_token_or_key(start_server, cli, deliver):
    server = start_server("--access-log")
    key = __import__("json").loads(cli("apikey", "create", "team-9", "--json").stdout)["api_key"]
    box = _create(server)
    owned = server.request("POST", "/api/v1/mailboxes", token=key).json()
    deliver(box["address"], "Secret subject", "x")
    for path in ("", "/messages", "/search?q=secret", "/wait?timeout=0"):
        server.request("GET", f"/api/v1/mailboxes/{box['address']}{path}", token=box["session_token"])
    server.request("GET", f"/api/v1/mailboxes/{owned['address']}", token=key)
    server.request("GET", f"/api/v1/mailboxes/{box['address']}", token="wrong-token")
    log = server.log()
    assert "GET /api/v1/mailboxes/{address}/messages 200" in log
    for secret in (box["address"], box["session_token"], owned["address"], key, "Secret subject", "wrong-token"):
        assert secret not in log


def test_startup_needs_a_database(cli):
    bad = cli("http", "serve", "--port", "0", "--workers", "0")
    assert bad.returncode == 2 and "--workers must be at least 1" in bad.stderr and "Traceback" not in bad.stderr


def test_database_errors_are_503_not_tracebacks(server, pg, db_url):
    box = _create(server)
    with psycopg.connect(pg.url("postgres"), autocommit=True) as admin:
        dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'mailroom-http'"
                      " AND datname = %s", (dbname,))
        deadline = time.monotonic() + 10
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'mailroom-http'"
                            " AND datname = %s", (dbname,)).fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.05)
    # a pooled connection the server ended while idle is found before anything is sent, and replaced
    # (a statement terminated while it runs is answered 503 and never run again: test_http_edges.py)
    assert server.request("GET", f"/api/v1/mailboxes/{box['address']}", token=box["session_token"]).status == 200
    assert "Traceback" not in server.log()


def test_an_api_keys_inbox_list_and_its_mcp_inboxes(server, cli):
    """GET /api/v1/mailboxes: the key owner's open inboxes of owner types api and mcp, a JSON array,
    newest first; an mcp inbox (made by the CLI here, as by an agent over MCP) is read over REST with
    the owner's key (issue 33: `_http_box` matched api only)."""
    key = __import__("json").loads(cli("apikey", "create", "team-list", "--json").stdout)["api_key"]
    other = __import__("json").loads(cli("apikey", "create", "team-other", "--json").stdout)["api_key"]
    made = cli("inbox", "create", "--owner-type", "mcp", "--owner-id", "team-list", "--json")
    assert made.returncode == 0, made.stderr
    mcp_address = __import__("json").loads(made.stdout)["address"]
    api_box = server.request("POST", "/api/v1/mailboxes", token=key).json()
    server.request("POST", "/api/v1/mailboxes", token=other)
    anonymous = _create(server)

    listed = server.request("GET", "/api/v1/mailboxes", token=key)
    assert listed.status == 200 and isinstance(listed.json(), list)
    assert [(b["address"], b["owner_type"]) for b in listed.json()] == [(api_box["address"], "api"), (mcp_address, "mcp")]
    for box in listed.json():
        assert_shape(box, models.Mailbox)
    assert [b["address"] for b in server.request("GET", "/api/v1/mailboxes?limit=1&offset=1", token=key).json()] == [
        mcp_address]

    mcp_path = f"/api/v1/mailboxes/{mcp_address}"
    assert server.request("GET", mcp_path, token=key).json()["owner_type"] == "mcp"
    assert server.request("GET", mcp_path + "/messages", token=key).json() == []
    assert server.request("GET", mcp_path, token=other).error_code == "MR204"
    assert server.request("DELETE", mcp_path, token=key).json() == {"deleted": True}
    assert [b["address"] for b in server.request("GET", "/api/v1/mailboxes", token=key).json()] == [api_box["address"]]

    none = server.request("GET", "/api/v1/mailboxes")
    assert (none.status, none.error_code) == (401, "MR240") and none.json()["detail"].startswith("credentials required")
    # a session token opens one inbox: it lists nothing (refused as an unknown key)
    token = server.request("GET", "/api/v1/mailboxes", token=anonymous["session_token"])
    assert (token.status, token.error_code) == (401, "MR241")
    assert server.request("GET", "/api/v1/mailboxes?limit=0", token=key).status == 400


def test_marks_tags_deletes_extend_and_all_mail(server, cli, deliver):
    """Issue 35 item 1 over HTTP: PATCH (read/unread, tags), ?tag= and ?unread=, tag: and is: in search,
    tags from plus-addressing, delete selected and all, extend within the plan's max TTL, and an API
    key owner's all-mail list (keyset by id, each with its inbox; 403 for a session token). Each
    answer has exactly its model's keys."""
    key = __import__("json").loads(cli("apikey", "create", "team-marks", "--json").stdout)["api_key"]
    box = server.request("POST", "/api/v1/mailboxes?plan=pro", token=key).json()
    other = server.request("POST", "/api/v1/mailboxes", token=key).json()
    anonymous = _create(server)
    path = f"/api/v1/mailboxes/{box['address']}"
    assert_shape(box, models.CreatedMailbox)
    assert box["max_ttl_seconds"] == 24 * 3600
    first = deliver(box["address"], "First", "one")
    tagged = deliver(box["address"].replace("@", "+Invoices@"), "Second", "two")
    elsewhere = deliver(other["address"], "Third", "three")
    deliver(anonymous["address"], "Not the key's", "x")

    listed = server.request("GET", path + "/messages", token=key).json()
    for m in listed:
        assert_shape(m, models.MessageSummary)
    assert {m["id"]: m["tags"] for m in listed} == {first: [], tagged: ["invoices"]}
    assert [m["id"] for m in server.request("GET", path + "/messages?tag=invoices", token=key).json()] == [tagged]

    patched = server.request("PATCH", f"{path}/messages/{first}", token=key, body={"is_read": True, "tags": ["B", "a"]})
    assert patched.status == 200, patched.body
    assert_shape(patched.json(), models.MessageSummary)
    assert (patched.json()["is_read"], patched.json()["tags"]) == (True, ["a", "b"])
    untouched = server.request("PATCH", f"{path}/messages/{first}", token=key, body={"is_read": False})
    assert (untouched.json()["is_read"], untouched.json()["tags"]) == (False, ["a", "b"])
    server.request("PATCH", f"{path}/messages/{first}", token=key, body={"is_read": True})
    assert [m["id"] for m in server.request("GET", path + "/messages?unread=true", token=key).json()] == [tagged]
    assert [m["id"] for m in server.request("GET", path + "/messages?unread=false", token=key).json()] == [first]
    found = server.request("GET", path + "/search?q=tag:a%20is:read", token=key).json()["messages"]
    assert [m["id"] for m in found] == [first]
    assert [m["id"] for m in server.request("GET", path + "/search?q=is:unread", token=key).json()["messages"]] == [tagged]
    read = server.request("GET", f"{path}/messages/{tagged}", token=key).json()
    assert_shape(read, models.Message)
    assert read["tags"] == ["invoices"]

    bad = server.request("PATCH", f"{path}/messages/{first}", token=key, body={"tags": ["no spaces"]})
    assert (bad.status, bad.error_code) == (400, "MR260")
    many = server.request("PATCH", f"{path}/messages/{first}", token=key, body={"tags": [f"t{i}" for i in range(21)]})
    assert (many.status, many.error_code) == (400, "MR261")
    wrong = server.request("PATCH", f"{path}/messages/{first}", token=key, body={"is_read": "maybe"})
    assert wrong.status == 422 and wrong.json()["error"]["code"] == "22023"
    assert server.request("PATCH", f"{path}/messages/{elsewhere}", token=key, body={"is_read": True}).error_code == "MR209"

    # all mail: the key owner's, newest first by id, keyset by before_id; each with its inbox
    every = server.request("GET", "/api/v1/messages", token=key)
    assert every.status == 200
    for m in every.json():
        assert_shape(m, models.OwnerMessageSummary)
    assert [(m["id"], m["mailbox"]) for m in every.json()] == [
        (elsewhere, other["address"]), (tagged, box["address"]), (first, box["address"])]
    page = server.request("GET", f"/api/v1/messages?limit=1&before_id={elsewhere}", token=key).json()
    assert [m["id"] for m in page] == [tagged]
    assert [m["id"] for m in server.request("GET", "/api/v1/messages?tag=a", token=key).json()] == [first]
    session = server.request("GET", "/api/v1/messages", token=anonymous["session_token"])
    assert (session.status, session.error_code) == (403, "MR263")
    assert server.request("GET", "/api/v1/messages").status == 401
    assert server.request("GET", "/api/v1/messages?limit=201", token=key).status == 400

    # extend: now + ttl, clamped to the plan's max TTL
    extended = server.request("POST", path + "/extend", token=key, body={"ttl_seconds": 10**9})
    assert extended.status == 200, extended.body
    assert_shape(extended.json(), models.Mailbox)
    gained = dt.datetime.fromisoformat(extended.json()["expires_at"]) - dt.datetime.now(dt.UTC)
    assert dt.timedelta(hours=23, minutes=59) < gained <= dt.timedelta(hours=24)
    assert server.request("POST", path + "/extend", token=key, body={"ttl_seconds": 0}).error_code == "MR202"
    assert server.request("POST", path + "/extend", token=key, body={}).status == 422

    # delete selected (only the inbox's own are counted), then all; the inbox stays
    selected = server.request("POST", path + "/messages/delete", token=key, body={"ids": [first, elsewhere]})
    assert (selected.status, selected.json()) == (200, {"deleted": 1})
    assert_shape(selected.json(), models.DeletedCount)
    assert server.request("POST", path + "/messages/delete", token=key, body={"ids": []}).error_code == "MR262"
    cleared = server.request("DELETE", path + "/messages", token=key)
    assert (cleared.status, cleared.json()) == (200, {"deleted": 1})
    assert server.request("GET", path, token=key).json()["message_count"] == 0
    assert server.request("GET", f"/api/v1/mailboxes/{other['address']}/messages", token=key).json()[0]["id"] == elsewhere
    doc = server.request("GET", "/openapi.json").json()
    assert _schema_of(doc, "/api/v1/messages", "get", "200")["items"] == {"$ref": "#/components/schemas/OwnerMessageSummary"}
    assert "requestBody" in doc["paths"]["/api/v1/mailboxes/{address}/messages/{message_id}"]["patch"]


# -- the hot reads' fast paths (mailroom.http.app._HotGets, before the middleware and the router, and
# _fast_get, in the route): GET …/messages and …/wait answered by their endpoint without FastAPI's
# parameter solving when the query is plain, by the FastAPI route otherwise; both ways answer alike
# (the same body and headers, FastAPI's 422, the credentials rule and its ErrorResponse)

_ANSWER_HEADERS = ("content-type", "content-length", "content-security-policy", "x-content-type-options",
                   "x-frame-options", "www-authenticate", "retry-after")


def _same_answer(fast, slow) -> None:
    assert (fast.status, fast.body) == (slow.status, slow.body), (fast.body, slow.body)
    assert {h: fast.headers.get(h) for h in _ANSWER_HEADERS} == {h: slow.headers.get(h) for h in _ANSWER_HEADERS}
    assert fast.headers["x-frame-options"] == "DENY" and "sandbox" in fast.headers["content-security-policy"]


def _fast_box(server, deliver, subjects: list[str]) -> tuple[str, str]:
    created = server.request("POST", "/api/v1/mailboxes")
    assert created.status == 201, created.body
    box = created.json()
    for subject in subjects:
        deliver(box["address"], subject, "body of " + subject)
    return box["address"], box["session_token"]


def test_plain_and_declared_queries_answer_alike(server, deliver):
    address, token = _fast_box(server, deliver, ["one", "two", "three"])
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
        _same_answer(fast, slow)
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
    _same_answer(get("?limit=0"), get("?limit=%2B0"))
    assert server.request("GET", path + "?limit=2").status == 401
    _same_answer(server.request("GET", path + "?limit=2"), server.request("GET", path + "?limit=%2B2"))
    wrong = server.request("GET", path + "?limit=2", token="not-the-token")
    assert (wrong.status, wrong.error_code) == (403, "MR204"), wrong.body  # not this inbox's token


def test_a_long_poll_with_its_message_there_answers_at_once(server, deliver):
    address, token = _fast_box(server, deliver, ["Your code", "Other"])
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
    assert (unknown.status, unknown.error_code) == (404, "MR203"), unknown.body  # no such inbox
