"""The web page in a real browser, used as a person would (issue 35, items 1 and 6): Debian's chromium,
headless, driven by Playwright, against a real `mailroom http serve` and real SMTP delivery to
`mailroom inbox serve`. One server, one browser for the module; each test its own context and inboxes.

The server runs every check: the link check (`--link-check`, loopback allowed for the test's own
HTTP server, one link answering 200 and one 404) and the spam check (`--spamd`, a real spamd, a GTUBE
message); release is on for an outbound sender pointing at the real inbound server, and a release from
the page leaves its row in the outbound queue. Nothing is skipped: every view and route is on this
server. Screenshots go to docs/img/ with MAILROOM_SCREENSHOTS=1.
"""
from __future__ import annotations

import json
import os
import re
import time

import pytest
from browser_support import (
    CHROMIUM,
    FLAGS,
    axe_violations,
    link_target,
    open_inbox,
    phone_fits,
    png,
    running_spamd,
    send,
    shoot,
    start_smtp,
)

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium is not installed (apt-get install chromium)")

WIDE = {"width": 1280, "height": 820}
GTUBE = "XJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X"


@pytest.fixture(scope="module")
def links_base() -> str:
    """The loopback HTTP server the link check asks: /ok answers 200, anything else 404."""
    with link_target() as base:
        yield base


@pytest.fixture(scope="module")
def spamd(tmp_path_factory) -> str:
    """A real spamd (tests/checks' helper: network tests off, no rule update): host:port."""
    with running_spamd(tmp_path_factory.mktemp("spamd")) as address:
        yield address


@pytest.fixture(scope="module")
def server_flags(spamd: str) -> tuple[str, ...]:
    """This module's server runs the link check (loopback allowed: the test's own server) and the spam check."""
    return ("--link-check", "--link-check-allow", "127.0.0.1/32", "--spamd", spamd)


@pytest.fixture(scope="module")
def smtp_port(db_url, tmp_path_factory):
    proc, port = start_smtp(db_url, tmp_path_factory.mktemp("smtp") / "smtp.log")
    yield port
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def context(browser, server):
    ctx = browser.new_context(viewport=WIDE, base_url=server.base)
    ctx.set_default_timeout(5000)
    yield ctx
    ctx.close()


@pytest.fixture
def page(context):
    p = context.new_page()
    p.errors = []
    p.on("pageerror", lambda exc: p.errors.append(str(exc)))
    return p


def new_box(server) -> dict:
    return server.request("POST", "/api/v1/mailboxes?ttl_minutes=30").json()


