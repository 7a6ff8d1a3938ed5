"""`/docs` from a package, offline, under a CSP; every API response with a CSP of its own (issue 34, item 5).

Before, `/docs` loaded Swagger UI from a public CDN (no SRI, no CSP) on the same origin as the inbox
cookies, and was blank offline; the API's JSON answers carried no CSP and no `frame-ancestors`.
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def test_docs_page_loads_nothing_from_elsewhere_and_has_a_csp(server):
    resp = server.request("GET", "/docs")
    assert resp.status == 200
    csp = resp.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp.split(
        "script-src")[1].split(";")[0]
    page = resp.body.decode()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), page  # nothing from another host
    assert "<script>" not in page  # no inline script: the CSP forbids it
    for path in re.findall(r"""(?:src|href)="(/docs/[^"]+)\"""", page):
        asset = server.request("GET", path)
        assert asset.status == 200 and len(asset.body) > 100, path
    assert server.request("GET", "/docs/static/..%2Fcore.py").status == 404
    assert server.request("GET", "/docs/static/core.py").status == 404


def test_api_responses_carry_a_csp_and_frame_ancestors(server):
    for method, path in (("POST", "/api/v1/mailboxes"), ("GET", "/api/v1/mailboxes/nobody@mailroom.test"),
                         ("GET", "/openapi.json"), ("GET", "/no/such/route")):
        resp = server.request(method, path)
        csp = resp.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp, (path, resp.headers)
        assert resp.headers.get("x-content-type-options") == "nosniff", path
        assert resp.headers.get("x-frame-options") == "DENY", path


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium is not installed (apt-get install chromium)")
def test_docs_render_offline_in_chromium(server, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    elsewhere: list[str] = []
    violations: list[str] = []
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM, args=FLAGS,
                                                       headless=True)
        page = context.pages[0] if context.pages else context.new_page()

        def offline(route) -> None:  # noqa: ANN001 - the network is this server only
            if route.request.url.startswith(server.base):
                route.continue_()
            else:
                elsewhere.append(route.request.url)
                route.abort()

        page.route("**/*", offline)
        page.on("console", lambda msg: violations.append(msg.text) if "Content Security Policy" in msg.text else None)
        page.goto(f"{server.base}/docs")
        expect(page.locator(".opblock-summary-path", has_text="/api/v1/mailboxes").first).to_be_visible(timeout=15000)
        context.close()
    assert elsewhere == [], elsewhere
    assert violations == [], violations
