"""The link check (docs/checks.md) against a loopback HTTP server the test starts: statuses, HEAD then
GET, redirects (each one checked again, at most 3), time bounds, and the SSRF guard refusing a
loopback target the operator did not allow."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
from checks_support import assert_shape

from mailroom.checks import links
from mailroom.http import models


def _policy(target, **bounds) -> links.LinkPolicy:
    """127.0.0.1 allowed, and the target's port asked (with 80 and 443, the setting's default)."""
    policy = links.LinkPolicy.parse(["127.0.0.1/32"]).with_ports({80, 443, target.server_address[1]})
    for name, value in bounds.items():
        setattr(policy, name, value)
    return policy


def _set_ports(db_url: str, value: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute("SELECT mailroom.set_setting('checks.link_ports', %s)", (value,))


@pytest.fixture(scope="module", autouse=True)
def _target_port_asked(db_url: str, target) -> None:
    """The servers of this module ask the target's port (setting checks.link_ports): 80,443,PORT."""
    _set_ports(db_url, f"80,443,{target.server_address[1]}")


def test_the_link_check_over_http(serve, inbox, deliver, target) -> None:
    server = serve("--link-check", "--link-check-allow", "127.0.0.1/32")
    base = f"http://127.0.0.1:{target.server_address[1]}"
    away = f"http://127.0.0.2:{target.server_address[1]}/ok"
    html = (f'<a href="{base}/ok">ok</a> <a href="{base}/missing">gone</a> <a href="{base}/redirect">r</a>'
            f'<a href="{base}/hops/3">3 hops</a> <a href="{base}/hops/4">4 hops</a> <a href="{base}/no-head">n</a>'
            f'<a href="{base}/away">away</a> <a href="{away}">not allowed</a> <a href="mailto:x@example.org">m</a>'
            f'<a href="#top">anchor</a> <img src="{base}/img.png"> <a href="{base}/ok">ok again</a>')
    text = f"Also see {base}/ok?from=text. And {base}/missing"
    address, token = inbox(server)
    message = deliver(address, "links", text=text, html=html)
    answer = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{message}/checks/links", token=token, timeout=30)
    assert answer.status == 200, answer.body
    doc = answer.json()
    assert_shape(doc, models.LinkCheck)
    for link in doc["links"]:
        assert_shape(link, models.LinkResult)
    by_url = {link["url"]: link for link in doc["links"]}
    assert doc["checked"] == len(doc["links"]) == 10 and doc["skipped"] == 0, doc  # each URL once; mailto and # not
    assert by_url[f"{base}/ok"] == {"url": f"{base}/ok", "kind": "link", "status": 200, "ok": True, "error": None,
                                    "redirects": 0}
    assert (by_url[f"{base}/missing"]["status"], by_url[f"{base}/missing"]["ok"]) == (404, False)
    assert by_url[f"{base}/missing"]["error"] == "HTTP 404"
    assert (by_url[f"{base}/redirect"]["status"], by_url[f"{base}/redirect"]["redirects"]) == (200, 1)
    assert by_url[f"{base}/hops/3"]["ok"] and by_url[f"{base}/hops/3"]["redirects"] == 3
    assert not by_url[f"{base}/hops/4"]["ok"] and "more than 3 redirects" in by_url[f"{base}/hops/4"]["error"]
    assert by_url[f"{base}/no-head"]["status"] == 200 and ("GET", "/no-head") in target.seen  # HEAD refused: GET
    assert by_url[f"{base}/img.png"]["kind"] == "image" and by_url[f"{base}/img.png"]["ok"]
    assert by_url[f"{base}/ok?from=text"]["ok"]
    # 127.0.0.2 is loopback and not in --link-check-allow: refused, directly and after a redirect
    assert by_url[away]["status"] is None and "loopback" in by_url[away]["error"] and not by_url[away]["ok"]
    assert by_url[f"{base}/away"]["redirects"] == 1 and "redirect 1: refused" in by_url[f"{base}/away"]["error"]


def test_a_loopback_url_is_refused_unless_allowed(target) -> None:
    url = f"http://127.0.0.1:{target.server_address[1]}/ok"
    refused = asyncio.run(links.check(f'<a href="{url}">x</a>', None, links.LinkPolicy()))
    assert refused["links"][0]["status"] is None
    assert "loopback" in refused["links"][0]["error"]
    named = asyncio.run(links.check(f'<a href="http://localhost:{target.server_address[1]}/ok">x</a>', None,
                                    links.LinkPolicy()))
    assert "loopback" in named["links"][0]["error"]  # refused after DNS resolution, not by the name
    allowed = asyncio.run(links.check(f'<a href="{url}">x</a>', None, _policy(target)))
    assert allowed["links"][0]["ok"] is True
    # how each kind of address is named: tests/core/test_netguard.py (the guard is mailroom.core.netguard)


