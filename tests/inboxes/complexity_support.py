"""Adversarial inputs for the parsers of untrusted mail, and a linear-time check that cannot hang.

Each family makes an input of size about n (bytes, or characters for an SMTP argument) from one
repeated construction (blank lines, dashes, quotes, deep nesting, many parts, long headers ...).
`growth(parser, family)` times the parser on n and on 8n in a child process and returns the
ratio; a linear parser gives about 8, a quadratic one 64. The child is killed once 8n has taken
more than LIMIT (16) times the time of n (plus a little), so a quadratic parser fails the check
in seconds instead of running for hours.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable

LIMIT = 16.0  # 8x the input may take at most 16x the time
GROWTH = 8
TARGET_SECONDS = 0.02  # n grows until one parse of n takes this long (timer noise stays small)
MAX_N = 4_000_000


# ---------------------------------------------------------------------------------------------
# the parsers, by name (the child imports them by name)


def _parser(name: str) -> Callable[[object], object]:
    if name == "bounce":
        from mailroom.inboxes.bounce import parse_bounce

        return parse_bounce
    if name == "mime":
        from mailroom.inboxes.mime import parse_message

        return parse_message
    if name == "plain_from":
        from mailroom.inboxes.mime import plain_from

        return plain_from
    if name == "smtp_path":  # what the server calls for MAIL FROM and RCPT TO
        from mailroom.inboxes.smtp import InboundSMTP

        server = InboundSMTP.__new__(InboundSMTP)
        server.local_part_limit = 64
        return server._getaddr
    raise KeyError(name)


# ---------------------------------------------------------------------------------------------
# the families: n -> input of about n units

HEAD = b"From: MAILER-DAEMON@relay.example.net\r\nTo: bounce@x.test\r\nSubject: Undelivered Mail\r\n"
PLAIN = HEAD + b"Content-Type: text/plain\r\n\r\n"


def _repeat(unit: bytes, n: int) -> bytes:
    return unit * max(1, n // len(unit))


def _nested(n: int) -> bytes:
    depth = max(1, n // 60)
    out = [HEAD, b"MIME-Version: 1.0\r\n"]
    for i in range(depth):
        out.append(b'Content-Type: multipart/mixed; boundary="b%d"\r\n\r\n--b%d\r\n' % (i, i))
    out.append(b"Content-Type: text/plain\r\n\r\n550 5.1.1 <gone@example.com> unknown\r\n")
    for i in reversed(range(depth)):
        out.append(b"--b%d--\r\n" % i)
    return b"".join(out)


def _nested_then_lines(n: int) -> bytes:
    """Deep nesting, then many boundary-like lines in the innermost part."""
    out = [HEAD, b"MIME-Version: 1.0\r\n"]
    for i in range(200):
        out.append(b'Content-Type: multipart/mixed; boundary="b%d"\r\n\r\n--b%d\r\n' % (i, i))
    out.append(b"Content-Type: text/plain\r\n\r\n")
    out.append(_repeat(b"--b\r\n", n))
    return b"".join(out)


def _many_parts(n: int) -> bytes:
    part = b"--b\r\nContent-Type: application/x; name=a\r\n\r\nx\r\n"
    return (HEAD + b'MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="b"\r\n\r\n'
            + _repeat(part, n) + b"--b--\r\n")


def _dsn_blank(n: int) -> bytes:
    return (HEAD + b'MIME-Version: 1.0\r\nContent-Type: multipart/report; report-type=delivery-status; boundary="b"\r\n\r\n'
            b"--b\r\nContent-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; x\r\n"
            + _repeat(b"\r\n \t", n) + b"\r\n--b--\r\n")


def _arf(feedback: Callable[[int], bytes], original: Callable[[int], bytes]) -> Callable[[int], bytes]:
    """An ARF complaint (RFC 5965) whose feedback-report part and quoted original grow."""
    return lambda n: (
        HEAD + b'MIME-Version: 1.0\r\nContent-Type: multipart/report; report-type=feedback-report; boundary="b"\r\n\r\n'
        b"--b\r\nContent-Type: text/plain\r\n\r\nA complaint.\r\n"
        b"--b\r\nContent-Type: message/feedback-report\r\n\r\nFeedback-Type: abuse\r\n" + feedback(n)
        + b"\r\n--b\r\nContent-Type: message/rfc822\r\n\r\n" + original(n) + b"\r\n\r\nbody\r\n--b--\r\n")


def _nothing(n: int) -> bytes:
    return b"Original-Mail-From: <bounce+1-1-0123456789abcdef@b.test>"


def _plain_original(n: int) -> bytes:
    return b"From: a@x.test\r\nSubject: s"


def _header(name: bytes, unit: bytes) -> Callable[[int], bytes]:
    return lambda n: (b"From: a@x.test\r\n" if name != b"From" else b"") + name + b": " + _repeat(unit, n) + (
        b"\r\nSubject: s\r\n" if name != b"Subject" else b"\r\n") + b"Content-Type: text/plain\r\n\r\nbody\r\n"


def _param(unit: bytes) -> Callable[[int], bytes]:
    return lambda n: (b'From: a@x.test\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="b"\r\n\r\n'
                      b'--b\r\nContent-Type: application/x; name="' + _repeat(unit, n) + b'"\r\n'
                      b"Content-Disposition: attachment; filename*0*=" + _repeat(unit, n) + b"\r\n\r\nx\r\n--b--\r\n")


def _many_headers(n: int) -> bytes:
    return _repeat(b"X-A: b\r\n", n) + b"From: a@x.test\r\nSubject: s\r\n\r\nbody\r\n"


BOUNCE_FAMILIES: dict[str, Callable[[int], bytes]] = {
    "blank lines": lambda n: PLAIN + _repeat(b"\r\n", n),
    "blank lines with spaces": lambda n: PLAIN + _repeat(b"\r\n \t", n),
    "dashes": lambda n: PLAIN + _repeat(b"-", n),
    "dash lines": lambda n: PLAIN + _repeat(b"--\r\n", n),
    "quotes": lambda n: PLAIN + _repeat(b"'", n),
    "address-like": lambda n: PLAIN + _repeat(b"a.b@", n),
    "angles": lambda n: PLAIN + _repeat(b"<a@b", n),
    "codes": lambda n: PLAIN + _repeat(b"550 - ", n),
    "deep nesting": _nested,
    "nesting then boundary lines": _nested_then_lines,
    "many parts": _many_parts,
    "delivery-status blank lines": _dsn_blank,
    "long subject": _header(b"Subject", b"=?utf-8?q?a?= "),
    "long from": _header(b"From", b'"'),
    "many headers": _many_headers,
    "arf signed-address prefixes": _arf(lambda n: b"Original-Mail-From: " + _repeat(b"bounce+", n), _plain_original),
    "arf address runs": _arf(lambda n: b"Original-Mail-From: bounce+" + _repeat(b"a-", n), _plain_original),
    "arf token-like runs": _arf(_nothing, lambda n: b"List-Unsubscribe: " + _repeat(b"/unsubscribe/1-1-", n)),
    "arf long return path": _arf(_nothing, lambda n: b"Return-Path: <" + _repeat(b"unsubscribe+1", n) + b">"),
    "arf blank lines": _arf(lambda n: _repeat(b"\r\n \t", n), _plain_original),
}

MIME_FAMILIES: dict[str, Callable[[int], bytes]] = {
    "blank lines": lambda n: PLAIN + _repeat(b"\r\n", n),
    "deep nesting": _nested,
    "nesting then boundary lines": _nested_then_lines,
    "many parts": _many_parts,
    "long subject (encoded words)": _header(b"Subject", b"=?utf-8?q?a?= "),
    "long subject (unclosed encoded words)": _header(b"Subject", b"=?a?q?"),
    "long from (quotes)": _header(b"From", b'"'),
    "long from (dots)": _header(b"From", b"."),
    "long from (backslashes)": _header(b"From", b"\\"),
    "long from (commas)": _header(b"From", b","),
    "long from (angles)": _header(b"From", b"<a@b"),
    "long content-type parameters": _param(b";"),
    "long quoted parameters": _param(b'\\"'),
    "many headers": _many_headers,
    "folded header": _header(b"Subject", b"a\r\n "),
}

TEXT_FAMILIES: dict[str, Callable[[int], str]] = {
    "quotes": lambda n: '"' * n + " <a@b.c>",
    "dots": lambda n: "." * n + "@b.c",
    "words": lambda n: "a " * (n // 2) + "<a@b.c>",
    "backslashes": lambda n: "\\" * n,
}

PATH_FAMILIES: dict[str, Callable[[int], str]] = {
    "dots": lambda n: "<" + "a." * (n // 2) + "@b.c>",
    "quotes": lambda n: '<"' + '\\"' * (n // 2) + '"@b.c>',
    "backslashes": lambda n: "<" + "\\" * n + "@b.c>",
    "angles": lambda n: "<" * n + "a@b.c>",
    "ats": lambda n: "<" + "@" * n + ">",
    "parentheses": lambda n: "<a@b.c> " + "(" * n,
    "route": lambda n: "<" + "@a," * (n // 3) + "@b:c@d.e>",
    "bare dots": lambda n: "a." * (n // 2) + "@b.c SIZE=1",
}

FAMILIES = {"bounce": BOUNCE_FAMILIES, "mime": MIME_FAMILIES, "plain_from": TEXT_FAMILIES, "smtp_path": PATH_FAMILIES}


# ---------------------------------------------------------------------------------------------
# timing in a child process


def _time(fn: Callable[[object], object], data: object, repeat: int, loops: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(loops):
            fn(data)
        best = min(best, time.perf_counter() - start)
    return best


# Inputs of these parsers are bounded where they are read (an SMTP command line, a From header
# value): n stops there and the parser is called in a loop instead, until the time is measurable.
MAX_N_OF = {"smtp_path": 256, "plain_from": 200}


def _child(parser: str, family: str, conn) -> None:  # noqa: ANN001 - a multiprocessing Connection
    fn = _parser(parser)
    make = FAMILIES[parser][family]
    max_n = MAX_N_OF.get(parser, MAX_N)
    n, loops = 32, 1
    while True:
        t = _time(fn, make(n), 3, loops)
        if t >= TARGET_SECONDS:
            break
        if n < max_n:
            n = min(n * 2, max_n)
        elif loops < 100_000:
            loops *= 2
        else:
            break
    if t < TARGET_SECONDS / 10:  # bounded: the largest input costs next to nothing
        conn.send(("bounded", n, t))
        return
    conn.send(("base", n, t))
    big = make(n * GROWTH)
    for _ in range(3):
        conn.send(("big", n * GROWTH, _time(fn, big, 1, loops)))


def growth(parser: str, family: str, *, limit: float = LIMIT, calibrate_timeout: float = 60.0) -> tuple[int, float, float]:
    """(n, t(n), t(8n)) where t(8n) is the best of up to three runs; t(8n) is reported as at
    least `limit` x t(n) x 1.5 when the child had to be stopped. A parser whose cost stays under a
    tenth of TARGET_SECONDS at MAX_N is bounded: (MAX_N, t, t)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(parser, family, child), daemon=True)
    proc.start()
    child.close()
    try:
        if not parent.poll(calibrate_timeout):
            return 0, float("inf"), float("inf")
        try:
            kind, n, base = parent.recv()
        except EOFError:  # the child failed
            return 0, float("inf"), float("inf")
        if kind == "bounded":
            return n, base, base
        budget = limit * base * 1.5 + 1.0  # a run past this has failed whatever the noise
        best = float("inf")
        deadline = time.monotonic() + 3 * budget
        while time.monotonic() < deadline:
            if not parent.poll(max(0.0, min(budget, deadline - time.monotonic()))):
                break
            try:
                _, _, t = parent.recv()
            except EOFError:
                break
            best = min(best, t)
            if best <= limit * base:
                break
        if best == float("inf"):
            best = budget
        return n, base, best
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        parent.close()
