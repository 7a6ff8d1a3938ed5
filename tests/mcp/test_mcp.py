"""`mailroom mcp` driven by the MCP SDK's own client, over stdio and over streamable HTTP.

The story of an agent signing up somewhere: create an inbox (owner type mcp, the key's owner),
wait for its mail while it arrives through the real inbound SMTP server, read it, extract the link
and the code, read it as resources, delete the inbox. Then: a bad key is a tool error with its MR
code; eight agents waiting at once on a server with a pool of two connections leave it free for
other calls (the wait holds no connection) and all get their mail.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time

import aiosmtplib
import psycopg
import pytest
from mcp.shared.exceptions import McpError
from mcp_support import doc, error, http_session, mailroom_env, send_mail, stdio_session

from mailroom.testing import as_login

TOOLS = {"create_inbox", "list_inboxes", "list_messages", "read_message", "wait_for_message", "extract_link",
         "extract_code", "delete_inbox", "set_inbox_fault", "clear_inbox_fault", "mark_message", "clear_inbox",
         "extend_inbox", "get_inbox", "delete_message", "delete_messages", "search_messages", "get_inbox_fault",
         "mark_all_read"}


async def _story(session, smtp_port: int, db_url: str) -> None:
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == TOOLS
    # each description ends with the errors SQL lists for its function (mcp_error_codes), with their meaning
    assert "Errors: MR212 no matching message committed within the timeout; MR205 mailbox expired;" \
        in tools["wait_for_message"].description
    assert "MR241 unknown or revoked API key" in tools["list_inboxes"].description
    assert "MR212" not in tools["list_inboxes"].description
    assert "expires_at (its TTL)" in tools["create_inbox"].description and "MR243" in tools["create_inbox"].description

    box = doc(await session.call_tool("create_inbox", {"ttl_minutes": 10}))
    address = box["address"]
    assert box["owner_type"] == "mcp" and "session_token" not in box
    with psycopg.connect(db_url) as c:
        owner = c.execute("SELECT owner_type::text, owner_id FROM mailroom.mailboxes WHERE address = %s",
                          (address,)).fetchone()
    assert owner == ("mcp", "agent-1")
    assert address in [b["address"] for b in doc(await session.call_tool("list_inboxes", {}))]

    # nothing yet: a short wait ends with MR212
    assert error(await session.call_tool("wait_for_message", {"address": address, "timeout_seconds": 0.5}))["code"] \
        == "MR212"

    # the wait is under way when the mail arrives, over real SMTP
    waiting = asyncio.create_task(session.call_tool(
        "wait_for_message", {"address": address, "subject_like": "Activate%", "timeout_seconds": 30}))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    await send_mail(smtp_port, address, "Welcome", "not this one")
    await send_mail(smtp_port, address, "Activate your account",
                    "Hello,\nopen https://app.example.org/activate?t=abc123 or type the code 48213.\n")
    started = time.monotonic()
    found = doc(await asyncio.wait_for(waiting, 20))
    assert found["subject"] == "Activate your account", found
    assert time.monotonic() - started < 10

    message = doc(await session.call_tool("read_message", {"address": address, "message_id": found["id"]}))
    assert message["link"] == "https://app.example.org/activate?t=abc123"
    assert message["code"] == "48213" and message["is_read"] is True
    assert "48213" in message["text"]
    link = doc(await session.call_tool("extract_link", {"address": address, "message_id": found["id"],
                                                        "url_like": "%/activate%"}))
    assert link == {"link": "https://app.example.org/activate?t=abc123"}
    assert doc(await session.call_tool("extract_code", {"address": address, "message_id": found["id"]})) == \
        {"code": "48213"}
    assert error(await session.call_tool("extract_code", {"address": address, "message_id": found["id"],
                                                          "pattern": "\\m\\d{9}\\M"}))["code"] == "MR215"
    listed = doc(await session.call_tool("list_messages", {"address": address}))  # REST's answer: a JSON array
    assert [m["subject"] for m in listed] == ["Activate your account", "Welcome"]

    # fault injection (issue 35): the next message is refused at RCPT by the real server, then mail flows again
    fault = doc(await session.call_tool("set_inbox_fault", {"address": address, "stage": "rcpt",
                                                            "reply": "451 4.7.1 Greylisted by the agent", "count": 1}))
    assert (fault["stage"], fault["remaining"], fault["fired"]) == ("rcpt", 1, 0)
    assert "MR231" in tools["set_inbox_fault"].description
    assert error(await session.call_tool("set_inbox_fault", {"address": address, "stage": "rcpt",
                                                             "reply": "250 ok"}))["code"] == "MR231"
    with pytest.raises(aiosmtplib.SMTPRecipientsRefused) as refused:
        await send_mail(smtp_port, address, "Refused", "by the fault")
    assert refused.value.recipients[0].code == 451
    shown = doc(await session.call_tool("get_inbox", {"address": address}))["fault"]
    assert (shown["fired"], shown["remaining"], shown["active"]) == (1, 0, False)
    assert doc(await session.call_tool("clear_inbox_fault", {"address": address})) == {"deleted": True}
    assert doc(await session.call_tool("get_inbox", {"address": address}))["fault"] is None

    # the same as resources
    uris = [str(r.uri) for r in (await session.list_resources()).resources]
    assert "mailroom://inboxes" in uris and f"mailroom://inbox/{address}" in uris
    templates = {t.uriTemplate for t in (await session.list_resource_templates()).resourceTemplates}
    assert templates == {"mailroom://inbox/{address}", "mailroom://inbox/{address}/message/{message_id}"}
    inbox = await session.read_resource(f"mailroom://inbox/{address}")
    assert '"Activate your account"' in inbox.contents[0].text
    read = await session.read_resource(f"mailroom://inbox/{address}/message/{found['id']}")
    assert "https://app.example.org/activate?t=abc123" in read.contents[0].text

    # issue 35 item 1: mark, tag (also by plus-addressing), extend, clear
    marked = doc(await session.call_tool("mark_message", {"address": address, "message_id": found["id"],
                                                          "is_read": False, "tags": ["Signup", "ci"]}))
    assert (marked["is_read"], marked["tags"]) == (False, ["ci", "signup"])
    assert error(await session.call_tool("mark_message", {"address": address, "message_id": found["id"],
                                                          "tags": ["not a tag"]}))["code"] == "MR260"
    await send_mail(smtp_port, address.replace("@", "+receipts@"), "Receipt", "paid")
    for _ in range(50):
        listed = doc(await session.call_tool("list_messages", {"address": address}))
        if len(listed) == 3:
            break
        await asyncio.sleep(0.1)
    assert listed[0]["tags"] == ["receipts"]
    # the filters REST has (issue 43: MCP's own copy of the list had none)
    tagged = doc(await session.call_tool("list_messages", {"address": address, "tag": "receipts"}))
    assert [m["subject"] for m in tagged] == ["Receipt"]
    newer = doc(await session.call_tool("list_messages", {"address": address, "after_id": found["id"]}))
    assert [m["subject"] for m in newer] == ["Receipt"]
    extended = doc(await session.call_tool("extend_inbox", {"address": address, "ttl_seconds": 1800}))
    assert extended["max_ttl_seconds"] == 3600 and extended["expires_at"] > box["expires_at"]
    assert doc(await session.call_tool("clear_inbox", {"address": address})) == {"deleted": 3}
    assert doc(await session.call_tool("list_messages", {"address": address})) == []

    assert doc(await session.call_tool("delete_inbox", {"address": address})) == {"deleted": True}
    assert error(await session.call_tool("list_messages", {"address": address}))["code"] == "MR206"
    with pytest.raises(McpError, match="MR206: mailbox was deleted"):
        await session.read_resource(f"mailroom://inbox/{address}")
    assert error(await session.call_tool("read_message", {"address": "nobody@example.org", "message_id": 1}))["code"] \
        == "MR203"


def test_story_over_stdio(db_url: str, smtp_server, tmp_path) -> None:
    """The story with a key of its own, revoked at the end: the server it started with answers MR241 from then on."""
    key = "mrk_" + secrets.token_urlsafe(32)
    with psycopg.connect(as_login(db_url, "mr_admin"), autocommit=True) as admin:
        key_id = admin.execute("SELECT mailroom.create_api_key('agent-1', %s)",
                               (hashlib.sha256(key.encode()).digest(),)).fetchone()[0]
    env = mailroom_env(db_url, ("mcp",), {"MAILROOM_MCP_API_KEY": key})

    async def run() -> None:
        with open(tmp_path / "stdio.log", "w") as errlog:
            async with stdio_session(env, errlog) as session:
                await _story(session, smtp_server.port, db_url)
                with psycopg.connect(as_login(db_url, "mr_admin"), autocommit=True) as admin:
                    admin.execute("SELECT mailroom.revoke_api_key(%s)", (key_id,))
                err = error(await session.call_tool("create_inbox", {}))
                assert err == {"code": "MR241", "kind": "denied", "message": "unknown or revoked API key"}
                assert error(await session.call_tool("list_inboxes", {}))["code"] == "MR241"

    asyncio.run(run())
    log = (tmp_path / "stdio.log").read_text()
    assert "serving MCP on stdio" in log
    assert key not in log and "@" not in log


def test_story_over_http(db_url: str, api_key: str, smtp_server, mcp_http) -> None:
    async def run() -> None:
        async with http_session(mcp_http.port, api_key) as session:
            await _story(session, smtp_server.port, db_url)

    asyncio.run(run())
    assert api_key not in mcp_http.log()


def test_bad_key_over_http_is_a_tool_error_with_its_code(mcp_http) -> None:
    async def run() -> None:
        async with http_session(mcp_http.port, "mrk_not-a-key") as session:
            err = error(await session.call_tool("create_inbox", {}))
            assert err == {"code": "MR241", "kind": "denied", "message": "unknown or revoked API key"}
            assert error(await session.call_tool("list_inboxes", {}))["code"] == "MR241"

    asyncio.run(run())


def test_http_without_a_key_is_refused_at_the_edge(mcp_http) -> None:
    import httpx

    response = httpx.post(f"http://127.0.0.1:{mcp_http.port}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                          headers={"Accept": "application/json, text/event-stream"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_stdio_without_a_key_refuses_to_start(monkeypatch, capsys) -> None:
    from mailroom import cli

    monkeypatch.delenv("MAILROOM_MCP_API_KEY", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["mcp", "--database-url", "host=/nonexistent dbname=x"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("mailroom: error: MAILROOM_MCP_API_KEY is not set"), err
    assert len(err.strip().splitlines()) == 1


def test_eight_waits_do_not_exhaust_a_pool_of_two(db_url: str, api_key: str, smtp_server, mcp_http) -> None:
    """The server has --pool-size 2: eight waits under way hold no connection, so another call is
    answered at once, the server's connections stay at its pool and LISTEN, and each wait gets its mail."""

    async def run() -> list[float]:
        async with http_session(mcp_http.port, api_key) as session:
            addresses = [doc(await session.call_tool("create_inbox", {"ttl_minutes": 5}))["address"] for _ in range(8)]
            waits = [asyncio.create_task(session.call_tool(
                "wait_for_message", {"address": a, "subject_like": f"Code {i}%", "timeout_seconds": 40}))
                for i, a in enumerate(addresses)]
            await asyncio.sleep(1.5)
            assert not any(w.done() for w in waits)
            started = time.monotonic()
            assert len(doc(await session.call_tool("list_inboxes", {}))) >= 8
            answered = time.monotonic() - started
            with psycopg.connect(as_login(db_url, "mr_admin")) as c:
                backends = c.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'mailroom-%%'"
                                     " AND usename = 'mr_http' AND datname = current_database()").fetchone()[0]
            assert backends <= 3, backends  # the pool (2) and the LISTEN connection
            sent = time.monotonic()
            await asyncio.gather(*(send_mail(smtp_server.port, a, f"Code {i} for you", f"your code is 1000{i}")
                                   for i, a in enumerate(addresses)))
            results = await asyncio.wait_for(asyncio.gather(*waits), 30)
            latency = time.monotonic() - sent
            for i, result in enumerate(results):
                assert doc(result)["subject"] == f"Code {i} for you"
            return [answered, latency]

    answered, latency = asyncio.run(run())
    assert answered < 5, answered
    print(f"\nanother call during 8 waits: {answered * 1000:.0f} ms; 8 mails sent to all 8 waits returned: "
          f"{latency * 1000:.0f} ms")