def test_time_and_count_are_bounded(target) -> None:
    base = f"http://127.0.0.1:{target.server_address[1]}"
    started = time.monotonic()
    slow = asyncio.run(links.check(f'<a href="{base}/slow">s</a>', None, _policy(target, per_url=0.5)))
    assert time.monotonic() - started < 2.5  # the slow route answers after 3 s
    assert slow["links"][0]["status"] is None and "no answer within 0.5 s" in slow["links"][0]["error"]
    started = time.monotonic()
    many = "".join(f'<a href="{base}/slow?{n}">s</a>' for n in range(20))
    bounded = asyncio.run(links.check(many, None, _policy(target, per_url=5, total=1.0)))
    assert time.monotonic() - started < 2.5
    assert bounded["checked"] == 20 and not any(link["ok"] for link in bounded["links"])
    assert all("ran out" in link["error"] or "no answer" in link["error"] for link in bounded["links"])
    sixty = "".join(f'<a href="{base}/ok?{n}">o</a>' for n in range(60))
    counted = asyncio.run(links.check(sixty, None, _policy(target)))
    assert (counted["checked"], counted["skipped"]) == (50, 10)
    assert all(link["ok"] for link in counted["links"])


def test_a_malformed_link_fails_alone(serve, inbox, deliver, target) -> None:
    """A link httpx or urllib refuses to parse (a CR from `&#13;` inside the URL, an unclosed IPv6
    literal, a port out of range) is that link's row with its error; the check answers 200."""
    server = serve("--link-check", "--link-check-allow", "127.0.0.1/32")
    base = f"http://127.0.0.1:{target.server_address[1]}"
    html = (f'<a href="{base}/ok">ok</a> <a href="{base}/ok&#13;x">cr</a> <a href="http://[::1/x">v6</a>'
            f'<a href="http://127.0.0.1:99999/">port</a>')
    address, token = inbox(server)
    message = deliver(address, "malformed links", html=html)
    answer = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{message}/checks/links", token=token, timeout=30)
    assert answer.status == 200, answer.body
    doc = answer.json()
    by_url = {link["url"]: link for link in doc["links"]}
    assert doc["checked"] == 4 and set(by_url) == {f"{base}/ok", f"{base}/ok\rx", "http://[::1/x", "http://127.0.0.1:99999/"}
    assert by_url[f"{base}/ok"]["ok"] is True
    for url in (f"{base}/ok\rx", "http://[::1/x", "http://127.0.0.1:99999/"):
        assert (by_url[url]["ok"], by_url[url]["status"]) == (False, None), by_url[url]
        assert by_url[url]["error"], by_url[url]
    assert "not a valid URL" in by_url[f"{base}/ok\rx"]["error"]
    assert "IPv6" in by_url["http://[::1/x"]["error"]


def test_only_the_ports_of_the_setting_are_asked(serve, inbox, deliver, target, db_url) -> None:
    """A URL (or a redirect target) on a port checks.link_ports does not list is refused before it is
    asked; the setting is read through SQL with the message, and a bad value is MR284 (503)."""
    server = serve("--link-check", "--link-check-allow", "127.0.0.1/32")
    port = target.server_address[1]
    base = f"http://127.0.0.1:{port}"
    address, token = inbox(server)
    message = deliver(address, "ports", html=f'<a href="{base}/ok?ports">a</a> <a href="{base}/other-port">b</a>')
    path = f"/api/v1/mailboxes/{address}/messages/{message}/checks/links"
    try:
        _set_ports(db_url, "80,443")
        doc = server.request("GET", path, token=token, timeout=30).json()
        by_url = {link["url"]: link for link in doc["links"]}
        refused = by_url[f"{base}/ok?ports"]
        assert (refused["status"], refused["ok"]) == (None, False)
        assert refused["error"] == (f"refused: port {port} is not asked "
                                    "(the setting checks.link_ports lists the ports asked)")
        assert not any(asked == "/other-port" for _, asked in target.seen)  # refused before anything was asked
        _set_ports(db_url, f"443,{port},80")
        doc = server.request("GET", path, token=token, timeout=30).json()
        by_url = {link["url"]: link for link in doc["links"]}
        assert by_url[f"{base}/ok?ports"]["ok"] is True
        moved = by_url[f"{base}/other-port"]
        assert (moved["redirects"], moved["ok"]) == (1, False)
        assert moved["error"].startswith("redirect 1: refused: port 9 is not asked"), moved
        _set_ports(db_url, "eighty")
        bad = server.request("GET", path, token=token)
        assert (bad.status, bad.error_code) == (503, "MR284"), bad.body
        assert "checks.link_ports" in bad.json()["error"]["message"]
    finally:
        _set_ports(db_url, f"80,443,{port}")
