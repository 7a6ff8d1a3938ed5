"""Regenerate the screenshots of docs/http.md (docs/img/http-*.png): `make screenshots` (issue 44, item 10).

It starts a throwaway PostgreSQL cluster (mailroom.testing, as the test suite does) with a migrated
database, `mailroom inbox serve` and `mailroom http serve` (the link check on, for a loopback server of
its own; the spam check when spamd is installed; release through an outbound sender pointing at the
inbound server), makes an inbox from the page, fills it with demo mail over real SMTP (an HTML
newsletter with a cid: logo and a non-ASCII subject, an invoice with attachments, account mail with a
link and a code, the GTUBE for the spam score) and drives Debian's chromium headless with Playwright
through the views the docs show, one PNG each. Everything it starts is stopped and removed at the end.

Not a test and not run by CI: it asserts only what it needs to reach the next view. It needs what the
browser tests need (chromium, the `dev` extra's playwright; spamd is optional: without it the spam
score image is left as it is). Run from a checkout: `make screenshots`, or
`.venv/bin/python scripts/screenshots.py [--out DIR] [NAME ...]`.
"""

from __future__ import annotations

import argparse
import email.policy
import email.utils
import json
import os
import shutil
import smtplib
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from contextlib import ExitStack
from email.message import EmailMessage
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "http"), str(ROOT / "tests" / "checks")]  # the browser tests' helpers

import psycopg  # noqa: E402
from browser_support import CHROMIUM, FLAGS, link_target, start_smtp  # noqa: E402
from http_support import HttpServer, start_http  # noqa: E402

from mailroom import testing  # noqa: E402

DOCS_IMG = ROOT / "docs" / "img"
WIDE = {"width": 1280, "height": 820}
PHONE = {"width": 375, "height": 740}
GTUBE = "XJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X"
NEWSLETTER = "Frühlings-Newsletter: 20 % auf alles bis Sonntag"
INVOICE = "Ihre Rechnung Nr. 2026-0412"
# every image docs/http.md shows, in the order they are taken
NAMES = ("http-new-inbox", "http-inbox", "http-shortcuts", "http-message", "http-source", "http-attachments",
         "http-check-html", "http-check-links", "http-check-spam", "http-fault", "http-phone-dark",
         "http-message-phone-dark", "http-all-mail", "http-release")


def log(line: str) -> None:
    print(f"screenshots: {line}", file=sys.stderr, flush=True)


def _png(width: int, height: int, pixel) -> bytes:
    """A PNG of width x height RGB pixels, pixel(x, y) -> (r, g, b) (no imaging library needed)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = bytearray()
    for y in range(height):
        rows.append(0)
        for x in range(width):
            rows += bytes(pixel(x, y))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(bytes(rows))) + chunk(b"IEND", b""))


def logo(width: int = 160, height: int = 48) -> bytes:
    """The newsletter's logo: a loaf's warm colours, a gradient with a light band."""
    def pixel(x: int, y: int) -> tuple[int, int, int]:
        if abs(y - height // 2) < 4:
            return (250, 236, 205)
        t = x / (width - 1)
        return (int(217 - 60 * t), int(130 - 50 * t), int(43 + 10 * t))
    return _png(width, height, pixel)


def chart(width: int = 240, height: int = 120) -> bytes:
    """The invoice's chart: five bars on white, a base line."""
    heights = (0.45, 0.7, 0.55, 0.9, 0.8)

    def pixel(x: int, y: int) -> tuple[int, int, int]:
        if y >= height - 8:
            return (90, 90, 90) if y == height - 8 else (255, 255, 255)
        slot, offset = divmod(x - 12, 44)
        if 0 <= slot < len(heights) and offset < 30 and y >= (height - 8) * (1 - heights[slot]):
            return (217, 130, 43) if slot % 2 else (122, 75, 42)
        return (255, 255, 255)
    return _png(width, height, pixel)


