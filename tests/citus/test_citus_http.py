"""The REST v1 functions of sql/29_http.sql on Citus (issue 33): an API key's inbox list (one
multi-shard read of plain columns, the JSON built on the coordinator), a message list and a read
(single-shard), the long poll's one look, and an mcp inbox read with its owner's key."""

from __future__ import annotations

import hashlib

import psycopg
import pytest

from mailroom import testing

pytestmark = pytest.mark.citus


def test_the_rest_v1_calls_on_citus(cconn, citus_url):
    digest = hashlib.sha256(b"mrk_citus_http").digest()
    cconn.execute("SELECT mailroom.create_api_key('citus-owner', %s)", (digest,))
    with psycopg.connect(testing.as_login(citus_url, "mr_http"), autocommit=True) as http:
        api = http.execute("SELECT mailroom.http_create_mailbox(%s, null, 10)", (digest,)).fetchone()[0]
        mcp = cconn.execute("SELECT address FROM mailroom.create_mailbox(10, 'free', 'mcp', 'citus-owner')").fetchone()[0]
        listed = http.execute("SELECT mailroom.http_list_mailboxes(%s)", (digest,)).fetchone()[0]
        assert [(b["address"], b["owner_type"]) for b in listed] == [(mcp, "mcp"), (api["address"], "api")]
        with psycopg.connect(testing.as_login(citus_url, "mr_inbound"), autocommit=True) as inbound:
            message = inbound.execute(
                "SELECT mailroom.deliver_message(%s, %s, 'app@example.org', 'Hi', 'App <app@example.org>', 'code 48213')",
                (mcp, b"From: App <app@example.org>\r\nSubject: Hi\r\n\r\ncode 48213"),
            ).fetchone()[0]
        summaries = http.execute("SELECT mailroom.http_list_messages(%s, null, %s)", (mcp, digest)).fetchone()[0]
        assert [(m["id"], m["from_address"], m["is_read"]) for m in summaries] == [(message, "app@example.org", False)]
        read = http.execute("SELECT mailroom.http_read_message(%s, null, %s, %s)", (mcp, digest, message)).fetchone()[0]
        assert (read["body_text"], read["code"], read["is_read"]) == ("code 48213", "48213", True)
        found = http.execute("SELECT mailroom.http_check_message(%s, null, %s, 'H%%')", (mcp, digest)).fetchone()[0]
        assert (found["id"], found["subject"], found["is_read"]) == (message, "Hi", True)
        view = http.execute("SELECT mailroom.http_mailbox_view(%s, null, %s)", (mcp, digest)).fetchone()[0]
        assert (view["mailbox"]["owner_type"], [m["id"] for m in view["messages"]]) == ("mcp", [message])
        # issue 35 item 1 on Citus: a plus-addressed delivery (tagged), PATCH, ?tag=, all mail (one
        # multi-shard read), extend, delete selected and all
        with psycopg.connect(testing.as_login(citus_url, "mr_inbound"), autocommit=True) as inbound:
            tagged = inbound.execute("SELECT mailroom.deliver_message(%s, %s)",
                                     (mcp.replace("@", "+news@"), b"Subject: news\r\n\r\nx")).fetchone()[0]
        patched = http.execute("SELECT mailroom.http_update_message(%s, null, %s, %s, false, ARRAY['a'])",
                               (mcp, digest, message)).fetchone()[0]
        assert (patched["is_read"], patched["tags"]) == (False, ["a"])
        by_tag = http.execute("SELECT mailroom.http_list_messages(%s, null, %s, p_tag => 'news')", (mcp, digest)).fetchone()[0]
        assert [m["id"] for m in by_tag] == [tagged]
        every = http.execute("SELECT mailroom.http_list_all_messages(null, %s)", (digest,)).fetchone()[0]
        assert [(m["id"], m["mailbox"]) for m in every] == [(tagged, mcp), (message, mcp)]
        # issue 44 item 4 on Citus: keyset pages of the list and of a search (one inbox: single-shard), and
        # the owner's mail searched (multi-shard, the rank's window on the coordinator)
        older = http.execute("SELECT mailroom.http_list_messages(%s, null, %s, p_before_id => %s)",
                             (mcp, digest, tagged)).fetchone()[0]
        assert [m["id"] for m in older] == [message]
        searched = http.execute("SELECT mailroom.http_search_messages(%s, null, %s, 'news or code', 1, %s)",
                                (mcp, digest, tagged)).fetchone()[0]
        assert [m["id"] for m in searched["messages"]] == [message]
        found = http.execute("SELECT mailroom.http_list_all_messages(null, %s, p_query => 'code')", (digest,)).fetchone()[0]
        assert [(m["id"], m["mailbox"]) for m in found] == [(message, mcp)]
        extended = http.execute("SELECT mailroom.http_extend_mailbox(%s, null, %s, 1800)", (mcp, digest)).fetchone()[0]
        assert extended["max_ttl_seconds"] == 3600
        assert http.execute("SELECT mailroom.http_delete_messages(%s, null, %s, %s)",
                            (mcp, digest, [message])).fetchone()[0] == {"deleted": 1}
        assert http.execute("SELECT mailroom.http_clear_messages(%s, null, %s)", (mcp, digest)).fetchone()[0] == {"deleted": 1}
