"""The XSS corpus, a test of its own (issue 35, item 6): mail built to run script in the page (scripts,
event handlers, SVG, iframes, `javascript:`/`data:` links, forms, meta refresh, CSS imports, in the
HTML part and in every field the page shows: subject, From, a header, the text part, an attachment's
name, an SVG attachment) is delivered over real SMTP and shown in every view of Debian's chromium:
the list (rows from the server and rows arriving live), the split pane, each tab of the message,
the all-mail list. Nothing runs: the `window.__xss` probe stays unset (in the page and in the
frame), no dialog opens, the page never navigates, and no request leaves for another host.
"""

from __future__ import annotations

import email.policy
import json
import os
import smtplib
from email.message import EmailMessage

import pytest
from browser_support import CHROMIUM, FLAGS, png, start_smtp

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium is not installed (apt-get install chromium)")

# sets the page's probe if it could reach it, and marks the frame's own text when it runs there
PROBE = "window.__xss=1;try{top.__xss=1}catch(e){};try{document.getElementById('marker').textContent='RAN'}catch(e){}"
HTML_CORPUS = f"""<html><head>
<meta http-equiv="refresh" content="0;url=javascript:{PROBE}">
<meta http-equiv="refresh" content="1;url=https://evil.example/refresh">
<base href="javascript:{PROBE}//">
<link rel="stylesheet" href="https://evil.example/linked.css">
<style>@import url("https://evil.example/imported.css"); body{{background:url("javascript:{PROBE}")}}</style>
</head><body onload="{PROBE}">
<p id="marker">corpus</p>
<script>{PROBE};alert("script")</script>
<img src="x" onerror="{PROBE};alert('img')">
<svg onload="{PROBE}"><script>{PROBE}</script><animate onbegin="{PROBE}" attributeName="x" dur="1s"/></svg>
<iframe src="javascript:{PROBE}"></iframe>
<iframe srcdoc="&lt;script&gt;{PROBE}&lt;/script&gt;"></iframe>
<object data="javascript:{PROBE}"></object><embed src="javascript:{PROBE}">
<a id="jslink" href="javascript:{PROBE};alert('link')">a javascript: link</a>
<a id="datalink" href="data:text/html,&lt;script&gt;alert('data')&lt;/script&gt;">a data: link</a>
<form action="javascript:{PROBE}"><button id="formbutton" type="submit">a form</button></form>
<details open ontoggle="{PROBE}"><summary>details</summary></details>
<math><mtext><table><mglyph><style><img src=x onerror="{PROBE}"></style></mglyph></table></mtext></math>
<input autofocus onfocus="{PROBE}">
</body></html>"""
FIELD = f'"><img src=x onerror="{PROBE}"></script><script>{PROBE}</script><svg onload="{PROBE}">'
SVG = f'<svg xmlns="http://www.w3.org/2000/svg" onload="{PROBE}"><script>{PROBE}</script></svg>'.encode()


def corpus_mail(to: str, n: int) -> bytes:
    msg = EmailMessage(policy=email.policy.SMTP)
    msg["From"] = f'"{FIELD}" <evil@example.org>'
    msg["To"] = to
    msg["Subject"] = f"corpus {n} {FIELD}"
    msg["X-Evil"] = FIELD
    msg.set_content(f"text part {FIELD}\njavascript:{PROBE}\nhttps://example.org/ok\n")
    msg.add_alternative(HTML_CORPUS, subtype="html")
    msg.add_attachment(png(), maintype="image", subtype="png", filename=f"{FIELD}.png")
    msg.add_attachment(SVG, maintype="image", subtype="svg+xml", filename="drawing.svg")
    return msg.as_bytes()


def send_raw(port: int, to: str, raw: bytes) -> None:
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.sendmail("evil@example.org", [to], raw)


