"""DATA read in blocks (InboundSMTP._read_data_bulk) gives what it gives line by line.

Three servers on 127.0.0.1, each in this process's event loop thread: InboundSMTP reading DATA in
blocks (the default), InboundSMTP reading it line by line (bulk_data = False, aiosmtpd's way), and
aiosmtpd's stock SMTP. A raw socket client sends the same bytes to each, cut into writes at random
places (a CRLF and the final dot split across reads, the next command pipelined behind the dot):
dot-stuffed lines, lines starting with '.', bare LF and CR, lines at, under and over the line
limit, messages at and over the server's SIZE and over a recipient's limit (the size probe). The
block reader must give the same message bytes, the same reply, the same size probes (same sizes,
same order) as the line reader, and the session must go on the same; where the line reader stores
a message, aiosmtpd's stock DATA stores the same bytes.

The recording handler stands in for the database (the DATA bytes are what is compared here; the
real server stores them through deliver_message, tests/inboxes/test_inbox_smtp.py).
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time

import pytest
from aiosmtpd.smtp import SMTP

from mailroom.core import fastpaths
from mailroom.inboxes.smtp import _SIZE_PROBE_BYTES, InboundSMTP, InboxHandler, _smtp_class

MAX_LINE = 200  # --max-line-length of these servers: a line of more than MAX_LINE + 1 octets is too long
LIMIT = MAX_LINE + 1
# the first size probe (past _SIZE_PROBE_BYTES) is told the message fits, the second (past twice
# that) that it does not, below the server's SIZE
PLAN_LIMIT = _SIZE_PROBE_BYTES + 40_000  # what the recipient's plan takes (the probe's answer)
CAP = 2 * _SIZE_PROBE_BYTES + 90_000  # the server's SIZE


class Recorder(InboxHandler):
    """Accepts every recipient; records each message, each size probe."""

    def __init__(self) -> None:
        super().__init__(delivery=None)  # type: ignore[arg-type]
        self.messages: list[bytes] = []
        self.probes: list[int] = []

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # noqa: N802
        envelope.rcpt_tos.append(address)
        if hasattr(envelope, "accepted"):
            envelope.accepted.append(address)
            envelope.accepted_count += 1
        return "250 2.1.5 OK"

    async def handle_DATA(self, server, session, envelope):  # noqa: N802
        self.messages.append(bytes(envelope.original_content))
        return "250 2.0.0 stored"

    async def size_refusal(self, envelope, size):
        self.probes.append(size)
        await asyncio.sleep(0)  # a real await, as the database's
        return "552 5.3.4 over the plan's size" if size > PLAN_LIMIT else None


class Bulk(_smtp_class(MAX_LINE)):
    bulk_data = True  # the default, unless MAILROOM_FAST_PATHS=off: the block reader itself is compared here


class Lines(_smtp_class(MAX_LINE)):
    bulk_data = False


class Stock(SMTP):
    line_length_limit = LIMIT


@pytest.fixture(scope="module")
def servers():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    made = {}

    async def start():
        for name, cls in (("bulk", Bulk), ("lines", Lines), ("stock", Stock)):
            handler = Recorder()
            server = await loop.create_server(
                lambda cls=cls, handler=handler: cls(handler, data_size_limit=CAP, enable_SMTPUTF8=True,
                                                     decode_data=False, hostname="test", loop=loop),
                host="127.0.0.1", port=0)
            made[name] = (server, handler, server.sockets[0].getsockname()[1])

    asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    # the served default; and the StreamReader buffer the block reader gives back what it read past the end
    # through (asyncio's private _buffer: without it InboundSMTP silently reads line by line)
    assert _smtp_class(MAX_LINE).bulk_data is fastpaths.enabled()
    assert isinstance(asyncio.StreamReader(loop=loop)._buffer, bytearray)
    try:
        yield {name: (handler, port) for name, (_, handler, port) in made.items()}
    finally:
        for server, _, _ in made.values():
            loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


class Client:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        assert self.reply().startswith("220")

    def reply(self) -> str:
        while True:
            while b"\r\n" not in self.buf:
                data = self.sock.recv(65536)
                assert data, "connection closed"
                self.buf += data
            line, self.buf = self.buf.split(b"\r\n", 1)
            if line[3:4] != b"-":
                return line.decode()

    def command(self, text: str) -> str:
        self.sock.sendall(text.encode() + b"\r\n")
        return self.reply()

    def close(self) -> None:
        self.sock.close()


def transaction(port: int, payload: bytes, cuts: list[int], pause: float) -> tuple[str, str, str]:
    """EHLO, MAIL, RCPT, DATA, payload (its final '.\r\n' included) in writes cut at `cuts`, with
    NOOP pipelined right behind the dot; then the replies of DATA, of NOOP and of one more MAIL."""
    client = Client(port)
    try:
        assert client.command("EHLO client.test").startswith("250")
        assert client.command("MAIL FROM:<a@example.com>").startswith("250")
        assert client.command("RCPT TO:<b@example.com>").startswith("250")
        assert client.command("DATA").startswith("354")
        data = payload + b"NOOP\r\n"
        start = 0
        for cut in [*sorted(set(cuts)), len(data)]:
            if start < cut <= len(data):
                client.sock.sendall(data[start:cut])
                start = cut
                if pause:
                    time.sleep(pause)
        reply = client.reply()
        noop = client.reply()
        after = client.command("MAIL FROM:<c@example.com>")
        client.command("QUIT")
        return reply, noop, after
    finally:
        client.close()


def run_everywhere(servers, payload: bytes, cuts: list[int], pause: float = 0.0) -> bool:
    """True when aiosmtpd's stock DATA stored the message too (and so the same bytes)."""
    results = {}
    for name, (handler, port) in servers.items():
        handler.messages.clear()
        handler.probes.clear()
        reply, noop, after = transaction(port, payload, cuts, pause)
        results[name] = (reply, noop, after, list(handler.messages), list(handler.probes))
    bulk, lines, stock = results["bulk"], results["lines"], results["stock"]
    assert bulk == lines, f"payload of {len(payload)} bytes, cuts {cuts}"
    assert bulk[1].startswith("250") and bulk[2].startswith("250"), bulk[:3]
    if lines[0].startswith("250") and stock[0].startswith("250"):
        # (stock also refuses a line of LIMIT - 1 or LIMIT octets plus its CRLF, which InboundSMTP takes)
        assert stock[3] == lines[3]
        return True
    return False


