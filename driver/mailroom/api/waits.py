"""The one wait of a server process (docs/architecture.md, "The wait"): REST's long poll and MCP's
wait_for_message, counted against the caps and sharing their looks.

A wait makes its own first look (`look(last)`, one SQL call, `http_wait_look`: it authorizes the
credential and answers `{mailbox_id, expires_in, message}`). Nothing there yet: it is admitted under
the caps SQL reads (`wait_caps`: per credential, per client address, in total; over one, the face's
`refuse` raises SQL's refusal, `wait_refused`), then joins the group of waits of the same credential,
inbox, filter and cursor. A group makes ONE look per wake-up of its inbox on the hub (a delivery, the
inbox's deletion, a reconnect of LISTEN, the poll interval while LISTEN is down) and never sleeps past
the inbox's expiry (`expires_in`, by mailroom.clock()): the look after it answers SQL's "expired",
which ends every wait of the group, as a match or any other error does. A wait that reaches its
timeout makes its own last look (`last`: SQL answers "timed out" when nothing came). A cancelled wait
(its client gone: `until_disconnected`) leaves its group at once; the last one out stops the group's
looks.

The credential is only a digest here (the API key's, or the session token's sha256): the group's
key and the caps' count, never logged. The client is the address the face sees (the reverse proxy's
X-Forwarded-For with `http serve --proxy`; None on stdio: no per-client cap): counted, never logged. Every
anonymous inbox has a session token of its own, so the per-credential cap alone would let one client
making inboxes take the whole total (the attacker review after issue 45).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mailroom.db.hub import Hub

T = TypeVar("T")

CAPS_TTL = 10.0  # seconds the caps read from SQL are kept before they are read again
EXPIRY_SLACK = 0.05  # seconds past expires_in before the look that finds the inbox expired
LONGEST_SLEEP = 600.0  # a group looks at least this often, whatever the inbox's expiry

Look = Callable[[bool], Awaitable[dict[str, Any]]]
_DEADLINE = object()  # a member's outcome when its deadline passed first


def _past(member: asyncio.Future) -> None:
    if not member.done():
        member.set_result(_DEADLINE)


class _Group:
    """The waits of one (credential, inbox, filter, cursor): one look per wake-up, one outcome for all."""

    def __init__(self, waits: Waits, key: tuple, mailbox_id: int, look: Look, expires_in: float) -> None:
        self.waits = waits
        self.key = key
        self.mailbox_id = mailbox_id
        self.look = look
        # one future per member, each set when the group ends (a member that leaves drops its own: O(1),
        # where thousands of waits on one shared future would each scan its callbacks)
        self.members: set[asyncio.Future] = set()
        self.event = waits.hub.subscribe(mailbox_id)
        self.task = asyncio.ensure_future(self._run(expires_in))

    async def _run(self, expires_in: float) -> None:
        try:
            while True:
                # the first member looked before the group was subscribed: look once more at once, so a
                # delivery in between is seen; then at every wake-up, never later than the expiry
                self.event.clear()
                try:
                    found = await self.look(False)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - SQL's refusal (MR205, MR206 …) or the database's ends them all
                    self._end(exc=exc)
                    return
                self.waits.looks += 1
                if found.get("message") is not None:
                    self._end(result=found["message"])
                    return
                expires_in = float(found.get("expires_in") or 0)
                idle = min(expires_in + EXPIRY_SLACK, LONGEST_SLEEP)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.event.wait(), self.waits.hub.wait_timeout(idle))
        finally:
            self.waits.forget(self)

    def _end(self, *, result: Any = None, exc: BaseException | None = None) -> None:
        self.waits.forget(self)  # a wait that comes later starts a group of its own (and looks at once)
        for member in self.members:
            if member.done():
                continue
            if exc is not None:
                member.set_exception(exc)
            else:
                member.set_result(result)

    def join(self) -> asyncio.Future:
        member = asyncio.get_running_loop().create_future()
        self.members.add(member)
        return member

    def leave(self, member: asyncio.Future) -> None:
        self.members.discard(member)
        if not self.members:
            self.task.cancel()
            self.waits.forget(self)


class Waits:
    """A server process's waits: their caps, their groups, what they cost (for tests and metrics)."""

    def __init__(self, hub: Hub, *, caps: Callable[[], Awaitable[dict[str, tuple[int, int, int]]]],
                 refuse: Callable[[str, str], Awaitable[None]]) -> None:
        self.hub = hub
        self._read_caps = caps
        self._refuse = refuse
        self._caps: dict[str, tuple[int, int, int]] | None = None
        self._caps_at = 0.0
        self._held: dict[str, dict[bytes, int]] = {}  # per kind, per credential
        self._clients: dict[str, dict[str, int]] = {}  # per kind, per client address
        self._armed: dict[str, int] = {}  # the sums of _held (read by the metrics thread: plain ints)
        self._groups: dict[tuple, _Group] = {}
        self.looks = 0  # the groups' looks (not the waits' first and last), since start

    # -- what tests and metrics read ------------------------------------------------------------

    def armed(self, kind: str = "wait") -> int:
        """Waits (or event streams: kind events) admitted and not yet ended."""
        return self._armed.get(kind, 0)

    @property
    def groups(self) -> int:
        return len(self._groups)

    def register(self, registry: Any) -> None:
        """Export the waits on a Prometheus registry (a worker's --metrics-port): mailroom_waits{kind} armed,
        mailroom_wait_groups, mailroom_wait_looks_total (the groups' shared looks)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        waits = self

        class Collector:
            def collect(self) -> Any:
                armed = GaugeMetricFamily("mailroom_waits", "Waits (kind wait) and event streams (kind events) "
                                          "this server process holds.", labels=["kind"])
                for kind in ("wait", "events"):
                    armed.add_metric([kind], waits.armed(kind))
                yield armed
                yield GaugeMetricFamily("mailroom_wait_groups", "Groups of waits sharing one look per wake-up.",
                                        value=waits.groups)
                yield CounterMetricFamily("mailroom_wait_looks", "Looks the groups of waits made.", value=waits.looks)

        registry.register(Collector())

    # -- the caps -------------------------------------------------------------------------------

    async def caps(self, kind: str) -> tuple[int, int, int]:
        """(per credential, in total, per client address) of `kind`."""
        if self._caps is None or time.monotonic() - self._caps_at > CAPS_TTL:
            try:
                self._caps = await self._read_caps()
                self._caps_at = time.monotonic()
            except Exception:
                if self._caps is None:
                    raise  # never read: the face's error (the database is unavailable …)
        return self._caps[kind]

    async def take(self, kind: str, credential: bytes, client: str | None = None) -> Callable[[], None]:
        """Take one place of `kind` (wait, events) for `credential` from `client` (its address; None: not
        counted per client): the function that gives it back (once, however often it is called). Over a
        cap the face's refusal (SQL's, wait_refused: per credential, per client or in total) is raised
        instead."""
        per_credential, total, per_client = await self.caps(kind)
        held = self._held.setdefault(kind, {})
        clients = self._clients.setdefault(kind, {})
        if held.get(credential, 0) >= per_credential:
            await self._refuse(kind, "credential")
        if client is not None and clients.get(client, 0) >= per_client:
            await self._refuse(kind, "client")
        if self._armed.get(kind, 0) >= total:
            await self._refuse(kind, "total")
        held[credential] = held.get(credential, 0) + 1
        if client is not None:
            clients[client] = clients.get(client, 0) + 1
        self._armed[kind] = self._armed.get(kind, 0) + 1
        given_back = False

        def give_back() -> None:
            nonlocal given_back
            if given_back:
                return
            given_back = True
            self._armed[kind] -= 1
            _drop(held, credential)
            if client is not None:
                _drop(clients, client)

        return give_back

    @contextlib.asynccontextmanager
    async def admitted(self, kind: str, credential: bytes, client: str | None = None) -> Any:
        """One place of `kind` for `credential` from `client` while the block runs (take)."""
        give_back = await self.take(kind, credential, client)
        try:
            yield
        finally:
            give_back()

    # -- the wait -------------------------------------------------------------------------------

    async def wait(self, *, credential: bytes, key: tuple, look: Look, timeout: float,
                   client: str | None = None) -> Any:
        """The message a wait answers (its `message` document), or the error of the look that ended it.
        `key` names what it waits for besides the credential and the inbox (its filter and cursor);
        `client` is the caller's address (counted against the per-client cap; None: not counted)."""
        deadline = time.monotonic() + max(timeout, 0.0)
        first = await look(timeout <= 0)
        if first.get("message") is not None:
            return first["message"]
        async with self.admitted("wait", credential, client):
            mailbox_id = int(first["mailbox_id"])
            group_key = (credential, mailbox_id, *key)
            group = self._groups.get(group_key)
            if group is None:
                group = self._groups[group_key] = _Group(self, group_key, mailbox_id, look,
                                                         float(first.get("expires_in") or 0))
            member = group.join()
            # the deadline ends the member's future with _DEADLINE (a timer, not wait_for: thousands of waits
            # leaving at once then cost a cancel each, not wait_for's extra futures)
            timer = asyncio.get_running_loop().call_later(max(deadline - time.monotonic(), 0), _past, member)
            try:
                found = await member
                if found is not _DEADLINE:
                    return found
            finally:
                timer.cancel()
                group.leave(member)
        # the deadline passed: its own last look (SQL answers "timed out" when nothing came)
        last = await look(True)
        return last["message"]

    def forget(self, group: _Group) -> None:
        if self._groups.get(group.key) is group:
            del self._groups[group.key]
            self.hub.unsubscribe(group.mailbox_id, group.event)


