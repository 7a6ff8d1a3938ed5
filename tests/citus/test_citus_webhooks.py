"""Webhooks on a Citus coordinator with two workers (docs/webhooks.md, "Citus"): message.received
queued by a delivery routed to its worker, a webhook row through the Citus claim (its lane) and
finalize, message.sent from a sender's mail, inbox.expired from the expiry's Citus seam (one node's
trigger is dropped there: it would write outbound_messages from a shard)."""

from __future__ import annotations

import hashlib
import json

import psycopg
import pytest

from mailroom import testing
from mailroom.outbound.sealing import generate_keypair

pytestmark = pytest.mark.citus


def test_a_webhook_goes_through_the_citus_queue(cconn):
    cconn.execute("SELECT mailroom.set_sender_public_key(%s)", (generate_keypair(2048)[0],))
    key_id = cconn.execute(
        "SELECT mailroom.create_api_key('citus-hooks', %s)", (hashlib.sha256(b"mrk_citus_hooks").digest(),)
    ).fetchone()[0]
    endpoint = cconn.execute(
        "SELECT id FROM mailroom.add_webhook('https://hooks.example.com/in', ARRAY['message.received'], %s)", (key_id,)
    ).fetchone()[0]
    address = cconn.execute(
        "SELECT address FROM mailroom.create_mailbox(30, 'free', 'api', 'citus-hooks')"
    ).fetchone()[0]
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_inbound"), autocommit=True) as inbound:
        inbound.execute(
            "SELECT mailroom.deliver_message(%s, %s, 'a@example.com', %s::jsonb)",
            (address, b"Subject: hi\r\n\r\nhi\r\n", json.dumps({"subject": "hi"})),
        )
    queued = cconn.execute(
        "SELECT id, subject FROM mailroom.outbound_messages WHERE kind = 'webhook' AND webhook_endpoint_id = %s",
        (endpoint,),
    ).fetchall()
    assert [r[1] for r in queued] == ["message.received"]

    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_sender"), autocommit=True) as sender:
        rows = sender.execute(
            "SELECT id, claim_token, kind, webhook_url, webhook_secret_sealed IS NOT NULL FROM mailroom.claim_messages(100, 'w')"
        ).fetchall()
        mine = [r for r in rows if r[0] == queued[0][0]]
        assert mine and mine[0][2:] == ("webhook", "https://hooks.example.com/in", True)
        # a sender of the previous release cannot send it ('local'): retried while the endpoint is there
        assert sender.execute(
            "SELECT result FROM mailroom.finalize_messages(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], ARRAY['local'])",
            (mine[0][0], mine[0][1]),
        ).fetchone()[0] == "retry"
        cconn.execute("UPDATE mailroom.outbound_messages SET next_retry_at = NULL WHERE id = %s", (mine[0][0],))
        rows = sender.execute(
            "SELECT id, claim_token, kind, webhook_url, webhook_secret_sealed IS NOT NULL FROM mailroom.claim_messages(100, 'w')"
        ).fetchall()
        mine = [r for r in rows if r[0] == queued[0][0]]
        result = sender.execute(
            "SELECT result FROM mailroom.finalize_messages(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], ARRAY['http'],"
            " ARRAY[200])", (mine[0][0], mine[0][1]),
        ).fetchone()[0]
        assert result == "sent"
        others = [r for r in rows if r[0] != queued[0][0]]
        if others:  # not this test's: given back untouched
            sender.execute("SELECT mailroom.release_messages(%s, %s)", ([r[0] for r in others], [r[1] for r in others]))

    # a sender's endpoint: message.sent when its mail is finalized sent
    cconn.execute("SELECT mailroom.upsert_sender('citus-hooks', 'noreply@mailroom.test', '127.0.0.1', 2525)")
    hook = cconn.execute(
        "SELECT id FROM mailroom.add_webhook('https://hooks.example.com/mail', ARRAY['message.sent'],"
        " p_sender => 'citus-hooks')"
    ).fetchone()[0]
    mail = cconn.execute(
        "SELECT mailroom.enqueue_message('citus-hooks', ARRAY['r@example.com'], 's', 'b', p_priority => 10)"
    ).fetchone()[0]
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_sender"), autocommit=True) as sender:
        rows = sender.execute("SELECT id, claim_token FROM mailroom.claim_messages(100, 'w')").fetchall()
        token = next(t for i, t in rows if i == mail)
        sender.execute(
            "SELECT mailroom.finalize_messages(ARRAY[%s]::bigint[], ARRAY[%s]::bigint[], ARRAY['sent'])", (mail, token)
        )
        others = [r for r in rows if r[0] != mail]
        if others:
            sender.execute("SELECT mailroom.release_messages(%s, %s)", ([r[0] for r in others], [r[1] for r in others]))
    sent = cconn.execute(
        "SELECT subject, (text_body::jsonb -> 'data' ->> 'outbound_id')::bigint FROM mailroom.outbound_messages"
        " WHERE kind = 'webhook' AND webhook_endpoint_id = %s", (hook,),
    ).fetchall()
    assert sent == [("message.sent", mail)]

    # inbox.expired: the expiry's seam queues it on the coordinator
    cconn.execute("SELECT * FROM mailroom.add_webhook('https://hooks.example.com/x', ARRAY['inbox.expired'], %s)", (key_id,))
    with cconn.transaction():
        cconn.execute("SELECT mailroom.pin_clock(now() + interval '1 hour')")
        assert cconn.execute("SELECT mailroom.expire_mailboxes(1000)").fetchone()[0] >= 1
    expired = cconn.execute(
        "SELECT text_body::jsonb -> 'data' ->> 'address' FROM mailroom.outbound_messages"
        " WHERE kind = 'webhook' AND subject = 'inbox.expired'"
    ).fetchall()
    assert (address,) in expired
    cconn.execute("DELETE FROM mailroom.outbound_messages WHERE kind = 'webhook' OR sender_id ="
                  " (SELECT id FROM mailroom.senders WHERE name = 'citus-hooks')")


