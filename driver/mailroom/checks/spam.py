"""The spam score: what a real SpamAssassin (spamd) says of the message's raw bytes.

The bytes as received (bounded by the plan's size limit, which refused anything larger at delivery)
go to spamd at --spamd host:port as a REPORT of its protocol (SPAMC/1.5, spamd's PROTOCOL file: a
request line, Content-length, the bytes; the answer's status line, its `Spam` header with the score
and the threshold, and the report, whose table lists the rules hit, each with its score and
description). The protocol is a few lines, spoken here: the client libraries on PyPI pin an old typer. Off unless the
server runs with --spamd (SQL refuses it: 503). spamd's own settings decide which tests run (docs/checks.md:
the test kit runs it with --local, no network tests, and the rules Debian's package ships).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

TIMEOUT = 15.0  # seconds for the whole exchange with spamd
_RULE = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)\s+([A-Z0-9_]+)\s+(.*)$")
_STATUS = re.compile(rb"^SPAMD/[0-9.]+ +([0-9]+) *(.*?)\r?\n$")
_SPAM = re.compile(r"^(true|false|yes|no)\s*;\s*(-?[0-9]+(?:\.[0-9]+)?)\s*/\s*(-?[0-9]+(?:\.[0-9]+)?)", re.IGNORECASE)
_LENGTH = re.compile(r"[0-9]{1,10}")
MAX_ANSWER = 1 << 20  # bytes of spamd's report read at the most
MAX_HEADERS = 32
MAX_LINE = 8192  # bytes of spamd's status line and of each header line
MAX_DIGITS = 12  # characters of a score (spamd's are like -0.1, 5.0, 1000.0): longer is nonsense
MAX_DESCRIPTION = 1000  # characters of a rule's description, its continuation lines joined


@dataclass(frozen=True)
class Spamd:
    host: str
    port: int

    @classmethod
    def parse(cls, value: str) -> Spamd:
        """host:port ([v6]:port); ValueError says what is wrong."""
        host, sep, port = value.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--spamd takes host:port, got {value!r}")
        return cls(host.strip("[]"), int(port))


class SpamdFailed(Exception):
    """spamd did not answer, or answered with an error."""


def score_of(text: str) -> float:
    """A score of spamd's answer; SpamdFailed on nonsense (a 400-digit number would be `inf`, which
    no JSON answer can carry)."""
    if len(text) > MAX_DIGITS:
        raise SpamdFailed(f"spamd's answer has a score of {len(text)} characters")
    return float(text)


def rules_of(report: str) -> list[dict[str, Any]]:
    """The rules of a SpamAssassin report's table (`pts rule name description`), continuation
    lines of a description joined to it (at most MAX_DESCRIPTION characters). Linear in the report:
    a description's parts are joined once, at the end. SpamdFailed on a nonsense score."""
    rules: list[dict[str, Any]] = []
    parts: list[list[str]] = []  # each rule's description, in parts
    size = 0  # characters of the last rule's parts
    table = False
    for line in report.splitlines():
        if not table:
            table = line.startswith("---- ")
            continue
        if not line.strip():
            break
        match = _RULE.match(line)
        if match:
            rules.append({"name": match.group(2), "score": score_of(match.group(1))})
            parts.append([match.group(3).strip()])
            size = len(parts[-1][0])
        elif rules and line.startswith(" ") and size <= MAX_DESCRIPTION:
            parts[-1].append(line.strip())
            size += len(parts[-1][-1]) + 1
    for rule, words in zip(rules, parts, strict=True):
        rule["description"] = " ".join(word for word in words if word)[:MAX_DESCRIPTION]
    return rules


async def report(raw: bytes, spamd: Spamd) -> tuple[str, str]:
    """spamd's answer to REPORT: its Spam header's value and the report (SpamdFailed otherwise, and on
    nonsense: a line over MAX_LINE bytes, a Content-length that is not a number of at most 10 digits)."""
    try:
        reader, writer = await asyncio.open_connection(spamd.host, spamd.port, limit=MAX_LINE)
    except OSError:
        raise SpamdFailed("spamd cannot be reached") from None
    try:
        writer.write(b"REPORT SPAMC/1.5\r\nContent-length: %d\r\n\r\n" % len(raw) + raw)
        await writer.drain()
        status = _STATUS.match(await reader.readline())
        if status is None:
            raise SpamdFailed("spamd's answer is not SPAMD/1.x")
        if status.group(1) != b"0":
            raise SpamdFailed(f"spamd refused the message ({status.group(1).decode()} "
                              f"{status.group(2).decode('ascii', 'replace')[:80]})")
        headers: dict[str, str] = {}
        for _ in range(MAX_HEADERS):
            line = (await reader.readline()).decode("latin-1").strip()
            if not line:
                break
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length")
        if length is not None and not _LENGTH.fullmatch(length):
            raise SpamdFailed(f"spamd's Content-length is not a number of at most 10 digits ({len(length)} characters)")
        body = await (reader.readexactly(min(int(length), MAX_ANSWER)) if length else reader.read(MAX_ANSWER))
    except (OSError, asyncio.IncompleteReadError):
        raise SpamdFailed("spamd ended the connection before its answer") from None
    except ValueError:  # StreamReader.readline past its limit
        raise SpamdFailed(f"spamd's answer has a line over {MAX_LINE} bytes") from None
    finally:
        writer.close()
    if "spam" not in headers:
        raise SpamdFailed("spamd's answer has no Spam header")
    return headers["spam"], body.decode("utf-8", "replace")


async def check(raw: bytes, spamd: Spamd, timeout: float = TIMEOUT) -> dict[str, Any]:
    """The SpamCheck answer (docs/checks.md): score, threshold, is_spam and the rules hit."""
    try:
        spam, text = await asyncio.wait_for(report(raw, spamd), timeout)
    except TimeoutError:
        raise SpamdFailed(f"spamd gave no answer within {timeout:g} s") from None
    verdict = _SPAM.match(spam)
    if verdict is None:
        raise SpamdFailed("spamd's Spam header is not `verdict ; score / threshold`")
    rules = rules_of(text)
    rules.sort(key=lambda r: (-r["score"], r["name"]))
    return {"score": round(score_of(verdict.group(2)), 1), "threshold": round(score_of(verdict.group(3)), 1),
            "is_spam": verdict.group(1).lower() in ("true", "yes"), "rules": rules}
