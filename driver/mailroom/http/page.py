"""The web page: server-rendered HTML, one small script (static/inbox.js) and one style sheet, no build step.

- `/` creates an anonymous inbox, opens one (address and token or API key), or opens all the mail of
  an API key's owner (`/mail`).
- `/inbox/{address}?token=…` (or its form) keeps the credential in an HttpOnly, SameSite=Strict
  cookie of that inbox and redirects to `/inbox/{address}`, so the token leaves the address bar.
  An inbox made from the page shows its session token once (a one-use cookie says it was just made).
- `/inbox/{address}`: the messages, newest first, arriving live (EventSource on the API's `/events`),
  PAGE at a time, an "Older messages" link to the next page (`?before_id=` the last one shown: keyset,
  one SQL call a page however deep), a search box (results paged the same way), selection, mark
  read/unread, tags, delete one/selected/all, the expiry's countdown and "extend", the inbox's fault
  injection; on a wide screen the list is left and the message right.
- `/inbox/{address}/messages/{id}`: the message (`?pane=1`: the same without the page around it, for
  the split pane): its link and code with copy buttons, the HTML part in a sandboxed frame (mobile,
  tablet, desktop widths), the HTML source highlighted by Pygments (escaped, server-side), the text,
  the headers, the raw source and its `.eml` download, the attachments (thumbnails of raster images),
  the checks (HTML, links, spam) and the release form.
- `/mail`: all the mail of an API key's owner (the key kept in a cookie like an inbox's token), with a
  search box (`?q=`: their mail matching it, newest first), paged by inbox.js ("Older messages").
Every page is one SQL call; the page's CSP allows only its own script and style sheet, no inline
script, and no framing by other sites. The page's buttons use the REST API with the page's CSRF header.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from functools import cache
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from mailroom.http import sqlapi
from mailroom.http.credentials import (
    KEY_COOKIE,
    cookie_name,
    csrf_token,
    request_credentials,
    sink_listing_open,
    split_credential,
)
from mailroom.http.state import ApiError, State

PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": PAGE_CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
FRESH_COOKIE = "mailroom_fresh"  # one use: the inbox just made from the page shows its session token once
HIGHLIGHT_MAX = 256 * 1024  # characters of HTML source highlighted; the rest is shown plain
THUMBNAIL_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")  # never SVG inline
PAGE = 100  # messages a page of the inbox, and search results a page
STATIC_TYPES = {"style.css": "text/css; charset=utf-8", "inbox.js": "text/javascript; charset=utf-8",
                "favicon.svg": "image/svg+xml"}


@cache
def static_file(name: str) -> bytes:
    return resources.files("mailroom.http").joinpath("static", name).read_bytes()


@cache
def pygments_css() -> str:
    from pygments.formatters import HtmlFormatter

    light = HtmlFormatter(style="default").get_style_defs(".hl")
    dark = HtmlFormatter(style="github-dark").get_style_defs(".hl")
    return f"{light}\n@media (prefers-color-scheme:dark){{\n{dark}\n}}\n"


def highlight_html(source: str | None) -> str:
    """The HTML part's source as escaped, highlighted markup (Pygments' HtmlLexer, server-side)."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import HtmlLexer

    text = source or ""
    rest = ""
    if len(text) > HIGHLIGHT_MAX:
        text, rest = text[:HIGHLIGHT_MAX], text[HIGHLIGHT_MAX:]
    out = highlight(text, HtmlLexer(), HtmlFormatter(cssclass="hl", wrapcode=True))
    if rest:
        out += f'<pre class="plain">{e(rest)}</pre>'
    return out


def e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


HELP = """<dialog id="help" aria-labelledby="help-title"><h2 id="help-title">Keyboard shortcuts</h2>
<table class="kv"><tbody>
<tr><th><kbd>j</kbd> / <kbd>k</kbd></th><td>next / previous message</td></tr>
<tr><th><kbd>o</kbd> or <kbd>Enter</kbd></th><td>open the message</td></tr>
<tr><th><kbd>#</kbd> or <kbd>Delete</kbd></th><td>delete the message</td></tr>
<tr><th><kbd>x</kbd></th><td>select the message</td></tr>
<tr><th><kbd>/</kbd></th><td>search</td></tr>
<tr><th><kbd>?</kbd></th><td>this list</td></tr>
<tr><th><kbd>Esc</kbd></th><td>close</td></tr></tbody></table>
<form method="dialog"><p><button type="submit">Close</button></p></form></dialog>"""


