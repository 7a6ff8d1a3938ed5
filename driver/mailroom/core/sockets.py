"""A server's own TCP socket, bound before it serves (so that port 0 can be logged as the port it got,
and a port already taken is one clear error): the HTTP faces' listening socket and `inbox serve
--workers`' reserved port share one bind."""

from __future__ import annotations

import socket

from mailroom.core.errors import UserError


def bound_socket(host: str, port: int, *, options: tuple[tuple[int, int], ...] = ()) -> socket.socket:
    """A TCP socket bound to host:port with SO_REUSEADDR and `options` ((level, name) pairs set to 1);
    UserError when the address cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for level, name in options:
        sock.setsockopt(level, name, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def listening_socket(host: str, port: int) -> socket.socket:
    """The listening socket of an HTTP face (`http serve`, `mcp --http-port`). TCP_NODELAY is set on it,
    and Linux hands it to every connection it accepts: uvicorn takes `http serve`'s socket by its fd as a
    unix socket (`socket.fromfd(fd, AF_UNIX, …)`), so neither asyncio nor uvloop set it, and Nagle held
    each response's second write until the client's delayed ACK: ~40 ms a request (wrk's p50 44 ms with
    the machine less than half busy, docs/benchmarks.md issue 46)."""
    sock = bound_socket(host, port, options=((socket.IPPROTO_TCP, socket.TCP_NODELAY),))
    sock.listen(1024)
    return sock
