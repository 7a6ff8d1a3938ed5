"""SMTP AUTH of `mailroom inbox serve`: the SMTP capture credential (docs/inboxes.md, "SMTP AUTH").

A credential is a username and a secret (`mrs_` + 32 random bytes, URL-safe) made by `mailroom
smtpcred create`; only the secret's sha256 (secret_digest: core/credentials.py key_digest) reaches SQL,
at creation and at each login (`mailroom.smtp_login`, which answers the capture inbox or a refusal with its reply, 535).
What is decided here, in the server process, is what belongs to the protocol:
- whether a listener offers AUTH before STARTTLS (auth_needs_tls: only on a loopback address);
- failed logins per client address (LoginFailures: 5 a minute, then 454 4.7.0 until the window
  passes). Counted in this process for now; the shared rate mechanism of docs/architecture.md
  (`mailroom_internal._take_rate`, setting smtp.auth_failures_per_client) replaces it when it lands.
The login itself is an Authenticator: CredentialLogin asks SQL; under `inbox serve --sink` it is
AcceptAnyLogin (Mailpit's accept-any): every username and password succeed and nothing reaches SQL,
the session gets no Capture, so its mail is stored by recipient as the sink stores all mail.
"""

from __future__ import annotations

import ipaddress
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import psycopg

from mailroom.core.credentials import key_digest
from mailroom.core.errors import smtp_reply_of

if TYPE_CHECKING:
    from mailroom.inboxes.delivery import Delivery

# failed logins of one client address allowed in a window, and the window (seconds)
MAX_FAILURES = 5
FAILURE_WINDOW = 60.0
# client addresses remembered at most (the oldest forgotten first): a bounded table
MAX_CLIENTS = 10_000


def new_secret() -> str:
    """A credential's secret: `mrs_` + 32 random bytes, URL-safe base64 (shown once)."""
    return "mrs_" + secrets.token_urlsafe(32)


def secret_digest(secret: str | bytes) -> bytes | None:
    """The sha256 of a secret (mailroom.core.credentials.key_digest, the one digest of every credential):
    the only form in which it reaches SQL; None for a blank one (SQL refuses it like a wrong one)."""
    return key_digest(secret.decode("utf-8", "replace") if isinstance(secret, bytes) else secret)


def auth_needs_tls(host: str) -> bool:
    """Whether a listener on `host` offers AUTH only after STARTTLS: yes unless it is a loopback
    address (127.0.0.0/8, ::1, localhost), where a password never crosses a network."""
    if host.strip().lower() == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return True  # a name, or the wildcard "": it may face a network


@dataclass(frozen=True)
class Capture:
    """What a logged-in session needs: where its messages go (the capture inbox)."""

    credential_id: int | None
    address: str


class Authenticator(Protocol):
    """A login: its Capture, the SMTP reply that refuses it, or None for a login that succeeds without
    a capture (the sink's); psycopg errors raise."""

    async def login(self, username: str, password: bytes) -> Capture | str | None: ...


class AcceptAnyLogin:
    """The sink's AUTH (`inbox serve --sink`, Mailpit's accept-any): every login succeeds, whatever its
    username and password, and is no SMTP capture credential (None: no Capture), so the session's mail
    goes where the sink puts all mail, to an inbox per recipient. Nothing is asked of SQL and nothing of
    the login is kept or logged. It grants nothing a session without AUTH does not have on the sink
    (docs/security.md)."""

    async def login(self, username: str, password: bytes) -> None:
        return None


class CredentialLogin:
    """The SMTP capture credential: `mailroom.smtp_login` with the password's digest."""

    def __init__(self, delivery: Delivery) -> None:
        self.delivery = delivery

    async def login(self, username: str, password: bytes) -> Capture | str:
        try:
            row = await self.delivery.login(username, secret_digest(password))
        except psycopg.Error as exc:
            refusal = smtp_reply_of(exc)  # 535 5.7.8 (mailroom.error_codes), the same for every wrong credential
            if refusal is None:
                raise
            return refusal
        return Capture(row.credential_id, row.capture_address)


class LoginFailures:
    """Failed logins per client address in the last FAILURE_WINDOW seconds (one event loop: no lock)."""

    def __init__(self, limit: int = MAX_FAILURES, window: float = FAILURE_WINDOW,
                 clock: Callable[[], float] | None = None) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock or time.monotonic
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, client: str, now: float) -> deque[float] | None:
        times = self._failures.get(client)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[client]
            return None
        return times

    def blocked(self, client: str) -> bool:
        """Whether the client is at its limit: its next AUTH gets 454 without being checked."""
        times = self._recent(client, self._clock())
        return times is not None and len(times) >= self.limit

    def failed(self, client: str) -> None:
        now = self._clock()
        times = self._recent(client, now)
        if times is None:
            if len(self._failures) >= MAX_CLIENTS:
                self._failures.pop(next(iter(self._failures)))  # the oldest entry
            times = self._failures[client] = deque()
        times.append(now)