def _page(title: str, body: str, *, header: str = "", csrf: str = "", wide: bool = False) -> str:
    meta = f'<meta name="csrf-token" content="{e(csrf)}">' if csrf else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta name="viewport" content="width=device-width,initial-scale=1">{meta}'
        '<meta name="color-scheme" content="light dark">'
        f"<title>{e(title)}</title>"
        '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">'
        '<link rel="stylesheet" href="/static/style.css"><link rel="stylesheet" href="/static/pygments.css">'
        '</head><body>'
        f'<header class="top"><a href="/">mailroom</a>{header}<span class="spacer"></span>'
        '<button type="button" class="ghost small" id="show-help" aria-haspopup="dialog">Shortcuts <kbd>?</kbd></button>'
        f'</header><main class="{"wide" if wide else ""}">{body}</main>{HELP}'
        '<div id="status" class="sr-only" role="status" aria-live="polite"></div>'
        '<script src="/static/inbox.js"></script></body></html>'
    )


def error_page(status: int, message: str, code: str) -> str:
    hint = " (expired, deleted, or never existed)" if status == 404 else ""
    return _page(f"{status}", f'<div class="card"><h1>{status}</h1><p>{e(message)}{e(hint)}</p>'
                 f'<p class="muted">{e(code)}</p><p><a href="/">Open another inbox</a></p></div>')


def unsubscribe_page(token: str) -> str:
    """The page of an unsubscribe link opened in a browser: one button that POSTs the RFC 8058 body
    (a GET never unsubscribes: scanners follow links)."""
    return _page("Unsubscribe", f'<div class="card"><h1>Unsubscribe</h1>'
                 f'<form method="post" action="/unsubscribe/{quote(token, safe="")}">'
                 '<input type="hidden" name="List-Unsubscribe" value="One-Click">'
                 '<p>Stop receiving these emails at this address?</p>'
                 '<button type="submit">Unsubscribe</button></form></div>')


# a cid: reference in the HTML part: the same bounded character class as sql/22_reading.sql
# _inline_images (linear: no nested repetition, a failed start costs one character)
_CID_REFERENCE = re.compile(r"cid:([^\s\"'<>()]+)", re.IGNORECASE)


# at most this much data: URI text in one message frame (8 MiB of images, base64: 4/3, and some repeats)
INLINE_EMITTED_MAX = 12 * 1024 * 1024


def inline_images(body: str | None, parts: list[dict[str, Any]], payloads: dict[str, bytes]) -> str | None:
    """The HTML part with each cid: reference SQL chose (`parts`: _inline_images' cid, content_type,
    sha256, size) rewritten to a data: URI of its part's bytes (`payloads` by sha256); every other
    reference is left as is (it shows nothing). One pass over the HTML."""
    uris: dict[str, str] = {}
    for p in parts:
        data = payloads.get(p.get("sha256") or "")
        if data is not None and len(data) == p.get("size") and p.get("cid") not in uris:
            uris[p["cid"]] = f"data:{p['content_type']};base64,{base64.b64encode(data).decode('ascii')}"
    if not body or not uris:
        return body
    # SQL's cap (8 MiB) is on distinct images; a reference repeated thousands of times would repeat its
    # data: URI as often (a 100 KiB image and 150 KB of <img src=cid:a> made 1.3 GB: the attacker review
    # of issue 45). What the rewrite emits is bounded too: past INLINE_EMITTED_MAX a reference is left as is.
    budget = INLINE_EMITTED_MAX

    def rewrite(m: re.Match) -> str:
        nonlocal budget
        uri = uris.get(m.group(1))
        if uri is None or len(uri) > budget:
            return m.group(0)
        budget -= len(uri)
        return uri

    return _CID_REFERENCE.sub(rewrite, body)


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


def _inbox_url(address: str) -> str:
    return f"/inbox/{quote(address)}"


def _api(address: str) -> str:
    return f"/api/v1/mailboxes/{quote(address)}"


def _time(iso: Any, cls: str = "") -> str:
    """A time as the script shows it: the browser's local time, the ISO time on hover (title)."""
    c = f' class="{cls}"' if cls else ""
    return f'<time datetime="{e(iso)}" title="{e(iso)}"{c}>{e(iso)}</time>'


def _tags(tags: list[str] | None, address: str | None) -> str:
    if not tags:
        return ""
    links = []
    for tag in tags:
        href = f"{_inbox_url(address)}?q={quote('tag:' + tag)}" if address else f"/mail?tag={quote(tag)}"
        links.append(f'<a class="tag" href="{e(href)}" data-tag="{e(tag)}">{e(tag)}</a>')
    return "".join(links)


