"""The web page of an inbox: server-rendered HTML, one small script for the live list and the buttons.

- `/` opens an inbox (address and token or API key) or creates an anonymous one.
- `/inbox/{address}?token=…` (or its form) keeps the credential in an HttpOnly, SameSite=Strict
  cookie of that inbox and redirects to `/inbox/{address}`, so the token leaves the address bar.
- `/inbox/{address}`: the messages, newest first, arriving live (EventSource on the API's
  `/events`), a search box, and delete. `/inbox/{address}/messages/{id}`: the message, its
  extracted link and code with copy buttons, the HTML part in a sandboxed frame whose own
  Content-Security-Policy blocks scripts and remote loads (images on request), the text part,
  the headers, the raw source and the attachments.
Every page is one SQL call (the list, the message, the search); the page's own CSP allows only
its script (`/static/inbox.js`), no inline script, and no framing by other sites.
"""

from __future__ import annotations

import html
import json
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from mailroom.http import sqlapi
from mailroom.http.credentials import cookie_name, csrf_token, request_credentials, split_credential
from mailroom.http.state import ApiError, State

PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "frame-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": PAGE_CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

STYLE = """
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2430;background:#f5f6f8}
header{background:#233047;color:#fff;padding:12px 24px;display:flex;gap:16px;align-items:center;flex-wrap:wrap}
header a{color:#fff;text-decoration:none;font-weight:600}
header .addr{font-family:ui-monospace,monospace;font-size:15px}
header .muted{color:#b9c3d6;font-size:13px}
main{max-width:1000px;margin:20px auto;padding:0 16px}
.card{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:16px;margin-bottom:16px}
table{border-collapse:collapse;width:100%}
td,th{padding:8px 10px;border-bottom:1px solid #eceef2;text-align:left;vertical-align:top}
tr.unread td{font-weight:600}
tr.new{animation:flash 2s}
@keyframes flash{from{background:#fff6c8}to{background:transparent}}
.muted{color:#6b7487;font-size:13px}
button,.button{background:#2f6fde;color:#fff;border:0;border-radius:6px;padding:6px 12px;font-size:14px;cursor:pointer;
text-decoration:none;display:inline-block}
button.danger{background:#c8352e}
button.ghost,.button.ghost{background:#e8ecf3;color:#1d2430}
input[type=text],input[type=search],input[type=password]{padding:6px 8px;border:1px solid #c9ced8;border-radius:6px;
font-size:14px;min-width:260px}
.live{display:inline-block;width:9px;height:9px;border-radius:50%;background:#9aa3b2;margin-right:6px}
.live.on{background:#2fb344}
.extract{display:flex;gap:10px;align-items:center;margin:6px 0;flex-wrap:wrap}
.extract code{background:#f0f2f6;padding:4px 8px;border-radius:4px;word-break:break-all}
iframe.body{width:100%;height:420px;border:1px solid #dde1e8;border-radius:6px;background:#fff}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f8fa;padding:12px;border-radius:6px;margin:0}
nav.tabs a{margin-right:14px}
.empty{color:#6b7487;text-align:center;padding:24px}
"""