ALPHABET = [b"a", b"b", b" ", b".", b"..", b"\n", b"\r", b"\x00", b"\xc3\xa9", b"\t", b"z" * 40]


def random_line(rng: random.Random, long_lines: bool) -> bytes:
    kind = rng.random()
    if long_lines and kind < 0.05:  # near the line limit
        return rng.choice([b".", b"x", b".."]) + b"y" * (LIMIT - 1 + rng.randint(-2, 2))
    if kind < 0.2:
        return b"." * rng.randint(1, 4)
    if kind < 0.25:
        return b""
    return b"".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 30)))


def random_body(rng: random.Random, lines: int) -> bytes:
    long_lines = rng.random() < 0.5
    while True:
        body = b"".join(random_line(rng, long_lines) + b"\r\n" for _ in range(lines))
        if b"\r\n.\r\n" not in body and not body.startswith(b".\r\n"):
            return body
        body = body.replace(b"\r\n.\r\n", b"\r\n..\r\n")
        if b"\r\n.\r\n" not in body and not body.startswith(b".\r\n"):
            return body


def random_cuts(rng: random.Random, payload: bytes) -> list[int]:
    n = len(payload)
    cuts = [rng.randint(1, n) for _ in range(rng.randint(0, 8))]
    # the final CRLF.CRLF split: between its CR and LF, before and after the dot
    cuts.append(n - rng.choice([1, 2, 3, 4]))
    crlf = payload.find(b"\r\n")
    if crlf != -1:
        cuts.append(crlf + 1)  # a CRLF across two reads
    return cuts