def message_row(m: dict[str, Any], address: str, *, show_mailbox: bool = False) -> str:
    """One message in a list; inbox.js builds the same markup for the rows that arrive live."""
    mid = int(m["id"])
    subject = m.get("subject") or "(no subject)"
    unread = m.get("is_read") is False
    cls = "msg unread" if unread else "msg"
    dot = '<span class="dot" title="unread"></span><span class="sr-only">unread, </span>' if unread else ""
    count = int(m.get("attachment_count") or (1 if m.get("has_attachments") else 0))
    clip = (f'<span class="mark" title="{count} attachment(s)">📎{count}<span class="sr-only"> attachment(s)</span></span> '
            if count else "")
    tags = m.get("tags") or []
    box = f'<span class="mailbox-of">{e(address)}</span> ' if show_mailbox else ""
    return (
        f'<li class="{cls}" id="m{mid}" data-id="{mid}" data-mailbox="{e(address)}" data-tags="{e(json.dumps(tags))}">'
        f'<input type="checkbox" class="pick" aria-label="select “{e(subject)}”">'
        f'<div class="body"><a class="open" href="{_inbox_url(address)}/messages/{mid}">'
        f'<span class="line1"><span class="from">{dot}{e(m.get("from") or m.get("envelope_from"))}</span>'
        f'{_time(m.get("received_at"))}</span>'
        f'<span class="subject">{clip}{e(subject)}</span>'
        f'<span class="snippet">{e(m.get("snippet") or "")}</span></a>'
        f'<span class="tags">{box}{_tags(tags, address)}</span></div></li>'
    )


LIST_TOOLBAR = """<div class="toolbar" id="toolbar" role="toolbar" aria-label="selected messages">
<label><input type="checkbox" id="pick-all"> all</label>
<button type="button" class="ghost small" data-act="read" disabled>Mark read</button>
<button type="button" class="ghost small" data-act="unread" disabled>Mark unread</button>
<input type="text" id="tag-name" placeholder="tag" aria-label="tag name" size="8" maxlength="64">
<button type="button" class="ghost small" data-act="tag" disabled>Add tag</button>
<button type="button" class="ghost small" data-act="untag" disabled>Remove tag</button>
<button type="button" class="danger small" data-act="delete" disabled>Delete selected</button>
{delete_all}</div>"""


def _fault_text(fault: dict[str, Any] | None) -> str:
    if not fault:
        return ""
    share = fault.get("share")
    remaining = fault.get("remaining")
    scope = f"{fault.get('scope')} " if fault.get("scope") else ""
    how = f", next {remaining}" if remaining is not None else (f", {share}% of messages" if share not in (None, 100) else "")
    return f"{scope}fault at {fault.get('stage')}: {fault.get('reply')}{how}"


def _fault_panel(mailbox: dict[str, Any]) -> str:
    fault = mailbox.get("fault")
    active = bool(fault) and fault.get("active", True) is not False
    badge = f'<span class="fault" id="fault-badge">⚠ {e(_fault_text(fault))}</span>' if active else \
        '<span class="fault" id="fault-badge" hidden></span>'
    return f"""{badge}
<details id="fault" class="fault-form"><summary>Fault injection</summary>
<form id="fault-form" class="row-flex">
<label>Stage <select name="stage"><option value="rcpt">RCPT</option><option value="data">DATA</option>
<option value="after_data">after DATA</option></select></label>
<label>Reply <input type="text" name="reply" value="451 4.3.0 injected fault" size="22" required></label>
<label>Share % <input type="number" name="share" min="0" max="100" value="100" size="4"></label>
<label>Next N <input type="number" name="count" min="1" placeholder="all" size="4"></label>
<button type="submit" class="small">Set fault</button>
<button type="button" class="ghost small" id="fault-clear">Clear</button></form>
<p class="muted">The inbound SMTP server answers this reply on purpose, to test an application's retries.</p></details>"""


def _inbox_header(mailbox: dict[str, Any]) -> str:
    address = mailbox["address"]
    max_ttl = mailbox.get("max_ttl_seconds")
    return (f'<span class="addr" id="address">{e(address)}</span>'
            f'<button type="button" class="ghost small" id="copy-address" data-copy="{e(address)}">Copy address</button>'
            f'<span class="muted">plan {e(mailbox.get("plan"))} · <span id="expires" data-expires="{e(mailbox["expires_at"])}">'
            f'expires {_time(mailbox["expires_at"])}</span></span>'
            f'<button type="button" class="ghost small" id="extend" data-max-ttl="{e(max_ttl or "")}">Extend</button>')


def _token_card(address: str, token: str) -> str:
    return (f'<div class="card token" id="token-card"><h2>Your new inbox</h2>'
            '<p>Its session token is shown only now: keep it to open this inbox elsewhere or with curl.</p>'
            f'<div class="extract"><strong>Address</strong><code id="new-address">{e(address)}</code>'
            f'<button type="button" class="ghost" id="copy-new-address" data-copy="{e(address)}">Copy address</button></div>'
            f'<div class="extract"><strong>Token</strong><code id="session-token">{e(token)}</code>'
            f'<button type="button" class="ghost" id="copy-token" data-copy="{e(token)}">Copy token</button></div>'
            f'<pre class="muted">curl -H "Authorization: Bearer {e(token)}" '
            f'{e(_api(address))}/messages</pre></div>')


