"""Who a request is: the credential helpers of the HTTP face (the REST API and the page).

`Authorization: Bearer <session token | API key>` (or `X-Session-Token`, `X-API-Key`), or the page's
HttpOnly cookie; API keys start with `mrk_` and only their sha256 is sent to SQL, which decides.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from fastapi import Request

from mailroom.core.credentials import key_digest

API_KEY_PREFIX = "mrk_"
MAX_CREDENTIAL = 256


@dataclass
class Credentials:
    session_token: str | None
    key_digest: bytes | None
    raw: str | None
    from_cookie: bool

    def sql(self, address: str) -> dict[str, Any]:
        return {"address": address, "session_token": self.session_token, "key_digest": self.key_digest}

    @property
    def as_key(self) -> bytes | None:
        """The credential looked up as an API key whatever it looks like, for what only a key may do (an
        owner's inbox list, creating an owner's inbox): SQL refuses anything else as an unknown key."""
        if self.raw is None or self.key_digest is not None:
            return self.key_digest
        return hashlib.sha256(self.raw.encode()).digest()

    @property
    def header_key(self) -> bytes | None:
        """`as_key` from a header only, never from the page's cookie (a cross-site form cannot send a header):
        sending mail and webhooks."""
        return None if self.from_cookie else self.as_key

    @property
    def fingerprint(self) -> bytes:
        """Whose wait or stream it is, for the per-credential caps: the sha256 of the credential as sent."""
        return hashlib.sha256((self.raw or "").encode()).digest()


KEY_COOKIE = "mailroom_key"  # an API key's owner's cookie (the page's /mail); an inbox's cookie is cookie_name(address)


def cookie_name(address: str) -> str:
    return "mailroom_" + hashlib.sha256(address.strip().lower().encode()).hexdigest()[:16]


def csrf_token(credential: str) -> str:
    """The CSRF value of a page: derived from its credential, so only a reader of the page knows it."""
    return hashlib.sha256(b"mailroom-csrf:" + credential.encode()).hexdigest()[:32]


def split_credential(value: str | None, *, from_cookie: bool = False) -> Credentials:
    if not value:
        return Credentials(None, None, None, from_cookie)
    value = value.strip()
    if len(value) > MAX_CREDENTIAL or value.startswith(API_KEY_PREFIX):
        # a credential too long for a session token can only be refused as a key: SQL answers (MR241)
        return Credentials(None, key_digest(value), value, from_cookie)
    return Credentials(value, None, value, from_cookie)


def request_credentials(request: Request, address: str | None = None) -> Credentials:
    auth = request.headers.get("authorization", "")
    value = auth[7:] if auth[:7].lower() == "bearer " else None
    value = value or request.headers.get("x-api-key") or request.headers.get("x-session-token")
    if value:
        return split_credential(value)
    # the page's cookies: the inbox's own, else an API key's owner's (KEY_COOKIE, the /mail view)
    cookie = request.cookies.get(cookie_name(address)) if address is not None else None
    return split_credential(cookie or request.cookies.get(KEY_COOKIE), from_cookie=True)


_LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def sink_listing_open(request: Request, listing: bool, public: bool) -> bool:
    """Whether this request may see the sink's open listing (every sink inbox with its token, no key):
    with `--sink-public` always; else only a request from a loopback peer that names a loopback host.
    The bind alone is not enough (the attacker review of issue 45): a reverse proxy on the same host
    forwards strangers from 127.0.0.1 (with --proxy their own address is the peer), and a page a
    developer visits can rebind its name to 127.0.0.1 (its Host header is still its own name)."""
    if not listing:
        return False
    if public:
        return True
    import ipaddress

    host = request.headers.get("host", "")
    name = host[1:host.find("]")] if host.startswith("[") else host.rsplit(":", 1)[0]
    if name.lower() not in _LOOPBACK_HOSTS and not name.startswith("127."):
        return False
    peer = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(peer).is_loopback
    except ValueError:
        return False
