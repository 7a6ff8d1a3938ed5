"""A TCP fault proxy for tests: pure Python asyncio, portable (no netem, no root).

One `ProxyLoop` (an asyncio loop in a daemon thread) runs any number of `Proxy`s. A proxy listens on
127.0.0.1 (a free port) and forwards each connection to its upstream: a (host, port) or the path of a
unix socket (a private cluster's socket: the client speaks TCP to the proxy, PostgreSQL sees a local
connection). The test changes its fault at run time, from its own thread:

    proxy.set_fault("latency", delay=0.3, jitter=0.2)   # every chunk waits 0.3–0.5 s, order kept
    proxy.set_fault("reset", probability=0.2)           # each chunk may end its connection with a RST,
                                                        # both ways: mid-stream, mid-transaction
    proxy.set_fault("blackhole")                        # new connections are accepted and never
                                                        # forwarded; open ones forward nothing more
    proxy.set_fault("half_open")                        # the upstream side of every connection is
                                                        # closed, the client is not told: what it
                                                        # sends is swallowed, nothing comes back
    proxy.set_fault("lose_reply", min_request=2000, count=1, after_commit=1)
                                                        # the answer to the next request of at least
                                                        # 2000 bytes (all sent since the last answer
                                                        # that ended idle) is dropped and its connection
                                                        # reset both ways: the server did the work,
                                                        # the client never hears of it (count times;
                                                        # after_commit: only a chunk that ends with
                                                        # PostgreSQL's ReadyForQuery, idle)
    proxy.reset_all()                                   # a RST to every open connection, now
    proxy.clear()                                       # no fault; the connections a blackhole or a
                                                        # half-open fault held get a RST

A userspace proxy cannot withhold TCP acknowledgements (its kernel acknowledges what the client
sends), so a client's keepalives and `tcp_user_timeout` never fire on a held connection: it sees a
peer that accepted and went silent, and only its own timeouts (connect_timeout, a statement or SMTP
timeout, a pool's wait) get it out. Held connections end with a RST when the fault is cleared, as
the kernel's timers would have ended them during a long outage.

Randomness (latency jitter, which chunk a reset hits) comes from a `random.Random(seed)` per proxy:
with a fixed seed the sequence of choices is fixed (which connection meets it still depends on
timing). `stats` counts what was done; `replies` holds the monotonic time of every upstream → client
chunk and `requests` of every client → upstream chunk, so a test can find the first round trip after a
moment (`first_round_trip_after`).
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import random
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from typing import Any

# PostgreSQL's ReadyForQuery, idle: the end of the answer to a transaction that committed
_IDLE = b"Z\x00\x00\x00\x05I"
KINDS = ("latency", "reset", "blackhole", "half_open", "lose_reply")
CHUNK = 65536


class ProxyLoop:
    """An asyncio loop in a daemon thread, for the proxies; `call` runs a coroutine on it and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fault-proxy", daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        """Cancel what still runs (held connections, pumps), then stop the loop."""

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.call(cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def _rst(writer: asyncio.StreamWriter | None) -> None:
    """Close with a RST (SO_LINGER 0), not a FIN: the peer reads ECONNRESET."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError, AttributeError):
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Conn:
    def __init__(self, proxy: Proxy, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client_r, self.client_w = client_r, client_w
        self.up_r: asyncio.StreamReader | None = None
        self.up_w: asyncio.StreamWriter | None = None
        self.held = False  # a blackhole or a half-open fault holds it: a RST when the fault is cleared
        self.half_open = False
        self.closed = False
        self.tasks: list[asyncio.Task] = []
        self.last_request = 0  # bytes sent client -> upstream since the last answer that ended idle

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        _rst(self.client_w)
        _rst(self.up_w)
        for task in self.tasks:
            task.cancel()
        self.proxy.conns.discard(self)

    def close_upstream(self) -> None:
        """Half-open: the upstream side goes (the server sees EOF and ends the session), the client
        side stays open and is told nothing."""
        self.half_open = self.held = True
        if self.up_w is not None:
            self.up_w.transport.abort()


class Proxy:
    """See the module docstring. `name` labels its stats; `upstream` is (host, port) or a unix socket path."""

    def __init__(self, loop: ProxyLoop, name: str, upstream: tuple[str, int] | str, seed: int = 0) -> None:
        self.loop = loop
        self.name = name
        self.upstream = upstream
        self.rng = random.Random(f"{seed}:{name}")
        self.kind: str | None = None
        self.params: dict[str, float] = {}
        self.conns: set[_Conn] = set()
        self.stats: collections.Counter[str] = collections.Counter()
        self.replies: list[float] = []
        self.requests: list[float] = []
        self._lock = threading.Lock()
        self._changed: asyncio.Event | None = None
        self.server: asyncio.base_events.Server | None = None
        self.port = loop.call(self._start())

    # -- control, from the test's thread ------------------------------------------------------
    def set_fault(self, kind: str, **params: float) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown fault {kind!r}; one of {KINDS}")
        self.loop.call(self._set(kind, params))

    def clear(self) -> None:
        self.loop.call(self._set(None, {}))

    def reset_all(self) -> int:
        """A RST to every open connection; returns how many."""
        return self.loop.call(self._reset_all())

    def close(self) -> None:
        self.loop.call(self._close())

    def first_round_trip_after(self, t: float) -> float | None:
        """The monotonic time of the first upstream → client chunk that follows a client → upstream chunk
        sent at or after `t` (a request answered), or None."""
        with self._lock:
            i = bisect.bisect_left(self.requests, t)
            if i == len(self.requests):
                return None
            j = bisect.bisect_right(self.replies, self.requests[i])
            return self.replies[j] if j < len(self.replies) else None

    # -- on the loop --------------------------------------------------------------------------
    async def _start(self) -> int:
        self._changed = asyncio.Event()
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _set(self, kind: str | None, params: dict[str, float]) -> None:
        previous = self.kind
        self.kind, self.params = kind, dict(params)
        if kind is not None:
            self.stats[f"fault:{kind}"] += 1
        if kind == "half_open":
            for conn in list(self.conns):
                conn.close_upstream()
                self.stats["half_opened"] += 1
        if kind == "blackhole":
            for conn in list(self.conns):
                conn.held = True
        if kind is None or (previous in ("blackhole", "half_open") and kind != previous):
            for conn in [c for c in self.conns if c.held]:
                conn.abort()
                self.stats["released_with_rst"] += 1
        assert self._changed is not None
        self._changed.set()
        self._changed = asyncio.Event()

    async def _reset_all(self) -> int:
        conns = list(self.conns)
        for conn in conns:
            conn.abort()
        self.stats["reset"] += len(conns)
        return len(conns)

    async def _close(self) -> None:
        if self.server is not None:
            self.server.close()
        for conn in list(self.conns):
            conn.abort()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # ProxyLoop.stop(): not an error of the callback
            await self._serve(client_r, client_w)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        conn = _Conn(self, client_r, client_w)
        self.conns.add(conn)
        self.stats["connections"] += 1
        if self.kind in ("blackhole", "half_open"):
            # accepted, never forwarded: the client waits for a greeting or an answer that never comes
            conn.held = True
            self.stats[f"held_new:{self.kind}"] += 1
            with contextlib.suppress(OSError):  # until the client goes or clear() aborts it (then EOF)
                while await client_r.read(CHUNK):
                    pass
            conn.abort()
            return
        try:
            if isinstance(self.upstream, str):
                conn.up_r, conn.up_w = await asyncio.open_unix_connection(self.upstream)
            else:
                conn.up_r, conn.up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            self.stats["upstream_refused"] += 1
            conn.abort()
            return
        up = asyncio.ensure_future(self._pump(conn, conn.client_r, lambda: conn.up_w, upward=True))
        down = asyncio.ensure_future(self._pump(conn, conn.up_r, lambda: conn.client_w, upward=False))
        conn.tasks += [up, down]
        await asyncio.gather(up, down, return_exceptions=True)
        if not conn.held:
            conn.closed = True
            self.conns.discard(conn)
            for w in (conn.client_w, conn.up_w):
                with contextlib.suppress(Exception):
                    w.close()

    async def _pump(self, conn: _Conn, reader: asyncio.StreamReader, writer_of: Any, *, upward: bool) -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    if conn.held:  # the upstream side ended by a half-open fault: the client is not told
                        await self._hold(conn)
                        return
                    with contextlib.suppress(OSError, RuntimeError):
                        writer_of().write_eof()
                    return
                while conn.held and not conn.closed:
                    if conn.half_open and upward:
                        break  # swallowed
                    await self._hold(conn)
                if conn.closed or (conn.half_open and upward):
                    continue
                if self.kind == "latency":
                    self.stats["delayed"] += 1  # a chunk held back (tests count it rather than time it)
                    await asyncio.sleep(self.params.get("delay", 0.2) + self.rng.uniform(0, self.params.get("jitter", 0.0)))
                if self.kind == "reset" and self.rng.random() < self.params.get("probability", 0.2):
                    self.stats["reset"] += 1
                    conn.abort()
                    return
                if upward:
                    conn.last_request += len(data)
                elif (self.kind == "lose_reply" and self.params.get("count", 1) > 0
                      and conn.last_request >= self.params.get("min_request", 0)
                      and (not self.params.get("after_commit") or data.endswith(_IDLE))):
                    self.params["count"] = self.params.get("count", 1) - 1
                    self.stats["lost_reply"] += 1
                    conn.abort()
                    return
                if conn.held:
                    continue
                if not upward and data.endswith(_IDLE):
                    conn.last_request = 0  # answered: the next request starts
                now = time.monotonic()
                with self._lock:
                    (self.requests if upward else self.replies).append(now)
                writer = writer_of()
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            if not conn.held:
                conn.abort()

    async def _hold(self, conn: _Conn) -> None:
        """Wait until the fault changes (the change ends a held connection with a RST)."""
        assert self._changed is not None
        await self._changed.wait()


def pick(rng: random.Random, weights: dict[str, float]) -> str:
    """One key of `weights`, drawn with `rng` (deterministic for a seed)."""
    keys = sorted(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys])[0]
