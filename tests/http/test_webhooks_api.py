"""Webhook endpoints over HTTP (docs/webhooks.md): an API key registers, lists and removes its own
endpoints, sees a delivery's attempts and replays it, against the real `mailroom http serve`; every
answer has exactly its model's keys."""

from __future__ import annotations

import hashlib
import secrets

import psycopg
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from mailroom.http import models
from mailroom.outbound.sealing import generate_keypair


def _keys(model: type[BaseModel]) -> set[str]:
    return {f.alias or name for name, f in model.model_fields.items()}


def _shape(doc: dict, model: type[BaseModel]) -> None:
    assert set(doc) == _keys(model), (set(doc) ^ _keys(model), model.__name__)
    model.model_validate(doc)


def _key(conn: psycopg.Connection, owner: str) -> str:
    key = "mrk_" + secrets.token_urlsafe(24)
    conn.execute("SELECT mailroom.create_api_key(%s, %s)", (owner, hashlib.sha256(key.encode()).digest()))
    return key


def test_registering_without_a_sender_key_says_so_with_503_not_500(server, conn):
    # first in the module: the module's database has no sender key yet (the next test makes one)
    assert conn.execute("SELECT count(*) FROM mailroom.sender_keys WHERE state = 'active'").fetchone()[0] == 0
    key = _key(conn, "hook-nokey")
    refused = server.request("POST", "/api/v1/webhooks", token=key,
                             body={"url": "https://x.example/", "events": ["message.received"]})
    # the operator's to fix, not the caller's: 503 with mailroom's words (attacker review: it was 500)
    assert (refused.status, refused.error_code) == (503, "MR313"), refused.body
    assert "a webhook secret) needs a sender key" in refused.json()["detail"]


def test_a_key_registers_sees_attempts_replays_and_removes_its_endpoints(server, conn):
    conn.execute("SELECT mailroom.set_sender_public_key(%s)", (generate_keypair(2048)[0],))
    owner = "hook-" + secrets.token_hex(4)
    key, other = _key(conn, owner), _key(conn, owner + "-other")

    assert server.request("GET", "/api/v1/webhooks").status == 401
    bad = server.request("POST", "/api/v1/webhooks", token=key, body={"url": "ftp://x.example/", "events": ["message.received"]})
    assert bad.status == 422 and bad.error_code == "MR345"
    bad = server.request("POST", "/api/v1/webhooks", token=key, body={"url": "https://x.example/", "events": ["message.sent"]})
    assert bad.status == 422 and bad.error_code == "MR346"

    # the page's cookie is no credential here: a cross-site form (a text/plain body that looks like JSON)
    # must not register an endpoint with it
    forged = server.request("POST", "/api/v1/webhooks", headers={"Cookie": f"mailroom_key={key}", "Content-Type": "text/plain"},
                            body=b'{"url": "https://evil.example/", "events": ["message.received"]}')
    assert forged.status == 401 and forged.error_code == "MR240"

    made = server.request("POST", "/api/v1/webhooks", token=key,
                          body={"url": "https://hooks.example.com/in", "events": ["message.received"]})
    assert made.status == 201, made.body
    created = made.json()
    _shape(created, models.CreatedWebhookEndpoint)
    assert created["secret"].startswith("whsec_")

    listed = server.request("GET", "/api/v1/webhooks", token=key)
    assert listed.status == 200 and [e["id"] for e in listed.json()] == [created["id"]]
    _shape(listed.json()[0], models.WebhookEndpoint)
    assert b"whsec_" not in listed.body  # shown once
    assert server.request("GET", "/api/v1/webhooks", token=other).json() == []

    address = conn.execute(
        "SELECT address FROM mailroom.create_mailbox(60, 'free', 'api', %s)", (owner,)
    ).fetchone()[0]
    conn.execute("SELECT mailroom.deliver_message(%s, %s, 'a@example.org', %s)",
                 (address, b"Subject: hi\r\n\r\nx\r\n", Jsonb({"subject": "hi"})))
    deliveries = server.request("GET", f"/api/v1/webhooks/{created['id']}/deliveries", token=key)
    assert deliveries.status == 200
    (delivery,) = deliveries.json()
    _shape(delivery, models.WebhookDelivery)
    assert delivery["event"] == "message.received" and delivery["status"] == "queued"
    assert server.request("GET", f"/api/v1/webhooks/{created['id']}/deliveries", token=other).error_code == "MR348"

    replay = f"/api/v1/webhooks/deliveries/{delivery['id']}/replay"
    assert server.request("POST", replay, token=key).error_code == "MR354"  # still queued
    conn.execute("UPDATE mailroom.outbound_messages SET status = 'failed', attempts = 3 WHERE id = %s", (delivery["id"],))
    assert server.request("POST", replay, token=other).error_code == "MR349"  # not the other key's
    replayed = server.request("POST", replay, token=key)
    assert replayed.status == 200, replayed.body
    _shape(replayed.json(), models.ReplayedWebhookDelivery)
    status, attempts = conn.execute(
        "SELECT status::text, attempts FROM mailroom.outbound_messages WHERE id = %s", (delivery["id"],)
    ).fetchone()
    assert (status, attempts) == ("queued", 0)

    assert server.request("DELETE", f"/api/v1/webhooks/{created['id']}", token=other).error_code == "MR348"
    removed = server.request("DELETE", f"/api/v1/webhooks/{created['id']}", token=key)
    assert removed.status == 200
    _shape(removed.json(), models.RemovedWebhookEndpoint)
    assert server.request("GET", "/api/v1/webhooks", token=key).json() == []
