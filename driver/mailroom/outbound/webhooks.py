"""Webhook deliveries: the claimed rows of kind 'webhook' (sql/38_outbound_webhooks.sql), POSTed by
`mailroom send` and signed per the Standard Webhooks spec (docs/webhooks.md).

What is due, what an answer means (2xx sent; 4xx but 408 and 429 failed at once, as an SMTP 5xx;
anything else retried with the queue's backoff) and every event are SQL's: this module only opens
the endpoint's sealed whsec_ secret (the sender key, outbound/sealing.py), signs, asks and reports
the raw outcome ('http' with the status, or 'connect', 'timeout', 'uncertain', 'local').

- Signature: `webhook-signature: v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">`
  keyed with the base64-decoded part of the secret after `whsec_`; `webhook-id` is the row's, the
  same on every attempt (a receiver de-duplicates on it).
- A delivery the reaper took back (possibly_sent: its worker died after sending, before its outcome)
  goes again with the same id and `webhook-possible-duplicate: true`; SQL counts it when delivered.
- The SSRF guard (core/netguard.py) on every attempt: the URL's host resolved, every address
  public unless in `--webhook-allow`, asked at the address checked; redirects are not followed (a
  3xx is an answer, retried); the answer's body is read up to 4 KiB, for the attempt log only.
- Never logged: the secret, the URL's path and query, the payload.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from dataclasses import dataclass, field
from typing import Any

from mailroom.core import netguard
from mailroom.core.netguard import IpNetwork, Refused
from mailroom.outbound.smtp import Outcome

SECRET_PREFIX = "whsec_"  # noqa: S105 - the secrets' prefix, not a secret
USER_AGENT = "mailroom-webhooks/1"
MAX_ANSWER = 4096  # bytes of an answer's body read (kept in the attempt log, redacted by SQL)


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks `webhook-signature` value (one v1 signature) of a body."""
    key = base64.b64decode(secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret)
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def headers(secret: str, msg_id: str, timestamp: int, body: bytes, possible_duplicate: bool) -> dict[str, str]:
    """The request's headers: the three of the spec, the content type, and the duplicate flag."""
    out = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }
    if possible_duplicate:
        out["webhook-possible-duplicate"] = "true"
    return out


@dataclass
class WebhookPolicy:
    """How the sender asks endpoints: the networks allowed past the SSRF guard (`--webhook-allow`,
    none by default: public addresses only) and the bound of one request."""

    allow: list[IpNetwork] = field(default_factory=list)
    timeout: float = 10.0

    @classmethod
    def from_flags(cls, networks: list[str], timeout: float) -> WebhookPolicy:
        return cls(allow=netguard.parse_networks(networks), timeout=timeout)


class WebhookClient:
    """One httpx client per sender slot (keep-alive to endpoints), redirects never followed."""

    def __init__(self, policy: WebhookPolicy) -> None:
        import httpx

        self.policy = policy
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(policy.timeout), follow_redirects=False, trust_env=False,
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=4),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def deliver(self, row: dict[str, Any], secret: str | None) -> Outcome:
        """POST one claimed webhook row; its raw outcome (SQL decides what it means)."""
        import httpx

        rid, token = row["id"], row["claim_token"]
        url = row.get("webhook_url")
        if url is None or secret is None:
            return Outcome(rid, token, "local", error="the webhook endpoint was removed, or its API key revoked" if url is None
                           else "the webhook secret cannot be opened: sealed for another sender key (list that "
                                "key's file in MAILROOM_SENDER_KEY_FILE, or register the endpoint again)")
        body = (row.get("text_body") or "").encode()
        sent = False  # whether the answer began (an error after it: possibly delivered)
        try:
            # the name's resolution bounded too (a name server that never answers, chosen by whoever
            # registered the URL, would hold the slot past --webhook-timeout): nothing was sent yet
            try:
                async with asyncio.timeout(self.policy.timeout):
                    pinned = await netguard.pin(url, self.policy.allow, hint="mailroom send --webhook-allow to allow it")
            except TimeoutError:
                return Outcome(rid, token, "timeout", error="the name did not resolve in time")
            request = self.client.build_request(
                "POST", pinned.url, content=body, extensions=pinned.extensions,
                headers={**pinned.headers, **headers(secret, row["message_id"], int(time.time()), body,
                                                     bool(row.get("possibly_sent")))},
            )
            async with asyncio.timeout(self.policy.timeout):
                response = await self.client.send(request, stream=True)
                sent = True
                try:
                    answer = b""
                    async for chunk in response.aiter_bytes():
                        answer += chunk
                        if len(answer) >= MAX_ANSWER:
                            break
                finally:
                    await response.aclose()
        except Refused as exc:
            return Outcome(rid, token, "connect", error=str(exc))
        except (httpx.ConnectTimeout, httpx.PoolTimeout):
            return Outcome(rid, token, "timeout", error="no connection in time")
        except (TimeoutError, httpx.TimeoutException):
            # the request went out: the receiver may have it, so possibly delivered (flagged by SQL)
            return Outcome(rid, token, "uncertain", error="no answer in time")
        except httpx.ConnectError as exc:
            return Outcome(rid, token, "connect", error=f"{type(exc).__name__}")
        except (httpx.HTTPError, OSError) as exc:
            return Outcome(rid, token, "uncertain" if sent else "dropped", error=f"{type(exc).__name__}")
        text = answer[:MAX_ANSWER].decode("utf-8", "replace").replace("\r", " ").replace("\n", " ")[:500]
        return Outcome(rid, token, "http", code=response.status_code,
                       error=f"HTTP {response.status_code}" + (f": {text}" if text.strip() else ""))


def endpoint_label(row: dict[str, Any]) -> str:
    """What a log line says of a row's endpoint: its scheme and host, never its path or query."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(row.get("webhook_url") or "")
        return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "?"