def _pager(address: str, shown: list[dict[str, Any]], *, more: bool, query: str | None, paged: bool) -> str:
    """The links under a page of the list or of the results: the next page (`before_id`, the last one shown)
    when there is one, and back to the first page from a later one."""
    base = _inbox_url(address)
    links = []
    if paged:
        first = f"{base}?q={quote(query)}" if query else base
        links.append(f'<a class="button ghost small" id="newest" href="{e(first)}">'
                     f'{"First results" if query else "Newest messages"}</a>')
    if more and shown:
        q = f"q={quote(query)}&" if query else ""
        href = f"{base}?{q}before_id={int(shown[-1]['id'])}"
        links.append(f'<a class="button ghost small" id="older" rel="next" href="{e(href)}">'
                     f'{"More results" if query else "Older messages"}</a>')
    return f'<nav class="row-flex pager" aria-label="pages">{"".join(links)}</nav>' if links else ""


def render_inbox(mailbox: dict[str, Any], messages: list[dict[str, Any]], *, csrf: str, query: str | None,
                 results: list[dict[str, Any]] | None, token: str | None = None, more: bool = False,
                 paged: bool = False) -> str:
    """The inbox page: `messages` (or the search's `results`) of one page; `more`: a next page exists;
    `paged`: this is a later page (no live arrivals on it: new mail goes to the first page)."""
    address = mailbox["address"]
    shown = results if results is not None else messages
    rows = "".join(message_row(m, address) for m in shown)
    empty = ('<li id="empty" class="empty">No older messages.</li>' if paged else
             '<li id="empty" class="empty">No mail yet: it appears here as it arrives.</li>')
    search_note = ""
    if results is not None:
        count = f"{len(results)}{'+' if more else ''}"
        search_note = (f'<p class="muted" id="matches">{count} matching message(s) for “{e(query)}”'
                       f'{" (a later page)" if paged else ""} · <a href="{_inbox_url(address)}">all messages</a></p>')
    list_id = "results" if results is not None else "messages"
    pager = _pager(address, shown, more=more, query=query if results is not None else None, paged=paged)
    delete_all = '<button type="button" class="danger small" id="delete-all">Delete all</button>'
    body = f"""{_token_card(address, token) if token else ""}
<div class="card" id="inbox" data-address="{e(address)}" data-view="inbox"{' data-paged="1"' if paged else ""}>
  <div class="row-flex" style="justify-content:space-between">
    <div><span id="live" class="live" title="connecting"></span>
      <strong><span id="count">{int(mailbox.get("message_count") or len(messages))}</span> message(s)</strong>
      <span class="muted">· new mail appears here live</span></div>
    <form method="get" action="{_inbox_url(address)}" role="search" id="search-form"><input type="search" name="q" id="search"
      placeholder="Search: words, pine*, from:, tag:, is:unread" value="{e(query or '')}" aria-label="search">
      <button type="submit" class="ghost">Search</button></form>
    <div class="row-flex"><button type="button" class="ghost small" id="notify">Notify me</button>
    <button type="button" class="danger small" data-delete="" data-then="/" data-confirm="Delete this inbox and its mail?">
      Delete inbox</button></div>
  </div>
  <div class="row-flex">{_fault_panel(mailbox)}</div>
  <p id="closed" hidden class="muted">This inbox is closed (expired or deleted).</p>
  {search_note}
</div>
<div class="split has-pane" id="split">
  <section class="card" aria-label="messages">
    {LIST_TOOLBAR.format(delete_all=delete_all)}
    <ul class="messages" id="{list_id}">{rows or (empty if results is None else "")}</ul>
    {pager}
  </section>
  <section class="card" id="pane" aria-label="message" tabindex="-1"><p class="empty">Select a message (<kbd>j</kbd>,
    <kbd>k</kbd>, <kbd>o</kbd>)</p></section>
</div>"""
    return _page(f"Inbox {address}", body, header=_inbox_header(mailbox), csrf=csrf, wide=True)