class LookSlots:
    """The looks of waits and event streams (their first look, a group's look per wake-up, a stream's look)
    take at most half of a face's pool at once: the calls of every other request never queue behind a
    burst of them. Measured (docs/reliability.md, "Load held"): 1,000 MCP waits arming, or 5,000 event
    streams opening and then woken by their mail, queued another owner's call behind theirs in the one FIFO
    of the pool (its p99 1.7 to 2.4 s, and 503s past --pool-timeout)."""

    def __init__(self, pool_size: int) -> None:
        self.size = max(1, pool_size // 2)
        self._slots = asyncio.Semaphore(self.size)
        self.busy = 0  # looks holding a slot (tests)

    async def run(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` once a slot is free, holding it until it answers."""
        async with self._slots:
            self.busy += 1
            try:
                return await call()
            finally:
                self.busy -= 1


def _drop(counts: dict, key: Any) -> None:
    left = counts.get(key, 1) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)


async def until_disconnected(work: Awaitable[T], receive: Callable[[], Awaitable[dict]]) -> tuple[bool, T | None]:
    """Run `work` while watching the ASGI `receive` for `http.disconnect` (a request whose body was
    read: the next message is its disconnect): (True, result) when it finished, (False, None) when the
    client went first, `work` cancelled at once (so a wait leaves its group within the second)."""
    task = asyncio.ensure_future(work)
    gone = False

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return True, await task
    except asyncio.CancelledError:
        if gone and task.cancelled():
            return False, None  # the client's: the call is over, nobody to answer
        raise
    finally:
        watcher.cancel()


class CancelOnDisconnect:
    """Pure ASGI middleware: a POST to `path` whose client goes away once its body was read has its
    handling cancelled (MCP's `wait_for_message` through the SDK's own transport, which never asks
    for the disconnect: with MAILROOM_FAST_PATHS=off, or for a request the fast path hands on). It
    owns the `receive` channel once the body is in: the inner app asking again gets the disconnect
    when it comes, so nobody reads the channel twice."""

    def __init__(self, app: Any, path: str) -> None:
        self.app = app
        self.path = path

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]], send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope["path"].rstrip("/") != self.path:
            await self.app(scope, receive, send)
            return
        body_done, gone = asyncio.Event(), asyncio.Event()

        async def inner_receive() -> dict:
            if body_done.is_set():
                await gone.wait()
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
            elif not message.get("more_body", False):
                body_done.set()
            return message

        task = asyncio.ensure_future(self.app(scope, inner_receive, send))

        async def watch() -> None:
            await body_done.wait()
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()
            task.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await task
        except asyncio.CancelledError:
            if not (gone.is_set() and task.cancelled()):
                raise  # not the client's: the server is stopping
        finally:
            watcher.cancel()
