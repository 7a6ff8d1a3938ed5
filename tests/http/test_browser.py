"""The inbox page in a real browser: Debian's chromium, headless, driven by Playwright.

A person opens the inbox page with its token, a message is sent over SMTP to `mailroom inbox
serve`, and it appears in the list without a reload (within a generous 5 s); they open it, see
the HTML part rendered with its script blocked, and copy the extracted link. Screenshots go to
$MAILROOM_SCREENSHOTS when set (docs/http.md's pictures are made that way).
"""

from __future__ import annotations

import os
import shutil
import smtplib
import subprocess
import sys
import time
from email.message import EmailMessage
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium is not installed (apt-get install chromium)")


@pytest.fixture
def smtp_port(db_url, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "inboxes"))
    from http_support import wait_for_log

    from mailroom import testing

    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env.update(PYTHONUNBUFFERED="1", MAILROOM_DATABASE_URL=testing.as_login(db_url, "mr_inbound"))
    log_path = tmp_path / "smtp.log"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "mailroom", "inbox", "serve", "--port", "0"], env=env,
                                stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        yield int(wait_for_log(log_path, r"listening on 127\.0\.0\.1:(\d+)", proc).group(1))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _activation_mail(address: str) -> bytes:
    msg = EmailMessage()
    msg["From"] = "Example App <app@example.org>"
    msg["To"] = address
    msg["Subject"] = "Activate your account"
    msg.set_content("Welcome!\nActivate your account: https://app.example.org/activate?t=Zx81-q\nYour code: 48213\n")
    msg.add_alternative(
        "<html><body><h1 id='greeting'>Welcome to Example</h1>"
        "<p><a href='https://app.example.org/activate?t=Zx81-q'>Activate your account</a></p>"
        "<p>Your code: <b>48213</b></p><p id='victim'>script did not run</p>"
        "<img src='https://tracker.example/pixel.gif' alt='remote image'>"
        "<script>document.getElementById('victim').textContent = 'SCRIPT RAN';</script></body></html>",
        subtype="html",
    )
    return msg.as_bytes()


def test_inbox_page_live_arrival_safe_html_and_copy(server, smtp_port, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    started = time.monotonic()
    box = server.request("POST", "/api/v1/mailboxes?ttl_minutes=30").json()
    shots = Path(os.environ.get("MAILROOM_SCREENSHOTS") or tmp_path)
    with sync_playwright() as p:
        # a fresh --user-data-dir: Playwright's persistent context takes it as a parameter
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=FLAGS, headless=True,
            viewport={"width": 1100, "height": 760},
        )
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.base)
        page = context.pages[0] if context.pages else context.new_page()
        page.goto(f"{server.base}/inbox/{box['address']}?token={box['session_token']}")
        assert box["session_token"] not in page.url  # the token went into the cookie
        expect(page.locator("#live.on")).to_be_visible(timeout=5000)  # the event stream is open
        expect(page.locator(".empty")).to_be_visible()

        with smtplib.SMTP("127.0.0.1", smtp_port, timeout=10) as smtp:
            smtp.sendmail("app@example.org", [box["address"]], _activation_mail(box["address"]))
        row = page.locator("#messages tr", has_text="Activate your account")
        expect(row).to_be_visible(timeout=5000)  # arrived live, no reload
        page.screenshot(path=str(shots / "http-inbox.png"))

        row.locator("a").click()
        expect(page.locator("#subject")).to_have_text("Activate your account")
        frame = page.frame_locator("#html-frame")
        expect(frame.locator("#greeting")).to_have_text("Welcome to Example", timeout=5000)
        expect(frame.locator("#victim")).to_have_text("script did not run")  # the script was blocked
        expect(page.locator("#link")).to_have_text("https://app.example.org/activate?t=Zx81-q")
        expect(page.locator("#code")).to_have_text("48213")
        page.locator("#copy-link").click()
        expect(page.locator("#copy-link")).to_have_text("Copied")
        assert page.evaluate("navigator.clipboard.readText()") == "https://app.example.org/activate?t=Zx81-q"
        page.screenshot(path=str(shots / "http-message.png"), full_page=True)
        context.close()
    print(f"browser test took {time.monotonic() - started:.1f}s")
