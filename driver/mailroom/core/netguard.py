"""The SSRF guard of every outbound request whose URL someone else chose (the link check, webhooks).

A URL's host is resolved first and each of its addresses classified: a loopback, private,
link-local, multicast, reserved, unspecified, site-local or otherwise non-global address (IPv4-mapped
and 6to4 IPv6 judged by their IPv4 address) is refused unless it is in a network the operator
allowed. The request then goes to the address that was checked (`pin`: the URL's host stays in
`Host` and in TLS's SNI and certificate check), so a second DNS answer cannot point it elsewhere. A
port outside the caller's list is refused too (after the address, so an address the guard refuses
is named as such whatever its port).

core: imports nothing of mailroom's db or areas (docs/architecture.md, "Layering").
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(Exception):
    """The URL is not asked: its scheme, its port, or an address the guard refuses."""


def parse_networks(networks: Iterable[str], example: str = "127.0.0.1/32, 10.0.0.0/8") -> list[IpNetwork]:
    """CIDR strings as networks; ValueError names a bad one."""
    allow = []
    for value in networks:
        try:
            allow.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"not an IP network: {value!r} (e.g. {example})") from None
    return allow


def refusal(address: IpAddress, allow: list[IpNetwork]) -> str | None:
    """Why the guard refuses an address (None: it may be asked)."""
    if any(address.version == net.version and address in net for net in allow):
        return None
    # an IPv6 form of an IPv4 address (mapped ::ffff:a.b.c.d, 6to4 2002:aabb:ccdd::/48, which a host
    # with a 6to4 route sends to that IPv4 address) is judged as that address
    embedded = getattr(address, "ipv4_mapped", None) or getattr(address, "sixtofour", None)
    if embedded is not None:
        return refusal(embedded, allow)
    for test, reason in (("is_loopback", "loopback"), ("is_link_local", "link-local"), ("is_multicast", "multicast"),
                         ("is_unspecified", "unspecified"), ("is_reserved", "reserved"), ("is_private", "private"),
                         ("is_site_local", "site-local")):
        if getattr(address, test, False):
            return reason
    return None if address.is_global else "non-global"


async def resolve(host: str, port: int, allow: list[IpNetwork], hint: str = "") -> IpAddress:
    """The address to connect to: every address the name resolves to must pass the guard (Refused
    otherwise, saying why; `hint` is how the operator would allow it, e.g. a flag)."""
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
        addresses: list[IpAddress] = [literal]
    except ValueError:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise Refused(f"the name does not resolve ({exc.strerror or exc})") from None
        addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos))
    if not addresses:
        raise Refused("the name does not resolve")
    for address in addresses:
        reason = refusal(address, allow)
        if reason is not None:
            raise Refused(f"refused: {host} resolves to a {reason} address{f' ({hint})' if hint else ''}")
    return addresses[0]


@dataclass(frozen=True)
class Pinned:
    """A checked URL, to be asked at the address that was checked."""

    url: Any  # httpx.URL: the URL with its host replaced by the checked address
    address: IpAddress
    headers: dict[str, str]  # Host: the URL's own host (and port)
    extensions: dict[str, str]  # httpx's: TLS's SNI (and certificate check) on the URL's own host


async def pin(url: str, allow: list[IpNetwork], ports: Collection[int] | None = None, hint: str = "",
              port_hint: str = "") -> Pinned:
    """Guard one URL (http or https only; every address of its host allowed; its port, the scheme's
    when it names none, in `ports` unless None) and pin it to the address checked. Refused says why
    not (`hint`, `port_hint`: how the operator would allow it)."""
    import httpx

    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise Refused(f"not an http(s) URL: {parts.scheme or '(none)'}")
    port = parts.port or (443 if scheme == "https" else 80)
    address = await resolve(parts.hostname, port, allow, hint)
    if ports is not None and port not in ports:
        raise Refused(f"refused: port {port} is not asked{f' ({port_hint})' if port_hint else ''}")
    target = httpx.URL(url).copy_with(host=str(address))
    host_header = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    if parts.port is not None:
        host_header = f"{host_header}:{parts.port}"
    extensions = {"sni_hostname": parts.hostname} if scheme == "https" else {}
    return Pinned(target, address, {"Host": host_header}, extensions)
