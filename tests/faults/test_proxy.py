"""The fault proxy itself (tests/faults/proxy.py), against an echo server on 127.0.0.1: each fault does
what the suite relies on, and a fixed seed fixes its choices."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from proxy import Proxy, ProxyLoop


@pytest.fixture(scope="module")
def loop():
    proxies = ProxyLoop()
    yield proxies
    proxies.stop()


@pytest.fixture(scope="module")
def echo(loop):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with __import__("contextlib").suppress(OSError):
            while data := await reader.read(4096):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def start() -> asyncio.base_events.Server:
        return await asyncio.start_server(handle, "127.0.0.1", 0)

    server = loop.call(start())
    yield server.sockets[0].getsockname()[1]
    loop.loop.call_soon_threadsafe(server.close)


def _client(port: int, timeout: float = 2.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def _round_trip(sock: socket.socket, payload: bytes = b"ping") -> bytes:
    sock.sendall(payload)
    return sock.recv(4096)


def test_forwards_then_latency(loop, echo):
    proxy = Proxy(loop, "plain", ("127.0.0.1", echo), seed=1)
    with _client(proxy.port) as sock:
        before = time.monotonic()
        assert _round_trip(sock) == b"ping"
        assert proxy.first_round_trip_after(before) is not None
        proxy.set_fault("latency", delay=0.3, jitter=0.0)
        started = time.monotonic()
        assert _round_trip(sock) == b"ping"
        assert time.monotonic() - started >= 0.55  # both ways: 0.3 s each
        assert proxy.stats["delayed"] == 2  # the ping up and its echo down
        proxy.clear()
        assert _round_trip(sock) == b"ping"
        assert proxy.stats["delayed"] == 2  # cleared: no chunk of this round trip waited (counted, not timed)
    proxy.close()


def test_reset_mid_stream_is_a_rst(loop, echo):
    proxy = Proxy(loop, "reset", ("127.0.0.1", echo), seed=1)
    with _client(proxy.port) as sock:
        assert _round_trip(sock) == b"ping"
        proxy.set_fault("reset", probability=1.0)
        with pytest.raises(ConnectionResetError):
            _round_trip(sock)
            _round_trip(sock)
    assert proxy.stats["reset"] == 1
    proxy.clear()
    with _client(proxy.port) as sock:
        assert _round_trip(sock) == b"ping"
        assert proxy.reset_all() == 1
        with pytest.raises(ConnectionResetError):
            _round_trip(sock)
            _round_trip(sock)
    proxy.close()


def test_blackhole_accepts_and_forwards_nothing_then_resets_what_it_held(loop, echo):
    proxy = Proxy(loop, "blackhole", ("127.0.0.1", echo), seed=1)
    with _client(proxy.port, timeout=0.5) as old:
        assert _round_trip(old) == b"ping"
        proxy.set_fault("blackhole")
        with pytest.raises(TimeoutError):
            _round_trip(old)  # an open connection: nothing more comes back
        with _client(proxy.port, timeout=0.5) as new:  # accepted …
            with pytest.raises(TimeoutError):
                _round_trip(new)  # … and never forwarded
            proxy.clear()
            with pytest.raises(ConnectionResetError):
                _round_trip(new)
    assert proxy.stats["held_new:blackhole"] == 1 and proxy.stats["released_with_rst"] == 2
    with _client(proxy.port) as sock:
        assert _round_trip(sock) == b"ping"
    proxy.close()


def test_half_open_closes_the_upstream_side_and_tells_the_client_nothing(loop):
    ended = threading.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(4096):
            writer.write(data)
        ended.set()  # the server saw its peer go
        writer.close()

    server = loop.call(asyncio.start_server(handle, "127.0.0.1", 0))
    proxy = Proxy(loop, "half", ("127.0.0.1", server.sockets[0].getsockname()[1]), seed=1)
    with _client(proxy.port, timeout=0.5) as sock:
        assert _round_trip(sock) == b"ping"
        proxy.set_fault("half_open")
        assert ended.wait(2), "the upstream side was not closed"
        sock.sendall(b"more")  # accepted, swallowed
        with pytest.raises(TimeoutError):
            sock.recv(10)  # no EOF, no RST: the client is not told
        proxy.clear()
        with pytest.raises(ConnectionResetError):
            _round_trip(sock)
    proxy.close()
    loop.loop.call_soon_threadsafe(server.close)


def test_a_fixed_seed_fixes_the_choices(loop, echo):
    a = Proxy(loop, "same", ("127.0.0.1", echo), seed=7)
    b = Proxy(loop, "same", ("127.0.0.1", echo), seed=7)
    c = Proxy(loop, "same", ("127.0.0.1", echo), seed=8)
    draws = [[p.rng.random() for _ in range(5)] for p in (a, b, c)]
    assert draws[0] == draws[1] != draws[2]
    for p in (a, b, c):
        p.close()