def test_every_call_has_a_statement_timeout(db_url: str, api_key: str, mcp_http) -> None:
    """A call stuck behind a lock ends after the server's --statement-timeout (2 s) as a tool error, and the
    timeout ends with its transaction: the next call on the same pooled connections works."""

    async def run() -> float:
        async with http_session(mcp_http.port, api_key) as session:
            address = doc(await session.call_tool("create_inbox", {}))["address"]
            with psycopg.connect(db_url) as locker:
                locker.execute("SELECT 1 FROM mailroom.mailboxes WHERE address = %s FOR UPDATE", (address,))
                started = time.monotonic()
                err = error(await session.call_tool("delete_inbox", {"address": address}))
                took = time.monotonic() - started
                assert err["code"] == "57014" and "statement timeout" in err["message"], err
            for _ in range(3):  # more calls than the pool has connections
                assert doc(await session.call_tool("list_inboxes", {}))
            assert doc(await session.call_tool("delete_inbox", {"address": address})) == {"deleted": True}
            return took

    took = asyncio.run(run())
    assert 1.9 < took < 6, took


def test_fast_path_answers_as_the_sdk_transport_does(api_key: str, mcp_http) -> None:
    """The same tools/call through the fast path (a JSON body with its length) and through the SDK's
    transport (the same body chunked, which the fast path leaves to it): the same JSON-RPC answer."""
    import json

    import httpx

    headers = {"Authorization": f"Bearer {api_key}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}
    url = f"http://127.0.0.1:{mcp_http.port}/mcp"
    with httpx.Client(headers=headers, timeout=30) as client:
        box = client.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                     "params": {"name": "create_inbox", "arguments": {}}}).json()
        address = json.loads(box["result"]["content"][0]["text"])["address"]
        for name, arguments in (("list_messages", {"address": address}), ("list_messages", {"address": "no@where"}),
                                ("read_message", {"address": address, "message_id": 1})):
            body = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                               "params": {"name": name, "arguments": arguments}}).encode()
            fast = client.post(url, content=body)
            sdk = client.post(url, content=iter([body]))  # no Content-Length: the SDK's transport
            assert fast.status_code == sdk.status_code == 200
            assert fast.headers["content-type"] == sdk.headers["content-type"] == "application/json"
            assert fast.json() == sdk.json(), (fast.text, sdk.text)