def render_all_mail(mailboxes: list[dict[str, Any]], *, csrf: str, tag: str | None, query: str | None = None) -> str:
    """An API key's owner: all their open inboxes, and all their mail in one list (inbox.js fills it from
    GET /api/v1/messages, each row naming its inbox, `?q=` the search box's query), with the split pane."""
    query = (query or "").strip() or None
    if query:
        tag = None  # a search of all mail is the query alone (tag:x goes in it)
    boxes = "".join(
        f'<li><a href="{_inbox_url(b["address"])}">{e(b["address"])}</a> '
        f'<span class="muted">{int(b.get("message_count") or 0)} message(s) · expires {_time(b.get("expires_at"))}'
        f'{" · catch-all" if b.get("catchall") else ""}</span></li>'
        for b in mailboxes
    )
    note = f'<p class="muted" id="tag-filter">tag “{e(tag)}” · <a href="/mail">all mail</a></p>' if tag else ""
    if query:
        note = f'<p class="muted" id="matches">messages matching “{e(query)}” · <a href="/mail">all mail</a></p>'
    body = f"""<div class="card" id="inbox" data-view="all" data-tag="{e(tag or "")}" data-q="{e(query or "")}">
  <div class="row-flex" style="justify-content:space-between"><h1 style="font-size:1.3em;margin:0">All my mail</h1>
  <form method="get" action="/mail" role="search" id="search-form"><input type="search" name="q" id="search"
    placeholder="Search all my mail: words, from:, tag:, is:unread" value="{e(query or '')}" aria-label="search all my mail">
    <button type="submit" class="ghost">Search</button></form>
  <button type="button" class="ghost small" id="notify">Notify me</button></div>
  <details id="inboxes"><summary>{len(mailboxes)} open inbox(es)</summary><ul id="mailboxes">{boxes}</ul></details>{note}
</div>
<div class="split has-pane" id="split">
  <section class="card" aria-label="messages">
    {LIST_TOOLBAR.format(delete_all="")}
    <ul class="messages" id="messages"><li id="empty" class="empty">Loading…</li></ul>
    <p><button type="button" class="ghost small" id="more" hidden>Older messages</button></p>
  </section>
  <section class="card" id="pane" aria-label="message" tabindex="-1"><p class="empty">Select a message</p></section>
</div>"""
    return _page("All my mail", body, header='<span class="muted">an API key\'s inboxes</span>', csrf=csrf, wide=True)


def _attachments(base: str, m: dict[str, Any]) -> str:
    items = []
    for a in m.get("attachments") or []:
        url = f'{base}/attachments/{int(a["index"])}'
        name = a.get("filename") or "attachment"
        ctype = (a.get("content_type") or "").lower().split(";")[0].strip()
        thumb = (f'<a href="{url}"><img src="{url}" alt="{e(name)}" loading="lazy"></a>'
                 if ctype in THUMBNAIL_TYPES else "")
        items.append(f'<li>{thumb}<a href="{url}" download>{e(name)}</a><br>'
                     f'<span class="muted">{e(a.get("content_type"))}, {int(a.get("size") or 0)} bytes</span></li>')
    return "".join(items)


def _tab(key: str, label: str, selected: bool = False, hidden: bool = False) -> str:
    return (f'<button type="button" role="tab" id="tab-{key}" aria-controls="panel-{key}" '
            f'aria-selected="{"true" if selected else "false"}" tabindex="{0 if selected else -1}"'
            f'{" hidden" if hidden else ""} data-tab="{key}">{label}</button>')


def _panel(key: str, content: str, selected: bool = False, extra: str = "") -> str:
    return (f'<div role="tabpanel" id="panel-{key}" aria-labelledby="tab-{key}" tabindex="0"'
            f'{"" if selected else " hidden"}{extra}>{content}</div>')