def newsletter(links: str) -> EmailMessage:
    """An HTML newsletter with its logo as a cid: image (multipart/related) and a non-ASCII subject."""
    msg = EmailMessage()
    msg["From"] = "Bäckerei Müller <news@baeckerei-mueller.example>"
    msg["Subject"] = NEWSLETTER
    msg.set_content("Frühling in der Backstube: 20 % auf alles bis Sonntag.\nIhr Gutscheincode: 48291\n"
                    f"Die Angebote: {links}/ok\n")
    msg.add_alternative(
        "<html><body style='margin:0;font-family:Georgia,serif;background:#f4efe6'>"
        "<table width='100%' cellpadding='0' cellspacing='0'><tr><td align='center'>"
        "<table style='width:100%;max-width:560px;background:#fff;margin:24px 0;border-radius:8px'>"
        "<tr><td style='padding:24px;text-align:center;background:#7a4b2a;border-radius:8px 8px 0 0'>"
        "<img src='cid:logo@baeckerei' width='160' height='48' alt='Bäckerei Müller'></td></tr>"
        "<tr><td style='padding:24px 32px'><h1 style='color:#7a4b2a;margin:0 0 12px'>Frühling in der Backstube</h1>"
        "<p style='font-size:16px;line-height:1.5'>Diese Woche: Rhabarberkuchen, Bärlauchbrot und "
        "Franzbrötchen, frisch aus dem Ofen. <b>20 % auf alles</b> bis Sonntag.</p>"
        f"<p style='text-align:center;margin:28px 0'><a href='{links}/ok' style='background:#d9822b;color:#fff;"
        "padding:12px 28px;border-radius:6px;text-decoration:none;font-weight:bold'>Zu den Angeboten</a></p>"
        "<p style='font-size:15px'>Ihr Gutscheincode: <b style='letter-spacing:2px'>48291</b></p>"
        f"<p style='font-size:12px;color:#888'>Ältere Ausgaben im <a href='{links}/archiv'>Archiv</a>.</p>"
        "</td></tr></table></td></tr></table></body></html>",
        subtype="html",
    )
    msg.get_payload()[1].add_related(logo(), maintype="image", subtype="png", cid="<logo@baeckerei>",
                                     filename="logo.png")
    return msg


def plain(subject: str, text: str, *, sender: str = "Example App <app@example.org>", html: str | None = None,
          attachments: tuple[tuple[str, str, bytes], ...] = ()) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = sender
    msg["Subject"] = subject
    msg.set_content(text)
    if html is not None:
        msg.add_alternative(html, subtype="html")
    for name, ctype, data in attachments:
        main, sub = ctype.split("/", 1)
        msg.add_attachment(data, maintype=main, subtype=sub, filename=name)
    return msg


def demo_mail(links: str) -> list[EmailMessage]:
    """The inbox's mail, oldest first (the list shows the newest on top)."""
    pdf = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
    return [
        plain("Spam test (GTUBE)", f"The GTUBE, for the spam score:\n{GTUBE}\n", sender="QA <qa@example.org>"),
        plain("Réinitialisation de votre mot de passe", "Bonjour,\nvotre lien : https://app.example.org/reset?t=Qm7\n",
              sender="Example App <noreply@example.org>"),
        plain("Your order #1042 has shipped", "Your parcel is on its way.\nTrack it: https://shop.example.com/t/1042\n",
              sender="Shop <orders@shop.example.com>"),
        plain(INVOICE, "Guten Tag,\nanbei Ihre Rechnung und die Übersicht des Quartals.\n",
              sender="Buchhaltung <rechnung@example.de>",
              attachments=(("Rechnung-2026-0412.pdf", "application/pdf", pdf), ("umsatz.png", "image/png", chart()),
                           ("positionen.csv", "text/csv", b"Position;Betrag\nBrot;3,20\nKuchen;12,50\n"))),
        plain("Activate your account", "Welcome!\nActivate: https://app.example.org/activate?t=Zx81-q\nCode 48213\n",
              html="<h2>Welcome aboard</h2><p><a href='https://app.example.org/activate?t=Zx81-q'>Activate</a>"
                   " your account, or enter the code <b>48213</b>.</p>"),
        newsletter(links),
    ]


