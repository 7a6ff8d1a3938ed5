"""Paging on the page in a real browser (issue 44 item 4): an inbox of 200 messages pages back to its
first (oldest) message through "Older messages" (?before_id=, one SQL call a page), its search results
page the same way, and /mail has a search box. axe-core stays clean on each. Debian's chromium, headless,
driven by Playwright (browser_support), against a real `mailroom http serve`."""
from __future__ import annotations

import json
import os

import psycopg
import pytest
from browser_support import CHROMIUM, FLAGS, axe_violations, phone_fits

from mailroom.testing import as_login

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    ctx = browser.new_context(viewport={"width": 1280, "height": 820}, base_url=server.base)
    ctx.set_default_timeout(10000)
    p = ctx.new_page()
    p.errors = []
    p.on("pageerror", lambda exc: p.errors.append(str(exc)))
    yield p
    ctx.close()


def _fill(db_url: str, address: str, n: int) -> None:
    """n messages, "message 001" the oldest, in one statement as the inbound role."""
    with psycopg.connect(as_login(db_url, "mr_inbound"), autocommit=True) as c:
        c.execute(
            "SELECT count(mailroom.deliver_message(%s, convert_to('Subject: x' || i, 'UTF8'), 'app@example.org',"
            " jsonb_build_object('subject', 'message ' || lpad(i::text, 3, '0'), 'text_body', 'hello')))"
            " FROM generate_series(1, %s) AS i",
            (address, n),
        )


def _subjects(page) -> list[str]:
    return page.locator("ul.messages li.msg .subject").all_inner_texts()


def test_a_200_message_inbox_pages_to_its_oldest_message_and_its_search_pages_too(page, server, db_url, cli):
    from playwright.sync_api import expect

    key = json.loads(cli("apikey", "create", "paging-team", "--json").stdout)["api_key"]
    box = server.request("POST", "/api/v1/mailboxes?plan=pro", token=key).json()  # 1,000 places
    _fill(db_url, box["address"], 200)
    page.goto(f"/inbox/{box['address']}?token={key}")
    expect(page.locator("#messages li.msg")).to_have_count(100)
    assert _subjects(page)[0] == "message 200"
    assert page.locator("#newest").count() == 0
    assert axe_violations(page) == []
    page.locator("#older").click()
    expect(page.locator("#messages li.msg")).to_have_count(100)
    subjects = _subjects(page)
    assert subjects[0] == "message 100" and subjects[-1] == "message 001"  # the first message, at the end
    assert page.locator("#older").count() == 0  # nothing older: no link to an empty page
    assert "before_id=" in page.url
    assert axe_violations(page) == []
    page.locator("#newest").click()
    expect(page.locator("#messages li.msg").first).to_contain_text("message 200")

    # search results page the same way: best first (equal here), then newest by id
    page.locator("#search").fill("message")
    page.locator("#search-form button[type=submit]").click()
    expect(page.locator("#results li.msg")).to_have_count(100)
    expect(page.locator("#matches")).to_contain_text("100+ matching")
    page.locator("#older").click()
    expect(page.locator("#results li.msg")).to_have_count(100)
    assert _subjects(page)[-1] == "message 001"
    assert page.locator("#older").count() == 0
    assert axe_violations(page) == []
    page.set_viewport_size({"width": 375, "height": 740})
    phone_fits(page)  # the pager fits a phone
    assert page.errors == []


def test_all_mail_has_a_search_box(page, server, db_url, cli):
    from playwright.sync_api import expect

    key = json.loads(cli("apikey", "create", "paging-mail", "--json").stdout)["api_key"]
    boxes = [server.request("POST", "/api/v1/mailboxes", token=key).json() for _ in range(2)]
    for b in boxes:
        _fill(db_url, b["address"], 3)
    page.goto("/mail")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Open all my mail").click()
    expect(page.locator("#messages li.msg")).to_have_count(6)
    page.locator("#search").fill("002")
    page.locator("#search-form button[type=submit]").click()
    rows = page.locator("#messages li.msg")
    expect(rows).to_have_count(2)  # "message 002" of each inbox, newest first
    expect(rows.first.locator(".mailbox-of")).to_have_text(boxes[1]["address"])
    expect(page.locator("#matches")).to_contain_text("002")
    assert axe_violations(page) == []
    page.set_viewport_size({"width": 375, "height": 740})
    phone_fits(page)  # the search box fits a phone
    assert page.errors == []