SCRIPT = r"""
(function () {
  "use strict";
  var root = document.getElementById("inbox");
  var csrf = document.querySelector('meta[name="csrf-token"]');
  csrf = csrf ? csrf.content : "";
  function api(path) { return "/api/v1/mailboxes/" + encodeURIComponent(root.dataset.address) + path; }
  function text(tag, value, cls) {
    var el = document.createElement(tag); el.textContent = value == null ? "" : value;
    if (cls) el.className = cls; return el;
  }
  function when(iso) { try { return new Date(iso).toLocaleString(); } catch (e) { return iso; } }
  // copy buttons: the value is in data-copy
  document.querySelectorAll("button[data-copy]").forEach(function (b) {
    b.addEventListener("click", function () {
      var done = function () { b.textContent = "Copied"; b.dataset.copied = "1"; };
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(b.dataset.copy).then(done, function () {
          var t = document.createElement("textarea"); t.value = b.dataset.copy; document.body.appendChild(t);
          t.select(); document.execCommand("copy"); t.remove(); done();
        });
      } else { done(); }
    });
  });
  // delete buttons: DELETE on the API with the page's CSRF token
  document.querySelectorAll("button[data-delete]").forEach(function (b) {
    b.addEventListener("click", function () {
      if (!window.confirm(b.dataset.confirm || "Delete?")) return;
      fetch(api(b.dataset.delete), {method: "DELETE", headers: {"X-CSRF-Token": csrf}, credentials: "same-origin"})
        .then(function (r) { if (r.ok) { window.location = b.dataset.then; } else { r.json().then(function (e) {
          window.alert(e.detail || "refused"); }); } });
    });
  });
  // images on request: reload the sandboxed frame with images allowed
  var images = document.getElementById("show-images");
  if (images) images.addEventListener("click", function () {
    var f = document.getElementById("html-frame"); f.src = f.dataset.src + "?images=1"; images.remove();
  });
  // the live list
  var list = document.getElementById("messages");
  if (!list || !window.EventSource) return;
  var status = document.getElementById("live");
  var es = new EventSource(api("/events"));
  es.addEventListener("open", function () { status.classList.add("on"); status.title = "live"; });
  es.addEventListener("error", function () { status.classList.remove("on"); status.title = "reconnecting"; });
  es.addEventListener("message", function (ev) {
    var m = JSON.parse(ev.data);
    if (document.getElementById("m" + m.id)) return;
    var empty = document.getElementById("empty"); if (empty) empty.remove();
    var tr = document.createElement("tr"); tr.id = "m" + m.id; tr.className = "unread new";
    var a = document.createElement("a"); a.href = "/inbox/" + encodeURIComponent(root.dataset.address) + "/messages/" + m.id;
    a.textContent = m.subject || "(no subject)";
    var subj = document.createElement("td"); subj.appendChild(a);
    if (m.snippet) { subj.appendChild(document.createElement("br")); subj.appendChild(text("span", m.snippet, "muted")); }
    tr.appendChild(text("td", m.from || m.envelope_from)); tr.appendChild(subj);
    tr.appendChild(text("td", when(m.received_at), "muted"));
    list.insertBefore(tr, list.firstChild);
    var count = document.getElementById("count"); if (count) count.textContent = String(Number(count.textContent) + 1);
  });
  es.addEventListener("closed", function () { es.close(); status.classList.remove("on"); status.title = "closed";
    var c = document.getElementById("closed"); if (c) c.hidden = false; });
})();
"""


def e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _page(title: str, body: str, *, header: str = "", csrf: str = "") -> str:
    meta = f'<meta name="csrf-token" content="{e(csrf)}">' if csrf else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta name="viewport" content="width=device-width,initial-scale=1">{meta}'
        f"<title>{e(title)}</title><style>{STYLE}</style></head><body>"
        f'<header><a href="/">mailroom</a>{header}</header><main>{body}</main>'
        '<script src="/static/inbox.js"></script></body></html>'
    )


def error_page(status: int, message: str, code: str) -> str:
    hint = " (expired, deleted, or never existed)" if status == 404 else ""
    return _page(f"{status}", f'<div class="card"><h2>{status}</h2><p>{e(message)}{e(hint)}</p>'
                 f'<p class="muted">{e(code)}</p><p><a href="/">Open another inbox</a></p></div>')


def unsubscribe_page(token: str) -> str:
    """The page of an unsubscribe link opened in a browser: one button that POSTs the RFC 8058 body
    (a GET never unsubscribes: scanners follow links)."""
    return _page("Unsubscribe", f'<div class="card"><h2>Unsubscribe</h2>'
                 f'<form method="post" action="/unsubscribe/{quote(token, safe="")}">'
                 '<input type="hidden" name="List-Unsubscribe" value="One-Click">'
                 '<p>Stop receiving these emails at this address?</p>'
                 '<button type="submit">Unsubscribe</button></form></div>')


def sandboxed_html(body: str | None) -> str:
    # links open outside the frame; the frame's CSP (message_frame_headers) does the blocking
    return '<!doctype html><meta charset=utf-8><base target="_blank">' + (body or "")


def message_frame_headers(images: bool) -> dict[str, str]:
    img = "img-src data: cid: https: http:" if images else "img-src data: cid:"
    return {
        "Content-Security-Policy": (
            "sandbox allow-popups; default-src 'none'; "
            f"style-src 'unsafe-inline'; font-src data:; {img}; frame-ancestors 'self'"
        ),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-store",
    }