def send(port: int, to: str, msg: EmailMessage) -> None:
    del msg["To"]
    msg["To"] = to
    if msg["Date"] is None:  # as a mail client writes them (spamd scores their absence)
        msg["Date"] = email.utils.formatdate()
        msg["Message-ID"] = email.utils.make_msgid(domain="demo.example.org")
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.ehlo("demo.example.org")
        smtp.sendmail("demo@example.org", [to], msg.as_bytes(policy=email.policy.SMTP))


def popen_for(url: str):
    """`mailroom …` as a child process, logged in as its command's test login (mailroom.testing)."""
    def popen(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        merged = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
        merged.update(PYTHONUNBUFFERED="1", MAILROOM_DATABASE_URL=url, **(env or {}))
        return subprocess.Popen([sys.executable, "-m", "mailroom", *args], env=testing.driver_env(merged, args),
                                **kwargs)
    return popen


def listed(server: HttpServer, address: str, credential: str, count: int) -> list[dict]:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        got = server.request("GET", f"/api/v1/mailboxes/{address}/messages", token=credential).json()
        if len(got) >= count:
            return got
        time.sleep(0.1)
    raise SystemExit(f"screenshots: {count} message(s) did not arrive in {address}")


class Shots:
    def __init__(self, out: Path, names: set[str]) -> None:
        self.out, self.names, self.written = out, names, []

    def __call__(self, page, name: str, *, full_page: bool = False) -> None:
        if name not in self.names:
            return
        page.wait_for_timeout(300)  # transitions and the live dot settle
        page.screenshot(path=str(self.out / f"{name}.png"), full_page=full_page)
        self.written.append(name)
        log(f"wrote {name}.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/screenshots.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"only these images (of {', '.join(NAMES)})")
    parser.add_argument("--out", type=Path, default=DOCS_IMG, help="where the PNGs go (default: docs/img)")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(NAMES)
    if unknown:
        parser.error(f"no such image: {', '.join(sorted(unknown))}")
    if not Path(CHROMIUM).exists():
        log("chromium is not installed (apt-get install chromium)")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if shutil.which("fc-list") and "emoji" not in subprocess.run(["fc-list"], capture_output=True, text=True).stdout.lower():
        log("no emoji font: the page's marks (attachments, unread) show as boxes (apt-get install fonts-noto-color-emoji)")
    spamd_bin = shutil.which("spamd") or ("/usr/sbin/spamd" if Path("/usr/sbin/spamd").exists() else None)
    shots = Shots(args.out, set(args.names or NAMES))
    with ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="mailroom-shots-"))
        stack.callback(shutil.rmtree, tmp, True)
        log("starting a throwaway cluster")
        cluster = testing.start_cluster(prefix="mailroom-shots-")
        stack.callback(testing.stop_cluster, cluster)
        url = testing.migrated_database(cluster, "screenshots")
        links = stack.enter_context(link_target())
        spamd = None
        if spamd_bin is not None:
            from checks_support import running_spamd
            spamd = stack.enter_context(running_spamd(tmp))
        else:
            log("spamd is not installed: http-check-spam.png is left as it is")
        smtp_proc, smtp_port = start_smtp(url, tmp / "smtp.log")
        stack.callback(smtp_proc.wait, 10)
        stack.callback(smtp_proc.terminate)
        flags = ("--link-check", "--link-check-allow", "127.0.0.1/32") + (("--spamd", spamd) if spamd else ())
        server = start_http(popen_for(url), tmp / "http.log", *flags)
        stack.callback(server.stop)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT mailroom.set_setting('http.create_limit', '1000000')")
            conn.execute("SELECT mailroom.set_setting('checks.link_ports', %s)", (f"80,443,{links.rsplit(':', 1)[1]}",))
            conn.execute("SELECT mailroom.upsert_sender('demo-relay', 'robot@mailroom.test', '127.0.0.1', %s)",
                         (smtp_port,))
            conn.execute("SELECT mailroom.set_setting('release.senders', 'demo-relay')")
            made = subprocess.run([sys.executable, "-m", "mailroom", "apikey", "create", "demo-team", "--json"],
                                  env=testing.driver_env({**os.environ, "MAILROOM_DATABASE_URL": url},
                                                         ("apikey", "create")),
                                  capture_output=True, text=True, check=True)
            key = json.loads(made.stdout)["api_key"]
            from playwright.sync_api import sync_playwright

            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
                try:
                    drive(browser, server, smtp_port, links, key, conn, shots, spam=spamd is not None)
                finally:
                    browser.close()
    missing = [n for n in shots.names if n not in shots.written]
    log(f"{len(shots.written)} image(s) in {args.out}" + (f"; not written: {', '.join(missing)}" if missing else ""))
    return 0


