"""The page in a real browser, issue 44: inline `cid:` images in the message's frame (item 3) and the
page's layout fixes (item 10). Debian's chromium, headless, driven by Playwright (browser_support, as
tests/http/test_browser.py), against a real `mailroom http serve` and real SMTP delivery to
`mailroom inbox serve`."""
from __future__ import annotations

import email.policy
import json
import os
import random
import re
import smtplib
import struct
import time
import zlib
from email.message import EmailMessage

import pytest
from browser_support import CHROMIUM, FLAGS, axe_violations, link_target, open_inbox, phone_fits, png, send, start_smtp

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium is not installed (apt-get install chromium)")

WIDE = {"width": 1280, "height": 820}
PHONE = {"width": 375, "height": 740}


@pytest.fixture(scope="module")
def links_base() -> str:
    """The loopback HTTP server the link check asks: /ok answers 200, anything else 404."""
    with link_target() as base:
        yield base


@pytest.fixture(scope="module")
def server_flags() -> tuple[str, ...]:
    """This module's server runs the link check (loopback allowed: the test's own server)."""
    return ("--link-check", "--link-check-allow", "127.0.0.1/32")


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
    ctx.set_default_timeout(10000)
    yield ctx
    ctx.close()


@pytest.fixture
def page(context):
    p = context.new_page()
    p.errors = []
    p.on("pageerror", lambda exc: p.errors.append(str(exc)))
    return p


def wait_count(server, box, n, timeout=20.0, token=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages",
                             token=token or box["session_token"]).json()
        if len(got) >= n:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{n} message(s) not delivered")


