"""Parsing untrusted mail off the event loop: a few worker processes owned by a server (the inbox
server's SMTP sessions, the HTTP server's SES hook and attachment downloads).

The parsers are linear and bounded (mailroom.inboxes.mime, .bounce), but a 25 MiB message still
costs a second or so, and Python's `re` and the parsers hold the GIL: a thread would stall every
other session as surely as the event loop itself. So a message over INLINE_BYTES is handed to one
of `workers` processes (multiprocessing, spawn: a clean interpreter that holds no socket or pool
of the server), the bytes sent and the result received in a thread that waits on the pipe while
the event loop serves other sessions. Smaller messages are parsed inline (a few milliseconds at
most, tests/inboxes/test_parser_complexity.py).

Bounds: a bounce is cut at mailroom.inboxes.bounce.MAX_BOUNCE_BYTES before it is handed over (a
report precedes the original it returns); a message is never more than the server's SIZE. A
parse that takes longer than `timeout` seconds (none should: the parsers are linear) ends with
the worker killed and replaced; the message is then stored with its raw bytes only, the bounce
noted as unparsed. Parsing never raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import signal
from multiprocessing.connection import Connection
from typing import Any

from mailroom.core.log import get_logger
from mailroom.inboxes.bounce import MAX_BOUNCE_BYTES, parse_bounce
from mailroom.inboxes.mime import ParsedMessage, find_part, find_parts, parse_message

log = get_logger("inbox")

INLINE_BYTES = 16 * 1024  # parsed on the event loop up to this size (worst case a few ms)
DEFAULT_WORKERS = 2
DEFAULT_TIMEOUT = 30.0  # seconds; a linear parse of the largest message takes about one


def _serve(conn: Connection) -> None:
    """A worker process: parse what the pipe brings until it is closed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server decides when workers stop
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        kind, raw, extra = job
        result: Any
        if kind == "message":
            result = parse_message(raw)
        elif kind == "bounce":
            result = parse_bounce(raw)
        elif kind == "parts":
            result = find_parts(raw, extra)
        else:
            result = find_part(raw, extra)
        try:
            conn.send(result)
        except (BrokenPipeError, OSError):
            return


class _Worker:
    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_serve, args=(child,), daemon=True, name="mailroom-parse")
        self.process.start()
        child.close()

    def call(self, kind: str, raw: bytes, extra: Any = None) -> Any:
        """Blocking: run in a thread."""
        self.conn.send((kind, raw, extra))
        return self.conn.recv()

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
        with contextlib.suppress(Exception):
            self.conn.close()
        self.process.join(5)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.send(None)
        self.process.join(2)
        if self.process.is_alive():
            self.kill()
        with contextlib.suppress(Exception):
            self.conn.close()


class ParsePool:
    """Parsing processes (the inbox server's, the HTTP server's): `await message(raw)`,
    `await bounce(raw)`, `await part(raw, sha256)`, `await parts(raw, sha256s)`."""

    def __init__(self, workers: int = DEFAULT_WORKERS, timeout: float = DEFAULT_TIMEOUT,
                 inline_bytes: int = INLINE_BYTES, *, lazy: bool = False) -> None:
        self.size = max(1, workers)
        # lazy: start() starts nothing; the workers start at the first message over inline_bytes (a
        # server that sees none holds no parsing interpreter: issue 46, item 5, about 37 MiB PSS of the
        # idle `mailroom run` for two workers and multiprocessing's resource tracker)
        self.lazy = lazy
        self.timeout = timeout
        self.inline_bytes = inline_bytes
        self._ctx = multiprocessing.get_context("spawn")
        self._idle: asyncio.Queue[_Worker] | None = None
        self._all: list[_Worker] = []
        self._starting: asyncio.Lock | None = None

    async def start(self) -> None:
        """Start the workers (in a thread: spawning waits for each interpreter to come up). Not
        needed before the first call (it starts them then), but a server starts them first so a
        failure shows at once; a lazy pool starts them at the first call only."""
        if not self.lazy:
            await self._start()

    async def _start(self) -> None:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._idle is not None:
                return
            workers = await asyncio.to_thread(lambda: [_Worker(self._ctx) for _ in range(self.size)])
            idle: asyncio.Queue[_Worker] = asyncio.Queue()
            for worker in workers:
                self._all.append(worker)
                idle.put_nowait(worker)
            self._idle = idle

    async def close(self) -> None:
        workers, self._all = self._all, []
        await asyncio.to_thread(lambda: [w.stop() for w in workers])

    async def message(self, raw: bytes) -> ParsedMessage:
        """The parsed fields of a message; ParsedMessage() (raw bytes only) when the parse failed."""
        if len(raw) <= self.inline_bytes:
            return parse_message(raw)
        result = await self._run("message", raw)
        return result if isinstance(result, ParsedMessage) else ParsedMessage(defects=1)

    async def bounce(self, raw: bytes) -> list[dict[str, Any]]:
        """The reports of a bounce ([] when nothing could be read)."""
        raw = raw[:MAX_BOUNCE_BYTES]
        if len(raw) <= self.inline_bytes:
            return parse_bounce(raw)
        result = await self._run("bounce", raw)
        return result if isinstance(result, list) else []

    async def part(self, raw: bytes, sha256_hex: str) -> bytes | None:
        """mime.find_part: the decoded payload of an attachment of a stored message, or None."""
        if len(raw) <= self.inline_bytes:
            return find_part(raw, sha256_hex)
        result = await self._run("part", raw, sha256_hex)
        return result if isinstance(result, bytes) else None

    async def parts(self, raw: bytes, sha256_hexes: frozenset[str]) -> dict[str, bytes]:
        """mime.find_parts: the decoded payloads of several parts of a stored message in one walk."""
        if len(raw) <= self.inline_bytes:
            return find_parts(raw, sha256_hexes)
        result = await self._run("parts", raw, frozenset(sha256_hexes))
        return result if isinstance(result, dict) else {}

    async def _run(self, kind: str, raw: bytes, extra: Any = None) -> Any:
        await self._start()
        # shielded: a session that goes away mid-parse does not leave a worker with a reply in its
        # pipe (the parse ends, or times out, and the worker goes back or is replaced)
        return await asyncio.shield(asyncio.ensure_future(self._call(kind, raw, extra)))

    async def _call(self, kind: str, raw: bytes, extra: Any) -> Any:
        assert self._idle is not None
        worker = await self._idle.get()
        try:
            return await asyncio.wait_for(asyncio.to_thread(worker.call, kind, raw, extra), self.timeout)
        except Exception as exc:  # noqa: BLE001 - a timeout or a dead worker: replace it, never raise
            if isinstance(exc, TimeoutError):
                log.warning("parsing a %d-byte %s took over %gs: kept unparsed", len(raw), kind, self.timeout)
            else:
                log.error("parsing a %d-byte %s failed: %s", len(raw), kind, type(exc).__name__)
            worker = await self._replace(worker)
            return None
        finally:
            self._idle.put_nowait(worker)

    async def _replace(self, worker: _Worker) -> _Worker:
        await asyncio.to_thread(worker.kill)
        fresh = await asyncio.to_thread(_Worker, self._ctx)
        self._all = [fresh if w is worker else w for w in self._all]
        return fresh