def message_block(address: str, m: dict[str, Any], *, pane: bool = False) -> str:
    """The message: the whole page's main part, or the split pane's content (`pane`)."""
    mid = int(m["id"])
    base = f"{_api(address)}/messages/{mid}"
    page_url = f"{_inbox_url(address)}/messages/{mid}"
    extract = ""
    if m.get("link"):
        extract += (f'<div class="extract"><strong>Link</strong><code id="link">{e(m["link"])}</code>'
                    f'<button type="button" class="ghost" id="copy-link" data-copy="{e(m["link"])}">Copy link</button></div>')
    if m.get("code"):
        extract += (f'<div class="extract"><strong>Code</strong><code id="code">{e(m["code"])}</code>'
                    f'<button type="button" class="ghost" id="copy-code" data-copy="{e(m["code"])}">Copy code</button></div>')
    has_html = bool(m.get("body_html"))
    first = "html" if has_html else "text"
    attachments = _attachments(base, m)
    n_att = len(m.get("attachments") or [])
    tabs = "".join([
        _tab("html", "HTML", first == "html", hidden=not has_html),
        _tab("source", "HTML source", hidden=not has_html),
        _tab("text", "Text", first == "text"),
        _tab("headers", "Headers"),
        _tab("raw", "Raw"),
        _tab("attachments", f"Attachments ({n_att})", hidden=not n_att),
        _tab("check-html", "HTML check", hidden=not has_html),
        _tab("check-links", "Link check"),
        _tab("check-spam", "Spam score"),
        _tab("release", "Release"),
    ])
    frame = ""
    if has_html:
        frame = (f'<div class="row-flex" role="group" aria-label="preview width">'
                 '<button type="button" class="ghost small" data-width="375">Mobile 375</button>'
                 '<button type="button" class="ghost small" data-width="768">Tablet 768</button>'
                 '<button type="button" class="ghost small" data-width="" aria-pressed="true">Desktop</button>'
                 '<button type="button" class="ghost small" id="show-images">Show images</button></div>'
                 '<p class="muted">Rendered in a sandbox: scripts and remote content are blocked.</p>'
                 f'<iframe class="body" id="html-frame" sandbox="allow-popups" referrerpolicy="no-referrer" '
                 f'title="HTML part" data-src="{base}/html" src="{base}/html"></iframe>')
    source = highlight_html(m.get("body_html")) if has_html else ""
    text = f'<pre id="text">{e(m.get("body_text"))}</pre>' if m.get("body_text") else '<p class="muted">No text part.</p>'
    headers = "".join(f"<tr><th scope=row>{e(name)}</th><td>{e(value)}</td></tr>" for name, value in m.get("headers") or [])
    raw = (f'<p><a class="button ghost" id="eml" href="{page_url}/eml" download>Download .eml</a> '
           f'<a href="{base}/raw" target="_blank" rel="noopener">open as text</a></p>'
           f'<pre id="raw" data-src="{base}/raw">…</pre>')
    release = ('<form id="release-form" class="row-flex"><label>To <input type="email" name="to" required '
               'placeholder="someone@example.com"></label><label>Sender <select name="sender"></select></label>'
               '<button type="submit">Release</button></form>'
               '<p class="muted">Sends the stored bytes as received (with Resent- headers) through the outbound '
               'queue.</p><p id="release-result" role="status"></p>')
    panels = "".join([
        _panel("html", frame, first == "html"),
        _panel("source", source),
        _panel("text", text, first == "text"),
        _panel("headers", f'<table class="kv" id="headers"><tbody>{headers}</tbody></table>'),
        _panel("raw", raw),
        _panel("attachments", f'<ul class="thumbs" id="attachments">{attachments}</ul>'),
        _panel("check-html", '<p class="muted">Checking…</p>', extra=' data-check="html"'),
        _panel("check-links", '<p class="muted">Checking…</p>', extra=' data-check="links"'),
        _panel("check-spam", '<p class="muted">Checking…</p>', extra=' data-check="spam"'),
        _panel("release", release),
    ])
    back = "" if pane else f'<p><a href="{_inbox_url(address)}">← all messages</a></p>'
    heading = "h2" if pane else "h1"
    tags = m.get("tags") or []
    return f"""<article id="message" data-address="{e(address)}" data-id="{mid}" data-base="{e(base)}"
  data-tags="{e(json.dumps(tags))}" aria-labelledby="subject">
  {back}
  <{heading} id="subject" style="margin:6px 0;font-size:1.35em">{e(m.get("subject") or "(no subject)")}</{heading}>
  <p class="muted">From {e(m.get("from") or m.get("envelope_from"))} · to {e(m.get("to_address"))} · {_time(m.get("received_at"))}
    · {int(m.get("size") or 0)} bytes</p>
  {extract}
  <div class="row-flex"><span id="msg-tags">{_tags(tags, address)}</span>
    <form id="tag-form" class="row-flex"><input type="text" name="tag" placeholder="new tag" aria-label="new tag" size="10"
      maxlength="64"><button type="submit" class="ghost small">Add tag</button></form></div>
  <div class="row-flex" style="margin-top:8px">
    <button type="button" class="ghost small" id="mark-unread">Mark unread</button>
    <a class="button ghost small" href="{page_url}/eml" download>Download .eml</a>
    <button type="button" class="danger small" data-delete="/messages/{mid}" data-then="{_inbox_url(address)}"
      data-confirm="Delete this message?">Delete message</button></div>
  <div class="tabs" role="tablist" aria-label="message parts">{tabs}</div>
  {panels}
</article>"""


def render_message(address: str, m: dict[str, Any], *, csrf: str) -> str:
    body = f'<div class="card" id="inbox" data-address="{e(address)}" data-view="message">{message_block(address, m)}</div>'
    return _page(m.get("subject") or "message", body, header=f'<span class="addr">{e(address)}</span>', csrf=csrf)


def render_login(address: str, error: str = "") -> str:
    err = f'<p style="color:var(--bad)">{e(error)}</p>' if error else ""
    body = f"""<div class="card"><h1>Open {e(address)}</h1>{err}
<form method="post" action="{_inbox_url(address)}/login">
<p><input type="password" name="token" placeholder="session token or API key" aria-label="session token or API key"
  autocomplete="off" required></p>
<p><button type="submit">Open inbox</button></p></form>
<p class="muted">The token is kept in a cookie of this browser for this inbox only.</p></div>"""
    return _page(f"Open {address}", body)