def noise_png(width: int, height: int) -> bytes:
    """A valid PNG of random pixels stored uncompressed: larger than width*height*3 bytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rng = random.Random(44)
    rows = b"".join(b"\x00" + rng.randbytes(width * 3) for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 0)) + chunk(b"IEND", b""))


def send_related(port: int, to: str, subject: str, html: str, images: list[tuple[str, bytes]]) -> None:
    """An HTML newsletter as mail clients send one: multipart/alternative, the HTML part in a
    multipart/related with its images, each with a Content-ID."""
    msg = EmailMessage()
    msg["From"] = "Newsletter <news@example.org>"
    msg["To"] = to
    msg["Subject"] = subject
    msg.set_content("The text part")
    msg.add_alternative(html, subtype="html")
    html_part = msg.get_payload()[1]
    for cid, data in images:
        html_part.add_related(data, "image", "png", cid=f"<{cid}>", disposition="inline")
    with smtplib.SMTP("127.0.0.1", port, timeout=30) as smtp:
        smtp.sendmail("news@example.org", [to], msg.as_bytes(policy=email.policy.SMTP))


def natural_widths(page, ids: list[str], settle: str | None = None, timeout: float = 15.0) -> dict[str, int]:
    """naturalWidth of the frame's images by id, once every one has finished loading (or failed);
    `settle`: an id to wait for until it has a width."""
    frame = page.frame_locator("#html-frame")
    deadline = time.monotonic() + timeout
    got: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            got = {i: frame.locator(f"#{i}").evaluate("img => img.complete ? img.naturalWidth : -1", timeout=2000)
                   for i in ids}
        except Exception:  # noqa: BLE001 - the frame is (re)loading
            got = {}
        if got and all(v >= 0 for v in got.values()) and (settle is None or got[settle] > 0):
            return got
        time.sleep(0.1)
    return got


def test_inline_cid_images_render_in_the_frame_missing_and_too_large_stay_unrendered(page, server, smtp_port, cli):
    """Issue 44 item 3: a newsletter's cid: images show from the message's own parts; a cid whose part is
    missing or over 2 MiB stays unrendered, without an error; remote images stay blocked until "Show images"."""
    key = json.loads(cli("apikey", "create", "inline-team", "--json").stdout)["api_key"]
    box = server.request("POST", "/api/v1/mailboxes?plan=pro", token=key).json()  # 10 MiB: room for the large part
    big = noise_png(1024, 700)
    assert len(big) > 2 * 1024 * 1024
    html = ("<html><body><h1>Our news</h1>"
            "<img id='logo' alt='logo' src='cid:logo@news.example.org'>"
            "<img id='gone' alt='missing' src=\"cid:missing@news.example.org\">"
            "<img id='big' alt='too large' src='cid:big@news.example.org'>"
            "<img id='remote' alt='remote' src='http://127.0.0.1:9/pixel.png'>"
            "<div id='bg' style='width:10px;height:10px;background:url(cid:logo@news.example.org)'></div>"
            "</body></html>")
    send_related(smtp_port, box["address"], "Newsletter", html, [("logo@news.example.org", png(24, 16)),
                                                                 ("big@news.example.org", big)])
    mid = wait_count(server, box, 1, token=key)[0]["id"]
    frame_html = server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages/{mid}/html", token=key)
    assert frame_html.status == 200
    body = frame_html.body.decode()
    assert body.count("data:image/png;base64,") == 2  # the logo, twice (the img and the CSS url())
    assert "cid:missing@news.example.org" in body and "cid:big@news.example.org" in body  # left as they are
    assert "cid:logo@" not in body

    open_inbox(page, server.base, {"address": box["address"], "session_token": key})
    page.goto(f"/inbox/{box['address']}/messages/{mid}")
    widths = natural_widths(page, ["logo", "gone", "big", "remote"], settle="logo")
    assert widths == {"logo": 24, "gone": 0, "big": 0, "remote": 0}, widths
    page.get_by_role("button", name="Show images").click()
    page.wait_for_function("() => document.querySelector('#html-frame').src.endsWith('?images=1')")
    widths = natural_widths(page, ["logo", "gone", "big"], settle="logo")
    assert widths == {"logo": 24, "gone": 0, "big": 0}, widths  # still inline with remote images allowed
    assert page.errors == []


def new_box(server) -> dict:
    return server.request("POST", "/api/v1/mailboxes?ttl_minutes=30").json()


def test_list_rows_are_compact_and_the_list_comes_first_at_phone_width(browser, server, smtp_port):
    """Issue 44 item 10: a row was about 76 px tall (7 on a laptop's screen); at phone width the list
    started halfway down the screen, under the inbox's controls."""
    box = new_box(server)
    for n in range(4):
        send(smtp_port, box["address"], f"Your order {n} has shipped", text=f"Order {n} left our warehouse today.")
    wait_count(server, box, 4)
    found = {}
    for name, viewport in (("wide", WIDE), ("phone", PHONE)):
        ctx = browser.new_context(viewport=viewport, base_url=server.base)
        try:
            page = ctx.new_page()
            open_inbox(page, server.base, box)
            rows = page.locator("#messages li.msg")
            rows.nth(3).wait_for()
            heights = [rows.nth(i).bounding_box()["height"] for i in range(4)]
            assert max(heights) <= 56, (name, heights)  # two lines: sender and time; subject (and snippet)
            if name == "phone":
                first = rows.first.bounding_box()
                assert first["y"] <= viewport["height"] / 3, first  # the list first (it began halfway down)
                assert page.locator("#split").bounding_box()["y"] < page.locator("#inbox").bounding_box()["y"]
                phone_fits(page)
            else:
                assert rows.first.locator(".snippet").is_visible()  # beside the subject
            found[name] = axe_violations(page)
        finally:
            ctx.close()
    assert not any(found.values()), json.dumps(found, indent=1)


def contrast(page, selector: str) -> float:
    """WCAG contrast ratio of an element's text against the first opaque background under it."""
    return page.evaluate("""sel => {
      const rgb = s => s.match(/[\\d.]+/g).map(Number);
      const lin = x => { x /= 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; };
      const lum = c => { const v = c.slice(0, 3).map(lin); return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
      let e = document.querySelector(sel); const fg = rgb(getComputedStyle(e).color);
      let bg = null;
      for (; e; e = e.parentElement) {
        const c = rgb(getComputedStyle(e).backgroundColor);
        if (c.length < 4 || c[3] > 0) { bg = c; break; }
      }
      const [a, b] = [lum(fg), lum(bg || [255, 255, 255])].sort((x, y) => y - x);
      return (a + 0.05) / (b + 0.05);
    }""", selector)


def test_shortcuts_key_is_readable_and_every_link_check_column_has_a_heading(page, server, smtp_port, links_base, conn):
    """Issue 44 item 10: the Shortcuts button's `?` was white on near-white in light mode; the link
    check's error column had no heading."""
    from playwright.sync_api import expect

    conn.execute("SELECT mailroom.set_setting('checks.link_ports', %s)", (f"80,443,{links_base.rsplit(':', 1)[1]}",))
    box = new_box(server)
    send(smtp_port, box["address"], "Links", text="links",
         html=f"<p><a href='{links_base}/ok'>here</a> and <a href='{links_base}/missing'>gone</a></p>")
    mid = wait_count(server, box, 1)[0]["id"]
    open_inbox(page, server.base, box)
    assert contrast(page, "#show-help kbd") >= 4.5
    assert contrast(page, "#show-help") >= 4.5
    page.goto(f"/inbox/{box['address']}/messages/{mid}")
    page.get_by_role("tab", name="Link check").click()
    panel = page.locator("#panel-check-links")
    expect(panel.locator("tbody tr")).to_have_count(2, timeout=30000)
    headings = panel.locator("thead th").all_text_contents()
    assert len(headings) == 5 and all(h.strip() for h in headings), headings
    expect(panel.locator("thead th").nth(4)).to_have_text("Result")
    assert re.search(r"HTTP 404", panel.locator("tbody").text_content())
    frame = page.locator("#html-frame")
    page.get_by_role("tab", name="HTML", exact=True).click()
    assert frame.bounding_box()["height"] > 460  # a screenful, not a fixed 460 px
    assert axe_violations(page) == []
    assert page.errors == []