def drive(browser, server: HttpServer, smtp_port: int, links: str, key: str, conn: psycopg.Connection,
          shoot: Shots, *, spam: bool) -> None:
    from playwright.sync_api import expect

    context = browser.new_context(viewport=WIDE, base_url=server.base, locale="en-US", timezone_id="Europe/Berlin")
    context.set_default_timeout(15000)
    page = context.new_page()

    # a new inbox, made from the page: its token shown once
    page.goto("/")
    page.get_by_role("button", name="Create a temporary inbox").click()
    expect(page.locator("#session-token")).to_be_visible()
    expect(page.locator("#live.on")).to_be_visible()
    token = page.locator("#session-token").text_content()
    address = page.locator("#new-address").text_content()
    shoot(page, "http-new-inbox")

    mail = demo_mail(links)
    for msg in mail:
        send(smtp_port, address, msg)
    messages = {m["subject"]: m["id"] for m in listed(server, address, token, len(mail))}
    newsletter_id, invoice_id = messages[NEWSLETTER], messages[INVOICE]
    base = f"/inbox/{address}/messages"

    # the inbox, the newsletter open in the split pane; the shortcuts
    page.reload()
    rows = page.locator("#messages li.msg")
    expect(rows).to_have_count(len(mail))
    rows.filter(has_text=INVOICE).locator("a.open").click()  # read: the list shows read and unread
    rows.filter(has_text=NEWSLETTER).locator("a.open").click()
    expect(page.locator("#pane #subject")).to_have_text(NEWSLETTER)
    shoot(page, "http-inbox")
    page.keyboard.press("?")
    expect(page.locator("#help")).to_be_visible()
    shoot(page, "http-shortcuts")
    page.keyboard.press("Escape")

    # the newsletter on its own page: the HTML part with its cid: logo, its source, the checks
    page.goto(f"{base}/{newsletter_id}")
    page.frame_locator("#html-frame").locator("img").wait_for()
    expect(page.locator("#link")).to_have_text(f"{links}/ok")
    shoot(page, "http-message", full_page=True)
    page.get_by_role("tab", name="HTML source").click()
    expect(page.locator("#panel-source .hl")).to_contain_text("cid:logo@baeckerei")
    shoot(page, "http-source")
    for check, tab in (("html", "HTML check"), ("links", "Link check")):
        page.get_by_role("tab", name=tab).click()
        expect(page.locator(f"#panel-check-{check} table")).to_be_visible(timeout=30000)
        shoot(page, f"http-check-{check}")

    # the invoice's attachments, with a thumbnail for the PNG
    page.goto(f"{base}/{invoice_id}")
    page.get_by_role("tab", name="Attachments (3)").click()
    page.wait_for_function("() => { const i = document.querySelector('#attachments img');"
                           " return i && i.naturalWidth > 0; }")
    shoot(page, "http-attachments")

    if spam:
        page.goto(f"{base}/{messages['Spam test (GTUBE)']}")
        page.get_by_role("tab", name="Spam score").click()
        expect(page.locator("#panel-check-spam table")).to_be_visible(timeout=60000)
        shoot(page, "http-check-spam")

    # fault injection: RCPT answered 451 on purpose, then cleared
    page.goto(f"/inbox/{address}")
    page.locator("#fault summary").click()
    page.locator("#fault-form select[name=stage]").select_option("rcpt")
    page.locator("#fault-form input[name=reply]").fill("451 4.3.0 try later")
    page.get_by_role("button", name="Set fault").click()
    expect(page.locator("#fault-badge")).to_contain_text("451 4.3.0 try later")
    page.reload()
    page.locator("#fault summary").click()
    shoot(page, "http-fault")
    page.get_by_role("button", name="Clear").click()
    expect(page.locator("#fault-badge")).to_be_hidden()
    context.close()

    # a phone, dark
    dark = browser.new_context(viewport=PHONE, color_scheme="dark", base_url=server.base, locale="en-US",
                               timezone_id="Europe/Berlin")
    dark.set_default_timeout(15000)
    page = dark.new_page()
    page.goto(f"/inbox/{address}?token={token}")
    expect(page.locator("#messages li.msg")).to_have_count(len(mail))
    shoot(page, "http-phone-dark")
    page.locator("#messages li.msg", has_text=NEWSLETTER).locator("a.open").click()
    expect(page.locator("#subject")).to_have_text(NEWSLETTER)
    page.frame_locator("#html-frame").locator("img").wait_for()
    shoot(page, "http-message-phone-dark", full_page=True)
    dark.close()

    # an API key's owner: all the mail of its inboxes in one list, and a release from the page
    context = browser.new_context(viewport=WIDE, base_url=server.base, locale="en-US", timezone_id="Europe/Berlin")
    context.set_default_timeout(15000)
    page = context.new_page()
    boxes = [server.request("POST", "/api/v1/mailboxes", token=key).json()["address"] for _ in range(2)]
    send(smtp_port, boxes[0], plain("Quarterly report", "The figures of Q1 are attached.\n",
                                    sender="Finance <finance@example.org>",
                                    attachments=(("q1.png", "image/png", chart()),)))
    send(smtp_port, boxes[1], plain("Sign-up confirmation", "Confirm: https://app.example.org/c?t=Vb2\nCode 77120\n"))
    send(smtp_port, boxes[1], plain("Welcome to the beta", "You are in. Release notes inside.\n",
                                    sender="Product <beta@example.org>"))
    for box, count in ((boxes[0], 1), (boxes[1], 2)):
        listed(server, box, key, count)
    page.goto("/mail")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Open all my mail").click()
    rows = page.locator("#messages li.msg")
    expect(rows).to_have_count(3)
    rows.filter(has_text="Quarterly report").locator("a.open").click()
    expect(page.locator("#pane #subject")).to_have_text("Quarterly report")
    shoot(page, "http-all-mail")

    release_to = server.request("POST", "/api/v1/mailboxes?ttl_minutes=30").json()["address"]
    conn.execute("SELECT mailroom.set_setting('release.allowed_recipients', %s)", (release_to,))
    report = listed(server, boxes[0], key, 1)[0]["id"]
    page.goto(f"/inbox/{boxes[0]}/messages/{report}")
    page.get_by_role("tab", name="Release").click()
    form = page.locator("#release-form")
    expect(form.locator("select[name=sender] option")).to_have_text(["demo-relay"])
    form.locator("input[name=to]").fill(release_to)
    form.get_by_role("button", name="Release").click()
    expect(page.locator("#release-result")).to_have_class("ok")
    shoot(page, "http-release")
    context.close()


if __name__ == "__main__":
    sys.exit(main())