def render_key_login(error: str = "") -> str:
    err = f'<p style="color:var(--bad)">{e(error)}</p>' if error else ""
    body = f"""<div class="card"><h1>All my mail</h1>{err}
<form method="post" action="/mail/login">
<p><input type="password" name="key" placeholder="API key (mrk_…)" aria-label="API key" autocomplete="off" required></p>
<p><button type="submit">Open all my mail</button></p></form>
<p class="muted">The key is kept in a cookie of this browser (HttpOnly, this site only).</p></div>"""
    return _page("All my mail", body)


def render_sink_mail(mailboxes: list[dict[str, Any]]) -> str:
    """The sink's open listing (http serve --sink on loopback, or --sink-public): every sink inbox, newest
    first, each opened by the session token the listing gives (as any anonymous inbox)."""
    boxes = "".join(
        f'<li><a href="{_inbox_url(b["address"])}?token={quote(str(b.get("session_token") or ""), safe="")}">'
        f'{e(b["address"])}</a> <span class="muted">{int(b.get("message_count") or 0)} message(s) · expires '
        f'{_time(b.get("expires_at"))}</span></li>'
        for b in mailboxes
    )
    body = f"""<div class="card" id="sink"><h1>The sink</h1>
<p class="muted">Every recipient at every domain gets an inbox here (docs/inboxes.md, the sink); no key needed.</p>
<ul>{boxes or '<li class="muted">No mail yet.</li>'}</ul></div>"""
    return _page("The sink", body)


