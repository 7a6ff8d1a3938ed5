"""The SSRF guard (mailroom.core.netguard, docs/checks.md "Link check"): how an address is classified,
a name refused after its resolution, and a URL pinned to the address that was checked."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest

from mailroom.core import netguard


def test_each_kind_of_address_is_named() -> None:
    for address, reason in (("10.1.2.3", "private"), ("169.254.169.254", "link-local"), ("224.0.0.1", "multicast"),
                            ("240.0.0.1", "reserved"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
                            ("fe80::1", "link-local"), ("0.0.0.0", "unspecified"),
                            # 6to4 of a loopback or private IPv4 address, and IPv6 site-local (review of 2026-12-06)
                            ("2002:7f00:1::", "loopback"), ("2002:a00:1::1", "private"), ("fec0::1", "site-local")):
        assert netguard.refusal(ipaddress.ip_address(address), []) == reason, address
    assert netguard.refusal(ipaddress.ip_address("93.184.215.14"), []) is None
    assert netguard.refusal(ipaddress.ip_address("2002:5db8:d70e::1"), []) is None  # 6to4 of a public address
    allow = netguard.parse_networks(["127.0.0.1/32", " 10.0.0.0/8 "])
    assert netguard.refusal(ipaddress.ip_address("127.0.0.1"), allow) is None
    assert netguard.refusal(ipaddress.ip_address("::ffff:10.9.8.7"), allow) is None  # mapped: its IPv4 address
    assert netguard.refusal(ipaddress.ip_address("127.0.0.2"), allow) == "loopback"
    with pytest.raises(ValueError, match="not an IP network: 'nope'"):
        netguard.parse_networks(["nope"])


def test_a_name_is_refused_by_what_it_resolves_to() -> None:
    with pytest.raises(netguard.Refused, match=r"refused: localhost resolves to a loopback address \(a hint\)"):
        asyncio.run(netguard.pin("http://localhost:8080/x", [], hint="a hint"))
    with pytest.raises(netguard.Refused, match="not an http"):
        asyncio.run(netguard.pin("ftp://example.org/", []))


def test_a_url_is_pinned_to_the_checked_address() -> None:
    allow = netguard.parse_networks(["127.0.0.0/8", "::1/128"])
    plain = asyncio.run(netguard.pin("http://localhost:8080/a?b=1", allow))
    assert str(plain.address) in ("127.0.0.1", "::1")
    assert plain.url.host == str(plain.address) and plain.url.port == 8080 and plain.url.raw_path == b"/a?b=1"
    assert plain.headers == {"Host": "localhost:8080"} and plain.extensions == {}
    tls = asyncio.run(netguard.pin("https://127.0.0.1/", allow))
    assert tls.headers == {"Host": "127.0.0.1"} and tls.extensions == {"sni_hostname": "127.0.0.1"}
    six = asyncio.run(netguard.pin("http://[::1]:81/", allow))
    assert six.headers == {"Host": "[::1]:81"} and six.url.host == "::1"


def test_a_port_outside_the_list_is_refused() -> None:
    with pytest.raises(netguard.Refused, match=r"^refused: port 8080 is not asked \(a hint\)$"):
        asyncio.run(netguard.pin("http://93.184.215.14:8080/", [], {80, 443}, port_hint="a hint"))
    for url in ("https://93.184.215.14/", "http://93.184.215.14/", "http://93.184.215.14:80/"):
        assert str(asyncio.run(netguard.pin(url, [], {80, 443})).address) == "93.184.215.14"  # the scheme's port
    with pytest.raises(netguard.Refused, match="port 443"):
        asyncio.run(netguard.pin("https://93.184.215.14/", [], {80}))
    with pytest.raises(netguard.Refused, match="loopback"):  # the address is named first, whatever the port
        asyncio.run(netguard.pin("http://127.0.0.1:8080/", [], {80}))