def test_an_erased_owners_endpoint_is_renamed_and_gets_no_later_owners_mail(cconn):
    """erase_address renames the owner on an API key's endpoint (a reference table) with its key's, after
    the multi-shard deletes of the same transaction; a later owner of the same id queues nothing to it
    (review of 2026-12-06)."""
    cconn.execute("SELECT mailroom.set_sender_public_key(%s)", (generate_keypair(2048)[0],))
    key_id = cconn.execute(
        "SELECT mailroom.create_api_key('erin.hooks@victim.test', %s)", (hashlib.sha256(b"mrk_citus_erin").digest(),)
    ).fetchone()[0]
    endpoint = cconn.execute(
        "SELECT id FROM mailroom.add_webhook('https://hooks.example.com/e', ARRAY['message.received'], %s)", (key_id,)
    ).fetchone()[0]
    cconn.execute("SELECT * FROM mailroom.erase_address('erin.hooks@victim.test')")
    owners = cconn.execute(
        "SELECT (SELECT owner_id FROM mailroom.webhook_endpoints WHERE id = %s), "
        "(SELECT owner_id FROM mailroom.api_keys WHERE id = %s)", (endpoint, key_id),
    ).fetchone()
    assert owners[0] == owners[1] and owners[0].startswith("erased:")
    cconn.execute("SELECT mailroom.create_api_key('erin.hooks@victim.test', %s)",
                  (hashlib.sha256(b"mrk_citus_erin_later").digest(),))
    address = cconn.execute(
        "SELECT address FROM mailroom.create_mailbox(30, 'free', 'api', 'erin.hooks@victim.test')"
    ).fetchone()[0]
    with psycopg.connect(testing.as_login(cconn.info.dsn, "mr_inbound"), autocommit=True) as inbound:
        inbound.execute(
            "SELECT mailroom.deliver_message(%s, %s, 'a@example.com', %s::jsonb)",
            (address, b"Subject: later\r\n\r\nhi\r\n", json.dumps({"subject": "later"})),
        )
    assert cconn.execute(
        "SELECT count(*) FROM mailroom.outbound_messages WHERE kind = 'webhook' AND webhook_endpoint_id = %s", (endpoint,)
    ).fetchone()[0] == 0
