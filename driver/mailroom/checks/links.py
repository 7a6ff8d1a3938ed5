"""The link check: does every link and image of a message answer?

Every `a href` and `img src` of the HTML part and every http(s) link of the text part, each URL once,
is asked with HEAD, then GET when HEAD is refused or fails (the GET's body is never read), with httpx.
Bounded: at most MAX_URLS URLs (the rest are counted as skipped), PER_URL seconds each (redirects
included), TOTAL seconds for the whole check, MAX_REDIRECTS redirects per URL, each redirect target
checked like the first URL; only the ports of the setting checks.link_ports (80 and 443 by default).
A link that fails, however it fails (a URL httpx will not parse included), is that link's row with
its error: the check as a whole answers. Off unless the server runs with --link-check (SQL refuses
it: 503).

SSRF guard (mailroom.core.netguard, shared with the webhook sender): a URL's host is resolved first
and each of its addresses checked; a loopback, private, link-local, multicast, reserved, unspecified
or otherwise non-global address is refused unless it is in a network the operator allowed
(--link-check-allow 127.0.0.1/32). The request then goes to the address that was checked (the URL's
host stays in Host and in TLS's SNI and certificate check), so a second DNS answer cannot point it
elsewhere. No proxy from the environment is used.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin, urlsplit

from mailroom.core import netguard
from mailroom.core.netguard import IpNetwork, Refused

MAX_URLS = 50
PER_URL = 5.0
TOTAL = 15.0
MAX_REDIRECTS = 3
CONCURRENCY = 8
MAX_SOURCE = 1024 * 1024  # characters of each part read for links
MAX_URL = 2048
REDIRECTS = frozenset({301, 302, 303, 307, 308})
PORTS = frozenset({80, 443})  # the default of the setting checks.link_ports
_TEXT_URL = re.compile(r"https?://[^\s<>\"'`{}|\\^\[\]]+", re.I)

@dataclass
class LinkPolicy:
    """The bounds, the networks the operator allowed (mailroom http serve --link-check-allow) and the
    ports a URL may name (setting checks.link_ports, which SQL reads with the message: with_ports)."""

    allow: list[IpNetwork] = field(default_factory=list)
    ports: frozenset[int] = PORTS
    max_urls: int = MAX_URLS
    per_url: float = PER_URL
    total: float = TOTAL
    max_redirects: int = MAX_REDIRECTS

    @classmethod
    def parse(cls, networks: Iterable[str]) -> LinkPolicy:
        """From CIDR strings; ValueError names a bad one."""
        return cls(allow=netguard.parse_networks(networks))

    def with_ports(self, ports: Iterable[int]) -> LinkPolicy:
        """The same policy, for the ports given (the setting's value as SQL answers it)."""
        return replace(self, ports=frozenset(ports))


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        name = {"a": "href", "img": "src"}.get(tag)
        if name is None:
            return
        for key, value in attrs:
            if key == name and value:
                self.found.append((value.strip(), "link" if tag == "a" else "image"))
                return

    handle_startendtag = handle_starttag


def extract(html: str | None, text: str | None) -> list[tuple[str, str]]:
    """(url, kind) of each http(s) link and image, first seen first, each URL once."""
    found: list[tuple[str, str]] = []
    if html:
        reader = _Links()
        reader.feed(html[:MAX_SOURCE])
        reader.close()
        found += reader.found
    if text:
        found += [(m.group().rstrip(".,;:!?)'\""), "link") for m in _TEXT_URL.finditer(text[:MAX_SOURCE])]
    seen: set[str] = set()
    links = []
    for url, kind in found:
        try:
            scheme = urlsplit(url).scheme.lower()
        except ValueError:  # e.g. an unclosed [IPv6 literal: listed, and its row says why it fails
            scheme = url.partition(":")[0].strip().lower()
        if scheme not in ("http", "https") or url in seen:
            continue
        seen.add(url)
        links.append((url, kind))
    return links


async def _ask(client: Any, url: str, policy: LinkPolicy) -> tuple[int, str | None]:
    """One URL, one hop: (status, Location header)."""
    import httpx

    pinned = await netguard.pin(url, policy.allow, policy.ports, hint="--link-check-allow to allow it",
                                port_hint="the setting checks.link_ports lists the ports asked")
    headers = {**pinned.headers, "User-Agent": "mailroom-link-check/1", "Accept": "*/*"}
    status: int | None = None
    location: str | None = None
    for method in ("HEAD", "GET"):
        request = client.build_request(method, pinned.url, headers=headers, extensions=pinned.extensions)
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError:
            if method == "GET":
                raise
            continue
        status, location = response.status_code, response.headers.get("location")
        await response.aclose()  # a GET's body is never read
        if status < 400 or status in (404, 410):
            break
    assert status is not None
    return status, location


async def _check_one(client: Any, url: str, kind: str, policy: LinkPolicy, deadline: float) -> dict[str, Any]:
    import httpx

    result: dict[str, Any] = {"url": url, "kind": kind, "status": None, "ok": False, "error": None, "redirects": 0}
    left = deadline - time.monotonic()
    if left <= 0:
        result["error"] = f"not checked: the check's {policy.total:g} s ran out"
        return result
    bound = min(policy.per_url, left)
    current = url
    try:
        async with asyncio.timeout(bound):
            while True:
                status, location = await _ask(client, current, policy)
                result["status"] = status
                if status in REDIRECTS and location:
                    if result["redirects"] >= policy.max_redirects:
                        result["error"] = f"more than {policy.max_redirects} redirects"
                        return result
                    result["redirects"] += 1
                    current = urljoin(current, location.strip())[:MAX_URL]
                    continue
                result["ok"] = 200 <= status < 400
                if not result["ok"]:
                    result["error"] = f"HTTP {status}"
                return result
    except TimeoutError:
        result["status"] = None
        result["error"] = f"no answer within {bound:.1f} s"
    except Refused as exc:
        result["status"] = None
        result["error"] = str(exc) if not result["redirects"] else f"redirect {result['redirects']}: {exc}"
    except httpx.HTTPError as exc:
        result["status"] = None
        result["error"] = f"{type(exc).__name__}: {str(exc)[:200] or 'the request failed'}"
    except httpx.InvalidURL as exc:
        result["status"] = None
        result["error"] = f"not a valid URL: {str(exc)[:200]}"
    except (OSError, ValueError) as exc:
        result["status"] = None
        result["error"] = f"the request failed: {str(exc)[:200]}"
    except Exception as exc:  # noqa: BLE001 - one link's failure is its row's, never the whole check's
        result["status"] = None
        result["error"] = f"the request failed ({type(exc).__name__}): {str(exc)[:200]}"
    return result


async def check(html: str | None, text: str | None, policy: LinkPolicy) -> dict[str, Any]:
    """The LinkCheck answer (docs/checks.md): each URL's status, whether it answered, why not, redirects."""
    import httpx

    links = extract(html, text)
    checked, skipped = links[:policy.max_urls], len(links) - min(len(links), policy.max_urls)
    deadline = time.monotonic() + policy.total
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(url: str, kind: str) -> dict[str, Any]:
        async with gate:
            return await _check_one(client, url, kind, policy, deadline)

    timeout = httpx.Timeout(policy.per_url)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False, trust_env=False) as client:
        results = await asyncio.gather(*(one(url, kind) for url, kind in checked))
    return {"links": list(results), "checked": len(results), "skipped": skipped}