def wait_count(server, box, n, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages", token=box["session_token"]).json()
        if len(got) >= n:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{n} message(s) not delivered")


def test_inbox_made_from_the_page_shows_its_token_once_live_arrival_local_time(page, context, server, smtp_port):
    from playwright.sync_api import expect

    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.base)
    page.goto("/")
    page.get_by_role("button", name="Create a temporary inbox").click()
    expect(page.locator("#session-token")).to_be_visible()
    token = page.locator("#session-token").text_content()
    address = page.locator("#new-address").text_content()
    assert token and address and token not in page.url
    page.locator("#copy-token").click()
    expect(page.locator("#copy-token")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == token
    page.locator("#copy-address").click()
    assert page.evaluate("navigator.clipboard.readText()") == address
    # the token works elsewhere (curl's way) and the countdown runs
    assert server.request("GET", f"/api/v1/mailboxes/{address}", token=token).status == 200
    expect(page.locator("#expires time")).to_have_text(re.compile(r"^expires in \d+m \d\ds$"))
    assert page.locator("#expires time").get_attribute("title").endswith(")")  # the ISO time on hover
    expect(page.locator("#live.on")).to_be_visible()
    shoot(page, "http-new-inbox")

    send(smtp_port, address, "Activate your account", text="Activate: https://app.example.org/a?t=1\nCode 48213")
    row = page.locator("#messages li.msg", has_text="Activate your account")
    expect(row).to_be_visible()  # arrived live, no reload
    expect(row).to_have_class(re.compile(r"\bunread\b"))
    live_time = row.locator("time").text_content()
    iso = row.locator("time").get_attribute("title")
    assert "T" in iso and live_time != iso and "+00:00" not in live_time  # the browser's local time
    page.reload()
    assert page.locator("#session-token").count() == 0  # shown once
    expect(page.locator("#messages li.msg time").first).to_have_text(live_time)  # the same format from the server
    assert page.locator("#messages li.msg time").first.get_attribute("title") == iso
    assert page.errors == []


def test_message_views_source_raw_eml_thumbnails_and_preview_widths(page, server, smtp_port):
    from playwright.sync_api import expect

    box = new_box(server)
    html = ("<html><head><style>h1{color:#c00}</style></head><body><h1 id='greeting'>Welcome to Example</h1>"
            "<p><a href='https://app.example.org/activate?t=Zx81-q'>Activate</a> code <b>48213</b></p>"
            "<p id='victim'>script did not run</p><script>document.getElementById('victim').textContent='RAN'</script>"
            "</body></html>")
    send(smtp_port, box["address"], "Welcome aboard", text="Welcome!\nhttps://app.example.org/activate?t=Zx81-q\n48213\n",
         html=html, attachments=[("chart.png", "image/png", png()), ("notes.txt", "text/plain", b"plain notes")])
    listed = wait_count(server, box, 1)
    open_inbox(page, server.base, box)
    row = page.locator("#messages li.msg").first
    expect(row.locator(".mark")).to_have_text(re.compile("📎2"))  # the attachment mark
    page.goto(f"/inbox/{box['address']}/messages/{listed[0]['id']}")
    frame = page.frame_locator("#html-frame")
    expect(frame.locator("#greeting")).to_have_text("Welcome to Example")
    expect(frame.locator("#victim")).to_have_text("script did not run")
    expect(page.locator("#link")).to_have_text("https://app.example.org/activate?t=Zx81-q")
    page.get_by_role("button", name="Mobile 375").click()
    assert page.locator("#html-frame").evaluate("f => f.getBoundingClientRect().width") == 375
    shoot(page, "http-message-mobile", full_page=True)
    page.get_by_role("button", name="Tablet 768").click()
    assert page.locator("#html-frame").evaluate("f => f.getBoundingClientRect().width") == 768
    page.get_by_role("button", name="Desktop").click()
    assert page.locator("#html-frame").evaluate("f => f.getBoundingClientRect().width") > 768
    shoot(page, "http-message", full_page=True)

    page.get_by_role("tab", name="HTML source").click()
    src = page.locator("#panel-source .hl")
    expect(src).to_contain_text("<h1 id='greeting'>")  # shown as text, escaped
    assert src.locator("span.nt").count() > 3  # Pygments' tag tokens
    shoot(page, "http-source")
    page.get_by_role("tab", name="Text").click()
    expect(page.locator("#text")).to_contain_text("Welcome!")
    page.get_by_role("tab", name="Headers").click()
    expect(page.locator("#headers")).to_contain_text("Welcome aboard")
    page.get_by_role("tab", name="Raw").click()
    expect(page.locator("#raw")).to_contain_text("Content-Type: multipart/")
    with page.expect_download() as info:
        page.locator("#eml").click()
    download = info.value
    assert download.suggested_filename == f"message-{listed[0]['id']}.eml"
    assert b"Subject: Welcome aboard" in open(download.path(), "rb").read()
    page.get_by_role("tab", name="Attachments (2)").click()
    thumb = page.locator("#attachments img")
    expect(thumb).to_have_count(1)  # the PNG only, never the text file
    page.wait_for_function("() => document.querySelector('#attachments img').naturalWidth === 24")
    shoot(page, "http-attachments")
    eml = server.request("GET", f"/inbox/{box['address']}/messages/{listed[0]['id']}/eml")
    assert eml.status == 401  # no cookie, no .eml
    assert page.errors == []


def test_split_pane_and_keyboard_shortcuts(page, server, smtp_port):
    from playwright.sync_api import expect

    box = new_box(server)
    for n in range(3):
        send(smtp_port, box["address"], f"Order {n}", text=f"order number {n}")
    wait_count(server, box, 3)
    open_inbox(page, server.base, box)
    rows = page.locator("#messages li.msg")
    expect(rows).to_have_count(3)
    page.keyboard.press("j")
    expect(rows.nth(0)).to_have_class(re.compile(r"\bcurrent\b"))
    page.keyboard.press("j")
    page.keyboard.press("j")
    expect(rows.nth(2)).to_have_class(re.compile(r"\bcurrent\b"))
    page.keyboard.press("k")
    expect(rows.nth(1)).to_have_class(re.compile(r"\bcurrent\b"))
    page.keyboard.press("o")
    pane = page.locator("#pane #message")
    expect(pane.locator("#subject")).to_have_text("Order 1")  # the split pane: list left, message right
    assert page.url.endswith(box["address"].replace("@", "%40"))  # no navigation
    list_box = page.locator("#messages").bounding_box()
    pane_box = page.locator("#pane").bounding_box()
    assert list_box["x"] + list_box["width"] <= pane_box["x"]
    expect(rows.nth(1)).not_to_have_class(re.compile(r"\bunread\b"))  # reading marked it read
    shoot(page, "http-inbox")
    rows.nth(2).locator("a.open").click()
    expect(pane.locator("#subject")).to_have_text("Order 0")
    page.keyboard.press("#")
    expect(rows).to_have_count(2)
    expect(page.locator("#count")).to_have_text("2")
    expect(page.locator("#pane #message")).to_have_count(0)
    assert len(wait_count(server, box, 2)) == 2
    page.keyboard.press("Delete")  # the current row moved to its neighbour
    expect(rows).to_have_count(1)
    page.keyboard.press("/")
    expect(page.locator("#search")).to_be_focused()
    page.keyboard.press("Escape")
    page.keyboard.press("?")
    expect(page.locator("#help")).to_be_visible()
    expect(page.locator("#help")).to_contain_text("next / previous message")
    shoot(page, "http-shortcuts")
    page.keyboard.press("Escape")
    expect(page.locator("#help")).to_be_hidden()
    assert page.errors == []


def test_dark_mode_and_phone_width(browser, server, smtp_port):
    from playwright.sync_api import expect

    box = new_box(server)
    send(smtp_port, box["address"], "A rather long subject line that would overflow a narrow table " * 2,
         text="x" * 400, html="<p>" + "wide " * 200 + "</p><table width=900><tr><td>wide table</td></tr></table>",
         attachments=[("a-very-long-file-name-that-does-not-wrap-easily.png", "image/png", png())])
    listed = wait_count(server, box, 1)
    ctx = browser.new_context(viewport={"width": 375, "height": 740}, color_scheme="dark", base_url=server.base)
    try:
        page = ctx.new_page()
        open_inbox(page, server.base, box)
        expect(page.locator("#messages li.msg")).to_have_count(1)
        bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert bg == "rgb(18, 22, 29)", bg  # dark, following the system
        phone_fits(page)
        shoot(page, "http-phone-dark")
        page.locator("#messages li.msg a.open").click()  # narrow: the message's own page
        expect(page.locator("#subject")).to_be_visible()
        assert page.url.endswith(f"/messages/{listed[0]['id']}")
        for tab in ("HTML", "HTML source", "Text", "Headers", "Raw", "Attachments (1)"):
            page.get_by_role("tab", name=tab, exact=True).click()
            phone_fits(page)
        shoot(page, "http-message-phone-dark", full_page=True)
    finally:
        ctx.close()
    light = browser.new_context(viewport=WIDE, color_scheme="light", base_url=server.base)
    try:
        page = light.new_page()
        page.goto("/")
        assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(245, 246, 248)"
        icon = page.locator('link[rel="icon"]').get_attribute("href")
        resp = page.request.get(icon)
        assert resp.status == 200 and resp.headers["content-type"].startswith("image/svg+xml")
    finally:
        light.close()


NOTIFICATION_PROBE = """
window.__notified = [];
window.__asked = 0;
if (window.Notification) {
  const Real = window.Notification;
  const asked = Real.requestPermission.bind(Real);
  window.Notification = function (title, options) { window.__notified.push(title); return new Real(title, options); };
  Object.defineProperty(window.Notification, "permission", {get: () => Real.permission});
  window.Notification.requestPermission = function (cb) { window.__asked += 1; return asked(cb); };
}
"""


def test_notification_on_new_mail_when_allowed_never_asked_on_load(browser, server, smtp_port):
    from playwright.sync_api import expect

    box = new_box(server)
    asked = browser.new_context(viewport=WIDE, base_url=server.base)  # permission not given: never asked on load
    try:
        page = asked.new_page()
        page.add_init_script(NOTIFICATION_PROBE)
        open_inbox(page, server.base, box)
        expect(page.locator("#live.on")).to_be_visible()
        assert page.evaluate("window.__asked") == 0
        page.locator("#notify").click()
        assert page.evaluate("window.__asked") == 1  # on a click
    finally:
        asked.close()
    ctx = browser.new_context(viewport=WIDE, base_url=server.base)
    try:
        ctx.grant_permissions(["notifications"], origin=server.base)
        page = ctx.new_page()
        page.add_init_script(NOTIFICATION_PROBE)
        open_inbox(page, server.base, box)
        expect(page.locator("#notify")).to_have_text("Notifications on")
        expect(page.locator("#live.on")).to_be_visible()
        send(smtp_port, box["address"], "Ping from the app")
        expect(page.locator("#messages li.msg", has_text="Ping from the app")).to_be_visible()
        page.wait_for_function("window.__notified.length === 1")
        assert page.evaluate("window.__notified") == ["Ping from the app"]
    finally:
        ctx.close()


def test_list_actions_read_unread_tags_delete_selected_and_all(page, server, smtp_port):
    from playwright.sync_api import expect

    box = new_box(server)
    local, domain = box["address"].split("@")
    for n in range(3):
        send(smtp_port, box["address"], f"Report {n}")
    send(smtp_port, f"{local}+billing@{domain}", "Invoice by plus address")
    wait_count(server, box, 4)
    open_inbox(page, server.base, box)
    rows = page.locator("#messages li.msg")
    expect(rows).to_have_count(4)
    plus = rows.filter(has_text="Invoice by plus address")
    expect(plus.locator(".tag")).to_have_text("billing")  # plus-addressing tagged it
    first = rows.filter(has_text="Report 0")
    first.locator(".pick").check()
    page.get_by_role("button", name="Mark read").click()
    expect(first).not_to_have_class(re.compile(r"\bunread\b"))
    page.get_by_role("button", name="Mark unread").click()
    expect(first).to_have_class(re.compile(r"\bunread\b"))
    page.locator("#tag-name").fill("Urgent")
    page.get_by_role("button", name="Add tag").click()
    expect(first.locator(".tag")).to_have_text("urgent")
    got = server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages", token=box["session_token"]).json()
    assert [m["tags"] for m in got if m["subject"] == "Report 0"] == [["urgent"]]
    first.locator(".tag").click()  # filter by tag
    expect(page.locator("#results li.msg")).to_have_count(1)
    page.go_back()
    page.reload()
    rows.filter(has_text="Report 1").locator(".pick").check()
    rows.filter(has_text="Report 2").locator(".pick").check()
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Delete selected").click()
    expect(rows).to_have_count(2)
    assert len(server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages", token=box["session_token"]).json()) == 2
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Delete all").click()
    expect(rows).to_have_count(0)
    assert server.request("GET", f"/api/v1/mailboxes/{box['address']}", token=box["session_token"]).status == 200
    assert server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages", token=box["session_token"]).json() == []
    assert page.errors == []


def test_extend_within_the_plan(page, server):
    from playwright.sync_api import expect

    box = new_box(server)
    open_inbox(page, server.base, box)
    before = page.locator("#expires").get_attribute("data-expires")
    page.locator("#extend").click()
    expect(page.locator("#expires")).not_to_have_attribute("data-expires", before)
    after = server.request("GET", f"/api/v1/mailboxes/{box['address']}", token=box["session_token"]).json()
    assert after["expires_at"] > before


def test_all_mail_of_an_api_key_owner_in_one_list(page, server, smtp_port, cli):
    from playwright.sync_api import expect

    key = json.loads(cli("apikey", "create", "browser-team", "--json").stdout)["api_key"]
    boxes = [server.request("POST", "/api/v1/mailboxes", token=key).json() for _ in range(2)]
    for n, b in enumerate(boxes):
        send(smtp_port, b["address"], f"For inbox {n}")
    page.goto("/mail")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Open all my mail").click()
    rows = page.locator("#messages li.msg")
    expect(rows).to_have_count(2)
    for n, b in enumerate(boxes):
        expect(rows.filter(has_text=f"For inbox {n}").locator(".mailbox-of")).to_have_text(b["address"])
    rows.filter(has_text="For inbox 1").locator("a.open").click()
    expect(page.locator("#pane #subject")).to_have_text("For inbox 1")
    shoot(page, "http-all-mail")
    assert page.errors == []


def _js_number(value: float) -> str:
    """A JSON number as the page's script prints it (1000.0 -> "1000")."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _checks_message(server, smtp_port, box, links_base: str) -> int:
    html = (f"<html><body style='display:flex'><p>Hi <a href='{links_base}/ok'>here</a> and "
            f"<a href='{links_base}/missing'>gone</a></p></body></html>")
    send(smtp_port, box["address"], "Check me", text=f"This is the GTUBE, the\n{GTUBE}\n", html=html)
    return wait_count(server, box, 1)[0]["id"]


@pytest.mark.parametrize("check", ["html", "links", "spam"])
def test_check_tabs(page, server, smtp_port, links_base, conn, check):
    from playwright.sync_api import expect

    # the link check asks only the ports of checks.link_ports: 80, 443 and the test's own server's
    conn.execute("SELECT mailroom.set_setting('checks.link_ports', %s)", (f"80,443,{links_base.rsplit(':', 1)[1]}",))
    box = new_box(server)
    mid = _checks_message(server, smtp_port, box, links_base)
    api = server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages/{mid}/checks/{check}",
                         token=box["session_token"], timeout=30)
    assert api.status == 200, api.body  # every check runs on this server: never "off"
    doc = api.json()
    open_inbox(page, server.base, box)
    page.goto(f"/inbox/{box['address']}/messages/{mid}")
    name = {"html": "HTML check", "links": "Link check", "spam": "Spam score"}[check]
    page.get_by_role("tab", name=name).click()
    panel = page.locator(f"#panel-check-{check}")
    expect(panel.locator("table")).to_be_visible(timeout=30000)
    rows = panel.locator("tbody tr")
    if check == "html":
        expect(panel).to_contain_text(f"Score {_js_number(doc['score'])}/100")
        expect(rows.filter(has_text="display")).not_to_have_count(0)  # the flex the message uses
    elif check == "links":
        assert (doc["checked"], doc["skipped"]) == (2, 0), doc
        expect(panel).to_contain_text("2 checked, 0 skipped")
        expect(rows).to_have_count(2)
        ok = rows.filter(has_text=f"{links_base}/ok")
        expect(ok.locator("td")).to_have_text([f"{links_base}/ok", "link", "200", "0", "ok"])
        expect(ok.locator("td .ok")).to_have_count(1)
        gone = rows.filter(has_text=f"{links_base}/missing")
        expect(gone.locator("td")).to_have_text([f"{links_base}/missing", "link", "404", "0", "HTTP 404"])
        expect(gone.locator("td .bad")).to_have_count(1)
    else:
        assert doc["is_spam"] is True and doc["score"] >= 1000, doc  # GTUBE
        expect(panel.locator("p strong")).to_have_text(
            f"Score {_js_number(doc['score'])} (threshold {_js_number(doc['threshold'])}) ")
        expect(panel.locator("p .bad")).to_have_text("spam")  # "is spam"
        expect(rows.filter(has_text="GTUBE").locator("td").nth(1)).to_have_text(
            _js_number(next(r["score"] for r in doc["rules"] if r["name"] == "GTUBE")))
        expect(rows).to_have_count(len(doc["rules"]))
    shoot(page, f"http-check-{check}")
    assert page.errors == []


def test_release_from_the_page_queues_the_stored_bytes(page, server, smtp_port, conn, cli):
    from playwright.sync_api import expect

    key = json.loads(cli("apikey", "create", "browser-release", "--json").stdout)["api_key"]
    box = server.request("POST", "/api/v1/mailboxes", token=key).json()  # owner type api: may release
    to = new_box(server)["address"]
    conn.execute("SELECT mailroom.upsert_sender('browser-relay', 'robot@mailroom.test', '127.0.0.1', %s)", (smtp_port,))
    conn.execute("SELECT mailroom.set_setting('release.senders', 'browser-relay')")
    conn.execute("SELECT mailroom.set_setting('release.allowed_recipients', %s)", (to,))  # empty allows none
    try:
        send(smtp_port, box["address"], "Release me", text="Pay 12 EUR by Friday.")
        mid = wait_count(server, {"address": box["address"], "session_token": key}, 1)[0]["id"]
        stored = conn.execute("SELECT raw FROM mailroom.messages WHERE id = %s", (mid,)).fetchone()[0]
        open_inbox(page, server.base, {"address": box["address"], "session_token": key})
        page.goto(f"/inbox/{box['address']}/messages/{mid}")
        page.get_by_role("tab", name="Release").click()
        form = page.locator("#release-form")
        expect(form.locator("select[name=sender] option")).to_have_text(["browser-relay"])
        form.locator("input[name=to]").fill(to)
        form.get_by_role("button", name="Release").click()
        result = page.locator("#release-result")
        expect(result).to_have_text(re.compile(rf"^Queued as outbound message \d+ to {re.escape(to)} from browser-relay$"))
        expect(result).to_have_class("ok")
        shoot(page, "http-release")
        outbound_id = int(re.search(r"message (\d+) ", result.text_content()).group(1))
        status, to_addrs, raw = conn.execute(
            "SELECT status::text, to_addrs, raw_message FROM mailroom.outbound_messages WHERE id = %s",
            (outbound_id,)).fetchone()
        assert (status, to_addrs) == ("queued", [to])
        raw = bytes(raw)
        assert raw.startswith(b"Resent-"), raw[:200]
        assert b"\r\nResent-From: robot@mailroom.test\r\n" in raw and raw.endswith(bytes(stored))  # as received
        assert page.errors == []
    finally:
        conn.execute("SELECT mailroom.set_setting('release.senders', '')")
        conn.execute("SELECT mailroom.set_setting('release.allowed_recipients', '')")


def test_fault_injection_in_the_inbox_header(page, server, smtp_port):
    import smtplib

    from playwright.sync_api import expect

    box = new_box(server)
    open_inbox(page, server.base, box)
    expect(page.locator("#fault")).to_be_visible()
    page.locator("#fault summary").click()
    page.locator("#fault-form select[name=stage]").select_option("rcpt")
    page.locator("#fault-form input[name=reply]").fill("451 4.3.0 try later")
    page.get_by_role("button", name="Set fault").click()
    expect(page.locator("#fault-badge")).to_contain_text("451 4.3.0 try later")
    with pytest.raises(smtplib.SMTPRecipientsRefused):
        send(smtp_port, box["address"], "refused on purpose")
    page.reload()
    expect(page.locator("#fault-badge")).to_contain_text("rcpt")  # rendered by the server too
    page.locator("#fault summary").click()
    shoot(page, "http-fault")
    page.get_by_role("button", name="Clear").click()
    expect(page.locator("#fault-badge")).to_be_hidden()
    send(smtp_port, box["address"], "accepted again")
    wait_count(server, box, 1)


def test_no_serious_accessibility_violation_on_any_view(browser, server, smtp_port, cli):
    box = new_box(server)
    send(smtp_port, box["address"], "Accessible mail", text="hello", html="<p>hello <b>world</b></p>",
         attachments=[("pic.png", "image/png", png())])
    mid = wait_count(server, box, 1)[0]["id"]
    key = json.loads(cli("apikey", "create", "axe-team", "--json").stdout)["api_key"]
    owned = server.request("POST", "/api/v1/mailboxes", token=key).json()
    send(smtp_port, owned["address"], "In the owner's inbox", attachments=[("pic.png", "image/png", png())])
    found = {}
    for scheme in ("light", "dark"):  # every view in light; in dark the views whose colours differ most
        ctx = browser.new_context(viewport=WIDE, color_scheme=scheme, base_url=server.base)
        try:
            page = ctx.new_page()
            if scheme == "light":
                page.set_content("<html><body><input type=text><img src=x.png></body></html>")
                assert axe_violations(page), "axe found nothing on a page with an unlabelled input"  # the probe works
                page.goto("/")
                found[f"home {scheme}"] = axe_violations(page)
            open_inbox(page, server.base, box)
            page.locator("#messages li.msg").first.wait_for()
            page.locator("#messages li.msg a.open").first.click()
            page.locator("#pane #message").wait_for()
            found[f"inbox and split pane {scheme}"] = axe_violations(page)
            page.goto(f"/inbox/{box['address']}/messages/{mid}")
            page.get_by_role("tab", name="HTML source").click()
            found[f"message, source {scheme}"] = axe_violations(page)
            if scheme == "dark":
                continue
            page.get_by_role("tab", name="Attachments (1)").click()
            page.keyboard.press("?")
            found[f"message, attachments, shortcuts {scheme}"] = axe_violations(page)
            page.goto("/mail")
            found[f"key login {scheme}"] = axe_violations(page)
            page.get_by_label("API key").fill(key)
            page.get_by_role("button", name="Open all my mail").click()
            page.locator("#messages li.msg").first.wait_for()
            found[f"all mail {scheme}"] = axe_violations(page)
        finally:
            ctx.close()
    bad = {view: v for view, v in found.items() if v}
    assert not bad, json.dumps(bad, indent=1)