def render_home() -> str:
    body = """<div class="card"><h1>Temporary inboxes</h1>
<form method="post" action="/inbox"><button type="submit">Create a temporary inbox</button>
<span class="muted"> · anonymous, the default plan</span></form></div>
<div class="card"><h2>Open an inbox</h2><form method="get" action="/inbox">
<p><input type="text" name="address" placeholder="address@domain" aria-label="address" required></p>
<p><input type="password" name="token" placeholder="session token or API key" aria-label="session token or API key"
  required autocomplete="off"></p>
<p><button type="submit">Open</button></p></form>
<p><a href="/mail">All the mail of an API key</a></p>
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
    return _page("Open inbox", f'<div class="card"><h1>Open this inbox?</h1><p class="addr">{e(address)}</p>'
                 f'<form method="post" action="{e(_inbox_url(address))}/login">'
                 f'<input type="hidden" name="token" value="{e(token)}">'
                 '<p class="muted">A link from another site opens it: keep it only if you meant to.</p>'
                 '<button type="submit">Open inbox</button></form></div>')


def eml_headers(message_id: int) -> dict[str, str]:
    return {
        "Content-Disposition": f'attachment; filename="message-{message_id}.eml"',
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox",
        "Cache-Control": "no-store",
    }


async def _form(request: Request, name: str) -> str:
    body = (await request.body())[:4096].decode("utf-8", "replace")
    return (parse_qs(body).get(name) or [""])[0].strip()


def add_routes(app: FastAPI, state: State) -> None:  # noqa: PLR0915 - the page's routes, one place
    def html_response(content: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(content, status_code=status, headers=PAGE_HEADERS)

    def with_cookie(response: Response, name: str, credential: str) -> Response:
        response.set_cookie(name, credential, httponly=True, samesite="strict",
                            secure=state.config.secure_cookies, path="/", max_age=7 * 24 * 3600)
        return response

    class _NeedLogin(Exception):
        pass

    def page_creds(request: Request, address: str) -> Any:
        c = request_credentials(request, address)
        if c.raw is None:
            raise _NeedLogin()
        return c

    @app.exception_handler(_NeedLogin)
    async def need_login(request: Request, exc: _NeedLogin) -> Response:
        return html_response(render_login(request.path_params.get("address", "")), 401)

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name == "pygments.css":
            return Response(pygments_css(), media_type="text/css; charset=utf-8",
                            headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"})
        if name not in STATIC_TYPES:
            raise ApiError(404, "", "no such file", kind="not_found")
        return Response(static_file(name), media_type=STATIC_TYPES[name],
                        headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(static_file("favicon.svg"), media_type="image/svg+xml",
                        headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"})

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
        name = cookie_name(doc["address"])
        response = with_cookie(RedirectResponse(_inbox_url(doc["address"]), status_code=303), name, doc["session_token"])
        # one use, a minute: the next view of this inbox shows its token once, then deletes it
        response.set_cookie(FRESH_COOKIE, name, httponly=True, samesite="strict", secure=state.config.secure_cookies,
                            path="/", max_age=60)
        return response

    @app.get("/inbox", include_in_schema=False)
    async def open_inbox(address: str, token: str) -> Response:
        return RedirectResponse(f"{_inbox_url(address.strip())}?token={quote(token.strip())}", status_code=303)

    @app.post("/inbox/{address}/login", include_in_schema=False)
    async def login(request: Request, address: str) -> Response:
        refuse_cross_site(request)
        token = await _form(request, "token")
        if not token:
            return html_response(render_login(address, "Give the inbox's session token or an API key."), 400)
        return with_cookie(RedirectResponse(_inbox_url(address), status_code=303), cookie_name(address), token)

    @app.get("/inbox/{address}", include_in_schema=False)
    async def inbox(request: Request, address: str, q: str | None = None, token: str | None = None,
                    before_id: int | None = None) -> Response:
        if token:  # given once: into the cookie, out of the address bar
            split_credential(token)
            if not same_origin(request):
                return html_response(render_confirm(address, token.strip()))
            return with_cookie(RedirectResponse(_inbox_url(address), status_code=303), cookie_name(address), token.strip())
        c = page_creds(request, address)
        try:  # one call: a page of the list, or of the search results (one more than shown: is there a next?)
            if q and q.strip():
                doc = json.loads(await state.call(sqlapi.http_search_messages, query=q, limit=PAGE + 1,
                                                  before_id=before_id, **c.sql(address)))
                results = doc["messages"][:PAGE]
                more = len(doc["messages"]) > PAGE
            else:
                doc = json.loads(await state.call(sqlapi.http_mailbox_view, limit=PAGE + 1, before_id=before_id,
                                                  **c.sql(address)))
                results = None
                more = len(doc["messages"]) > PAGE
                doc["messages"] = doc["messages"][:PAGE]
        except ApiError as err:
            if err.status in (401, 403):
                return html_response(render_login(address, err.message), err.status)
            if err.status == 409 and before_id is not None and q:
                # the search page's last message is gone (deleted, or let go by a full inbox): its first page
                return RedirectResponse(f"{_inbox_url(address)}?q={quote(q)}", status_code=303)
            raise
        fresh = c.session_token is not None and c.from_cookie and request.cookies.get(FRESH_COOKIE) == cookie_name(address)
        response = html_response(render_inbox(doc["mailbox"], doc.get("messages") or [], csrf=csrf_token(c.raw), query=q,
                                              results=results, token=c.session_token if fresh else None, more=more,
                                              paged=before_id is not None))
        if request.cookies.get(FRESH_COOKIE) is not None:
            response.delete_cookie(FRESH_COOKIE, path="/")
        return response

    @app.get("/inbox/{address}/messages/{message_id}", include_in_schema=False)
    async def message(request: Request, address: str, message_id: int, pane: int = 0) -> Response:
        c = page_creds(request, address)
        doc = json.loads(await state.call(sqlapi.http_read_message, message_id=message_id, **c.sql(address)))
        if pane:
            return html_response(message_block(address, doc, pane=True))
        return html_response(render_message(address, doc, csrf=csrf_token(c.raw)))

    @app.get("/inbox/{address}/messages/{message_id}/eml", include_in_schema=False)
    async def eml(request: Request, address: str, message_id: int) -> Response:
        c = page_creds(request, address)
        raw = await state.call(sqlapi.http_message_raw, message_id=message_id, **c.sql(address))
        return Response(bytes(raw), media_type="message/rfc822", headers=eml_headers(message_id))

    @app.get("/mail", include_in_schema=False)
    async def all_mail(request: Request, tag: str | None = None, q: str | None = None) -> Response:
        key = request.cookies.get(KEY_COOKIE)
        if not key and sink_listing_open(request, state.config.sink_listing, state.config.sink_public):
            # the sink's open listing (docs/inboxes.md): loopback peers naming a loopback host, or --sink-public
            boxes = json.loads(await state.call(sqlapi.http_list_mailboxes, key_digest=None, limit=500, offset=0,
                                                sink=True))
            return html_response(render_sink_mail(boxes))
        if not key:
            return html_response(render_key_login(), 401)
        digest = hashlib.sha256(key.strip().encode()).digest()  # only a key's digest reaches SQL
        try:  # one call: the owner's open inboxes; the messages come from GET /api/v1/messages
            boxes = json.loads(await state.call(sqlapi.http_list_mailboxes, key_digest=digest, limit=100, offset=0))
        except ApiError as err:
            if err.status in (401, 403):
                return html_response(render_key_login(err.message), err.status)
            raise
        return html_response(render_all_mail(boxes, csrf=csrf_token(key.strip()), tag=tag, query=q))

    @app.post("/mail/login", include_in_schema=False)
    async def key_login(request: Request) -> Response:
        refuse_cross_site(request)
        key = await _form(request, "key")
        if not key:
            return html_response(render_key_login("Give an API key."), 400)
        return with_cookie(RedirectResponse("/mail", status_code=303), KEY_COOKIE, key)
