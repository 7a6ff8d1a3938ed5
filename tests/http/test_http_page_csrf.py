"""The inbox page's cookie is never set by another site (login CSRF), and a mail's links cannot open
pages outside the sandbox (issue 34, item 5).

Before, `GET /inbox/{address}?token=…` set the inbox cookie for any request: a page elsewhere could open
its own inbox in a person's browser (who would then read the attacker's mail as theirs, or leave their
own there); and the HTML frame's `allow-popups-to-escape-sandbox` let a link in a mail open same-origin
pages outside the sandbox.
"""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit


def _create(server) -> dict:  # noqa: ANN001
    resp = server.request("POST", "/api/v1/mailboxes")
    assert resp.status == 201, resp.body
    return resp.json()


def _raw(server, method: str, path: str, headers: dict[str, str], body: bytes | None = None):  # noqa: ANN001, ANN202
    host = urlsplit(server.base)
    conn = http.client.HTTPConnection(host.hostname, host.port, timeout=10)
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.headers, resp.read().decode()


def test_a_token_link_from_another_site_asks_before_it_sets_the_cookie(server):
    box = _create(server)
    path = f"/inbox/{box['address']}?token={box['session_token']}"
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}, {}):
        status, resp_headers, html = _raw(server, "GET", path, headers)
        assert status == 200 and resp_headers.get("set-cookie") is None, (headers, status)
        assert "Open this inbox?" in html and 'method="post"' in html
    # typed or pasted (Sec-Fetch-Site: none), or from mailroom's own page: the cookie, and the token
    # leaves the address bar
    for headers in ({"Sec-Fetch-Site": "none"}, {"Sec-Fetch-Site": "same-origin"}):
        status, resp_headers, _ = _raw(server, "GET", path, headers)
        assert status == 303 and "HttpOnly" in (resp_headers.get("set-cookie") or ""), headers


def test_the_login_and_create_forms_post_only_from_this_site(server):
    box = _create(server)
    form = f"token={box['session_token']}".encode()
    form_headers = {"Content-Type": "application/x-www-form-urlencoded"}
    evil = {**form_headers, "Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
    status, headers, _ = _raw(server, "POST", f"/inbox/{box['address']}/login", evil, form)
    assert status == 403 and headers.get("set-cookie") is None
    status, headers, _ = _raw(server, "POST", "/inbox", evil, b"")
    assert status == 403 and headers.get("set-cookie") is None
    status, headers, _ = _raw(server, "POST", f"/inbox/{box['address']}/login", form_headers, form)
    assert status == 403, "a POST that names no origin is not trusted to set a cookie"
    own = {**form_headers, "Origin": server.base}
    status, headers, _ = _raw(server, "POST", f"/inbox/{box['address']}/login", own, form)
    assert status == 303 and "HttpOnly" in (headers.get("set-cookie") or "")
    status, headers, _ = _raw(server, "POST", "/inbox", {**own, "Sec-Fetch-Site": "same-origin"}, b"")
    assert status == 303 and "HttpOnly" in (headers.get("set-cookie") or "")


def test_links_in_a_mail_cannot_open_pages_outside_the_sandbox(server, deliver):
    box = _create(server)
    message_id = deliver(box["address"], "links", "x", html='<a href="/inbox/victim@mailroom.test">x</a>')
    frame = server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages/{message_id}/html",
                           token=box["session_token"])
    csp = frame.headers["content-security-policy"]
    assert csp.startswith("sandbox allow-popups;") and "allow-popups-to-escape-sandbox" not in csp, csp
    status, headers, _ = _raw(server, "GET", f"/inbox/{box['address']}?token={box['session_token']}",
                              {"Sec-Fetch-Site": "none"})
    jar = headers["set-cookie"].split(";", 1)[0]
    _, _, page = _raw(server, "GET", f"/inbox/{box['address']}/messages/{message_id}", {"Cookie": jar})
    assert 'sandbox="allow-popups"' in page and "allow-popups-to-escape-sandbox" not in page