_ACTIVE_TYPES = ("text/html", "application/xhtml", "image/svg", "text/xml", "application/xml", "text/javascript",
                 "application/javascript")


def download_type(content_type: str | None) -> str:
    ctype = (content_type or "application/octet-stream").lower()
    return "application/octet-stream" if ctype.startswith(_ACTIVE_TYPES) or "/" not in ctype else ctype


def download_headers(filename: str) -> dict[str, str]:
    return {
        "Content-Disposition": f"attachment; filename*=UTF-8''{quote(filename, safe='')}",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox",
    }


def _inbox_header(mailbox: dict[str, Any]) -> str:
    return (f'<span class="addr">{e(mailbox["address"])}</span>'
            f'<span class="muted">plan {e(mailbox["plan"])} · expires {e(mailbox["expires_at"])}</span>')


def _inbox_url(address: str) -> str:
    return f"/inbox/{quote(address)}"


def render_inbox(mailbox: dict[str, Any], messages: list[dict[str, Any]], *, csrf: str, query: str | None,
                 results: list[dict[str, Any]] | None) -> str:
    address = mailbox["address"]
    rows = []
    for m in results if results is not None else messages:
        subject = e(m.get("subject") or "(no subject)")
        link = f'{_inbox_url(address)}/messages/{int(m["id"])}'
        snippet = f'<br><span class="muted">{e(m["snippet"])}</span>' if m.get("snippet") else ""
        unread = ' class="unread"' if m.get("is_read") is False else ""
        rows.append(f'<tr id="m{int(m["id"])}"{unread}><td>{e(m.get("from") or m.get("envelope_from"))}</td>'
                    f'<td><a href="{link}">{subject}</a>{snippet}</td>'
                    f'<td class="muted">{e(m.get("received_at"))}</td></tr>')
    empty = '<tr id="empty"><td colspan=3 class="empty">No mail yet: it appears here as it arrives.</td></tr>'
    search_note = ""
    if results is not None:
        search_note = (f'<p class="muted" id="matches">{len(results)} matching message(s) for “{e(query)}” · '
                       f'<a href="{_inbox_url(address)}">all messages</a></p>')
    body_id = "results" if results is not None else "messages"
    body = f"""
<div class="card" id="inbox" data-address="{e(address)}">
  <div style="display:flex;justify-content:space-between;align-items:center;gap:12px;flex-wrap:wrap">
    <div><span id="live" class="live" title="connecting"></span>
      <strong><span id="count">{int(mailbox.get("message_count") or len(messages))}</span> message(s)</strong>
      <span class="muted">· new mail appears here live</span></div>
    <form method="get" action="{_inbox_url(address)}"><input type="search" name="q" placeholder="Search subject, from, text"
      value="{e(query or '')}" aria-label="search"> <button type="submit" class="ghost">Search</button></form>
    <button class="danger" data-delete="" data-then="/" data-confirm="Delete this inbox and its mail?">Delete inbox</button>
  </div>
  <p id="closed" hidden class="muted">This inbox is closed (expired or deleted).</p>
  {search_note}
  <table><thead><tr><th>From</th><th>Subject</th><th>Received</th></tr></thead>
  <tbody id="{body_id}">{"".join(rows) or (empty if results is None else "")}</tbody></table>
</div>"""
    return _page(f"Inbox {address}", body, header=_inbox_header(mailbox), csrf=csrf)


