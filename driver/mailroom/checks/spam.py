"""The spam score: what a real SpamAssassin (spamd) says of the message's raw bytes.

The bytes as received (bounded by the plan's size limit, which refused anything larger at delivery)
go to spamd at --spamd host:port with aiospamc's REPORT: the `Spam` header gives the score and the
threshold, the report's table the rules hit, each with its score and description. Off unless the
server runs with --spamd (SQL refuses it: 503). spamd's own settings decide which tests run (docs/checks.md:
the test kit runs it with --local, no network tests, and the rules Debian's package ships).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

TIMEOUT = 15.0  # seconds for the whole exchange with spamd
_RULE = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)\s+([A-Z0-9_]+)\s+(.*)$")


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


def rules_of(report: str) -> list[dict[str, Any]]:
    """The rules of a SpamAssassin report's table (`pts rule name description`), continuation
    lines of a description joined to it."""
    rules: list[dict[str, Any]] = []
    table = False
    for line in report.splitlines():
        if not table:
            table = line.startswith("---- ")
            continue
        if not line.strip():
            break
        match = _RULE.match(line)
        if match:
            rules.append({"name": match.group(2), "score": float(match.group(1)), "description": match.group(3).strip()})
        elif rules and line.startswith(" "):
            rules[-1]["description"] = f"{rules[-1]['description']} {line.strip()}".strip()
    return rules


async def check(raw: bytes, spamd: Spamd, timeout: float = TIMEOUT) -> dict[str, Any]:
    """The SpamCheck answer (docs/checks.md): score, threshold, is_spam and the rules hit."""
    import aiospamc
    from aiospamc.connections import Timeout
    from aiospamc.exceptions import AIOSpamcConnectionFailed, BadResponse, ClientTimeoutException
    from aiospamc.responses import ResponseException

    try:
        response = await aiospamc.report(raw, host=spamd.host, port=spamd.port, timeout=Timeout(total=timeout))
    except ClientTimeoutException:
        raise SpamdFailed(f"spamd gave no answer within {timeout:g} s") from None
    except AIOSpamcConnectionFailed:
        raise SpamdFailed("spamd cannot be reached") from None
    except (ResponseException, BadResponse) as exc:
        raise SpamdFailed(f"spamd refused the message ({type(exc).__name__})") from None
    spam = response.headers.spam
    if spam is None:
        raise SpamdFailed("spamd's answer has no Spam header")
    report = bytes(response.body or b"").decode("utf-8", "replace")
    rules = rules_of(report)
    rules.sort(key=lambda r: (-r["score"], r["name"]))
    return {"score": round(float(spam.score), 1), "threshold": round(float(spam.threshold), 1), "is_spam": bool(spam.value),
            "rules": rules}