@pytest.mark.parametrize("seed", range(12))
def test_random_messages_read_the_same(servers, seed):
    rng = random.Random(seed)
    stored_by_stock = 0
    for _ in range(30):
        payload = random_body(rng, rng.randint(0, 40)) + b".\r\n"
        stored_by_stock += run_everywhere(servers, payload, random_cuts(rng, payload),
                                          pause=0.002 if rng.random() < 0.3 else 0.0)
    assert stored_by_stock >= 3  # the comparison with aiosmtpd's stock DATA is not vacuous


PROBE = _SIZE_PROBE_BYTES


@pytest.mark.parametrize("size", [PROBE - 1, PROBE, PROBE + 1, PROBE + 2, PLAN_LIMIT, PLAN_LIMIT + 1, 2 * PROBE,
                                  2 * PROBE + 1, 2 * PROBE + 300, CAP - 1, CAP, CAP + 1, 2 * CAP])
@pytest.mark.parametrize("stuffed", [False, True])
def test_sizes_around_the_limits_read_the_same(servers, size, stuffed):
    """Messages of exactly `size` octets once dot-stuffing is removed, lines of LIMIT - 1 octets
    (when stuffed, every line sent as '..' + the rest: one more octet on the wire)."""
    rng = random.Random(size)
    line = LIMIT - 1
    full, last = divmod(size, line + 2)
    lines = [b"." + b"x" * (line - 1) if stuffed else b"x" * line for _ in range(full)]
    if last >= 2:
        lines.append(b"y" * (last - 2))
    body = b"".join(x + b"\r\n" for x in lines)
    if last == 1:  # one octet short of a line: make the previous line one octet longer
        body = body[:-2] + b"z\r\n"
    wire = b"".join(b"." + x + b"\r\n" if x.startswith(b".") else x + b"\r\n" for x in lines)
    if last == 1:
        wire = wire[:-2] + b"z\r\n"
    assert len(body) == size
    run_everywhere(servers, wire + b".\r\n", random_cuts(rng, wire + b".\r\n"))


@pytest.mark.parametrize("length", [LIMIT - 1, LIMIT, LIMIT + 1, LIMIT + 2, 3 * LIMIT, 70_000])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_long_lines_read_the_same(servers, length, where):
    rng = random.Random(length)
    long = b"." + b"L" * (length - 1)
    before = [] if where == "first" else [b"a", b".b"]
    after = [] if where == "last" else [b"..c", b"d"]
    payload = b"".join(x + b"\r\n" for x in [*before, long, *after]) + b".\r\n"
    for cuts in ([], random_cuts(rng, payload), list(range(1, len(payload), 97))):
        run_everywhere(servers, payload, cuts)


def test_a_long_line_ending_in_cr_across_reads(servers):
    """A too long line whose CR and LF arrive in different reads, then a line and the end."""
    payload = b"x" * (3 * LIMIT) + b"\r\n.y\r\n.\r\n"
    cr = 3 * LIMIT + 1
    for cuts in ([cr], [cr - 1, cr], [LIMIT, cr, cr + 2], [cr + 1, cr + 3]):
        run_everywhere(servers, payload, cuts, pause=0.005)


def test_empty_message_and_pipelined_commands(servers):
    run_everywhere(servers, b".\r\n", [])
    run_everywhere(servers, b".\r\n", [1, 2], pause=0.005)
    run_everywhere(servers, b"\r\n.\r\n", [1, 2, 3, 4], pause=0.005)
    run_everywhere(servers, b"..\r\n.\r\n", [])


def test_the_block_reader_is_the_one_in_use(servers):
    """smtp_DATA falls back to the line reader when the StreamReader has no bytearray _buffer (where
    the block reader gives back what it read past the end): on this Python it must not."""

    async def probe() -> object:
        return getattr(asyncio.StreamReader(limit=LIMIT), "_buffer", None)

    assert isinstance(asyncio.run(probe()), bytearray)
    calls = []
    original = InboundSMTP._read_data_bulk

    async def counting(self, *args):
        calls.append(1)
        return await original(self, *args)

    InboundSMTP._read_data_bulk = counting
    try:
        run_everywhere(servers, b"a\r\n.\r\n", [])
    finally:
        InboundSMTP._read_data_bulk = original
    assert calls == [1]  # the bulk server only (the line server and the stock one do not call it)