def render_message(address: str, m: dict[str, Any], *, csrf: str) -> str:
    base = f"/api/v1/mailboxes/{quote(address)}/messages/{int(m['id'])}"
    extract = ""
    if m.get("link"):
        extract += (f'<div class="extract"><strong>Link</strong><code id="link">{e(m["link"])}</code>'
                    f'<button class="ghost" id="copy-link" data-copy="{e(m["link"])}">Copy link</button></div>')
    if m.get("code"):
        extract += (f'<div class="extract"><strong>Code</strong><code id="code">{e(m["code"])}</code>'
                    f'<button class="ghost" id="copy-code" data-copy="{e(m["code"])}">Copy code</button></div>')
    html_part = ""
    if m.get("body_html"):
        html_part = (f'<div class="card"><div style="display:flex;justify-content:space-between"><h3 style="margin:0">HTML</h3>'
                     f'<button class="ghost" id="show-images">Show images</button></div>'
                     f'<p class="muted">Rendered in a sandbox: scripts and remote content are blocked.</p>'
                     f'<iframe class="body" id="html-frame" sandbox="allow-popups" '
                     f'referrerpolicy="no-referrer" title="HTML part" data-src="{base}/html" src="{base}/html"></iframe></div>')
    text_part = f'<div class="card"><h3 style="margin-top:0">Text</h3><pre id="text">{e(m.get("body_text"))}</pre></div>' \
        if m.get("body_text") else ""
    headers = "".join(f"<tr><th>{e(name)}</th><td>{e(value)}</td></tr>" for name, value in m.get("headers") or [])
    attachments = "".join(
        f'<li><a href="{base}/attachments/{int(a["index"])}">{e(a.get("filename") or "attachment")}</a> '
        f'<span class="muted">{e(a.get("content_type"))}, {int(a.get("size") or 0)} bytes</span></li>'
        for a in m.get("attachments") or []
    )
    body = f"""
<div class="card" id="inbox" data-address="{e(address)}">
  <p><a href="{_inbox_url(address)}">← all messages</a></p>
  <h2 id="subject" style="margin:6px 0">{e(m.get("subject") or "(no subject)")}</h2>
  <p class="muted">From {e(m.get("from") or m.get("envelope_from"))} · to {e(m.get("to_address"))} · {e(m.get("received_at"))}
    · {int(m.get("size") or 0)} bytes</p>
  {extract}
  <p><a class="button ghost" href="{base}/raw" target="_blank" rel="noopener">Raw source</a>
    <button class="danger" data-delete="/messages/{int(m['id'])}" data-then="{_inbox_url(address)}"
      data-confirm="Delete this message?">Delete message</button></p>
</div>
{html_part}{text_part}
{'<div class="card"><h3 style="margin-top:0">Attachments</h3><ul>' + attachments + '</ul></div>' if attachments else ''}
<div class="card"><h3 style="margin-top:0">Headers</h3><table id="headers">{headers}</table></div>"""
    return _page(m.get("subject") or "message", body, header=f'<span class="addr">{e(address)}</span>', csrf=csrf)


def render_login(address: str, error: str = "") -> str:
    err = f'<p style="color:#c8352e">{e(error)}</p>' if error else ""
    body = f"""<div class="card"><h2>Open {e(address)}</h2>{err}
<form method="post" action="{_inbox_url(address)}/login">
<p><input type="password" name="token" placeholder="session token or API key" autocomplete="off" required></p>
<p><button type="submit">Open inbox</button></p></form>
<p class="muted">The token is kept in a cookie of this browser for this inbox only.</p></div>"""
    return _page(f"Open {address}", body)


def render_home() -> str:
    body = """<div class="card"><h2>Temporary inboxes</h2>
<form method="post" action="/inbox"><button type="submit">Create a temporary inbox</button>
<span class="muted"> · anonymous, the default plan</span></form></div>
<div class="card"><h3>Open an inbox</h3><form method="get" action="/inbox">
<p><input type="text" name="address" placeholder="address@domain" required></p>
<p><input type="password" name="token" placeholder="session token or API key" required autocomplete="off"></p>
<p><button type="submit">Open</button></p></form>
<p class="muted">API: <a href="/docs">/docs</a> · <a href="/openapi.json">/openapi.json</a></p></div>"""
    return _page("mailroom", body)