@pytest.fixture(scope="module")
def smtp_port(db_url, tmp_path_factory):
    proc, port = start_smtp(db_url, tmp_path_factory.mktemp("smtp") / "smtp.log")
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def test_the_xss_corpus_runs_nowhere(server, smtp_port, cli):
    from playwright.sync_api import expect, sync_playwright

    key = json.loads(cli("apikey", "create", "xss-team", "--json").stdout)["api_key"]
    box = server.request("POST", "/api/v1/mailboxes", token=key).json()
    address = box["address"]
    send_raw(smtp_port, address, corpus_mail(address, 1))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        ctx = browser.new_context(viewport={"width": 1280, "height": 820}, base_url=server.base)
        ctx.set_default_timeout(5000)
        page = ctx.new_page()
        dialogs, navigations, foreign = [], [], []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("framenavigated", lambda f: navigations.append(f.url) if f == page.main_frame else None)

        def local(url: str) -> bool:
            return url.startswith((server.base, "data:", "about:"))

        # a request for another host (or a javascript: URL) is refused by the frame's CSP before it leaves:
        # it may be reported, but only as blocked; one that went out, or failed otherwise, is a defect
        page.on("requestfinished", lambda r: foreign.append(r.url) if not local(r.url) else None)
        page.on("requestfailed", lambda r: foreign.append(f"{r.url} {r.failure}")
                if not local(r.url) and r.failure != "csp" else None)

        def nothing_ran(view: str, expected_url: str) -> None:
            assert page.evaluate("window.__xss") is None, view
            # nothing of a message became markup (the page's CSP would stop a script, but escaping comes first):
            # no element the corpus carries exists in the page outside the frame but the thumbnails
            injected = page.evaluate("""() => Array.from(document.querySelectorAll(
                'main img, main svg, main script, main iframe, main object, main embed, main math, main meta, main base, '
                + 'main link, main style, main form:not(#tag-form):not(#release-form):not(#fault-form):not(#search-form), '
                + 'main details:not(#fault):not(#inboxes)'))
                .filter(e => !(e.tagName === 'IMG' && e.closest('#attachments')) && !e.classList.contains('body'))
                .map(e => e.outerHTML.slice(0, 80))""")
            assert injected == [], (view, injected)
            frames = page.locator("iframe.body")
            if frames.count():  # the sandboxed frame: a script that ran there would have marked its text
                expect(frames.first.content_frame.locator("#marker")).to_have_text("corpus")
            assert dialogs == [], (view, dialogs)
            assert foreign == [], (view, foreign)
            assert page.url == expected_url, (view, page.url)

        page.goto("/mail")
        page.get_by_label("API key").fill(key)
        page.get_by_role("button", name="Open all my mail").click()
        expect(page.locator("#messages li.msg")).to_have_count(1)  # rows built by the script
        nothing_ran("all mail", f"{server.base}/mail")
        inbox_url = f"{server.base}/inbox/{address.replace('@', '%40')}"
        page.goto(inbox_url)
        rows = page.locator("#messages li.msg")
        expect(rows).to_have_count(1)  # a row rendered by the server
        expect(page.locator("#live.on")).to_be_visible()
        send_raw(smtp_port, address, corpus_mail(address, 2))
        expect(rows).to_have_count(2)  # a row built live
        for n in range(2):  # shown as text, in the row the server rendered and in the one built live
            expect(rows.nth(n).locator(".subject")).to_contain_text(f"corpus {2 - n} \"><img src=x")
            expect(rows.nth(n).locator(".from")).to_contain_text("</script><script>")
        nothing_ran("inbox list", inbox_url)
        for n in range(2):
            rows.nth(n).locator("a.open").click()
            pane = page.locator("#pane #message")
            expect(pane.locator("#subject")).to_contain_text(f"corpus {2 - n}")
            expect(page.frame_locator("#pane #html-frame").locator("#marker")).to_have_text("corpus")
            for tab in ("HTML source", "Text", "Headers", "Raw", "Attachments (2)"):
                pane.get_by_role("tab", name=tab).click()
            expect(pane.locator("#raw")).to_contain_text("X-Evil")
            assert pane.locator("#attachments img").count() == 1  # the PNG; never the SVG inline
            nothing_ran(f"split pane {n}", inbox_url)
        mid = rows.first.get_attribute("data-id")
        message_url = f"{inbox_url}/messages/{mid}"
        page.goto(message_url)
        frame = page.frame_locator("#html-frame")
        expect(frame.locator("#marker")).to_have_text("corpus")
        for link in ("#jslink", "#datalink", "#formbutton"):  # a person clicks what the mail offers
            frame.locator(link).click(no_wait_after=True)
        page.get_by_role("button", name="Show images").click()
        expect(page.frame_locator("#html-frame").locator("#marker")).to_have_text("corpus")
        for tab in ("HTML source", "Text", "Headers", "Raw", "Attachments (2)", "HTML check", "Link check", "Spam score"):
            page.get_by_role("tab", name=tab).click()
        page.wait_for_timeout(1200)  # the refresh of one second would have fired
        nothing_ran("message page", message_url)
        # popups the sandbox allows (links open outside the frame) never run the corpus either
        for other in ctx.pages[1:]:
            assert other.url in ("about:blank", "") or other.url.startswith("data:"), other.url
        ctx.close()
        browser.close()