def same_origin(request: Request) -> bool:
    """Whether a request that would set an inbox cookie comes from this site or from the person (a typed
    or pasted address, a bookmark): the browser's Sec-Fetch-Site, else its Origin. A request that says
    neither (not a browser, or a very old one) is not trusted to set one: it gets the confirmation."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("origin")
    return origin is not None and origin == f"{request.url.scheme}://{request.url.netloc}"


def render_confirm(address: str, token: str) -> str:
    """A link with a token that came from another site: the person confirms before it becomes their cookie
    (login CSRF: a page elsewhere could otherwise open its own inbox in the person's browser)."""
    return _page("Open inbox", f'<div class="card"><h2>Open this inbox?</h2><p class="addr">{e(address)}</p>'
                 f'<form method="post" action="{e(_inbox_url(address))}/login">'
                 f'<input type="hidden" name="token" value="{e(token)}">'
                 '<p class="muted">A link from another site opens it: keep it only if you meant to.</p>'
                 '<button type="submit">Open inbox</button></form></div>')


def add_routes(app: FastAPI, state: State) -> None:  # noqa: PLR0915 - the page's routes, one place
    def html_response(content: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(content, status_code=status, headers=PAGE_HEADERS)

    def with_cookie(response: Response, address: str, credential: str) -> Response:
        response.set_cookie(cookie_name(address), credential, httponly=True, samesite="strict",
                            secure=state.config.secure_cookies, path="/", max_age=7 * 24 * 3600)
        return response

    def page_creds(request: Request, address: str) -> Any:
        c = request_credentials(request, address)
        if c.raw is None:
            raise _NeedLogin()
        return c

    class _NeedLogin(Exception):
        pass

    @app.exception_handler(_NeedLogin)
    async def need_login(request: Request, exc: _NeedLogin) -> Response:
        return html_response(render_login(request.path_params.get("address", "")), 401)

    @app.get("/static/inbox.js", include_in_schema=False)
    async def script() -> Response:
        return Response(SCRIPT, media_type="text/javascript; charset=utf-8",
                        headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"})

    @app.get("/", include_in_schema=False)
    async def home() -> Response:
        return html_response(render_home())

    def refuse_cross_site(request: Request) -> None:
        if not same_origin(request):
            # not mailroom's refusal but the edge's: the standard SQLSTATE of insufficient privilege
            raise ApiError(403, "42501", "this form posts only from mailroom's own pages", kind="denied")

    @app.post("/inbox", include_in_schema=False)
    async def new_inbox(request: Request) -> Response:
        refuse_cross_site(request)
        doc = json.loads(await state.call(sqlapi.http_create_mailbox, retry=False, key_digest=None,
                                          client=request.client.host if request.client else None))
        return with_cookie(RedirectResponse(_inbox_url(doc["address"]), status_code=303), doc["address"],
                           doc["session_token"])

    @app.get("/inbox", include_in_schema=False)
    async def open_inbox(address: str, token: str) -> Response:
        return RedirectResponse(f"{_inbox_url(address.strip())}?token={quote(token.strip())}", status_code=303)

    @app.post("/inbox/{address}/login", include_in_schema=False)
    async def login(request: Request, address: str) -> Response:
        refuse_cross_site(request)
        form = (await request.body())[:4096].decode("utf-8", "replace")
        from urllib.parse import parse_qs

        token = (parse_qs(form).get("token") or [""])[0].strip()
        if not token:
            return html_response(render_login(address, "Give the inbox's session token or an API key."), 400)
        return with_cookie(RedirectResponse(_inbox_url(address), status_code=303), address, token)

    @app.get("/inbox/{address}", include_in_schema=False)
    async def inbox(request: Request, address: str, q: str | None = None, token: str | None = None) -> Response:
        if token:  # given once: into the cookie, out of the address bar
            split_credential(token)
            if not same_origin(request):
                return html_response(render_confirm(address, token.strip()))
            return with_cookie(RedirectResponse(_inbox_url(address), status_code=303), address, token.strip())
        c = page_creds(request, address)
        try:  # one call: the list, or the search results
            if q and q.strip():
                doc = json.loads(await state.call(sqlapi.http_search_messages, query=q, limit=100, **c.sql(address)))
                results = doc["messages"]
            else:
                doc = json.loads(await state.call(sqlapi.http_mailbox_view, limit=100, **c.sql(address)))
                results = None
        except ApiError as err:
            if err.status in (401, 403):
                return html_response(render_login(address, err.message), err.status)
            raise
        return html_response(render_inbox(doc["mailbox"], doc["messages"], csrf=csrf_token(c.raw), query=q,
                                          results=results))

    @app.get("/inbox/{address}/messages/{message_id}", include_in_schema=False)
    async def message(request: Request, address: str, message_id: int) -> Response:
        c = page_creds(request, address)
        doc = json.loads(await state.call(sqlapi.http_read_message, message_id=message_id, **c.sql(address)))
        return html_response(render_message(address, doc, csrf=csrf_token(c.raw)))
