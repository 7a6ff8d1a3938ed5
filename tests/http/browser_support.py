"""Helpers of the browser tests (tests/http/test_browser*.py): Debian's chromium driven by Playwright
(sync API, headless, never `playwright install`), a real `mailroom inbox serve` for SMTP delivery,
mail builders, axe-core, a loopback HTTP server for the link check, and screenshots written to
docs/img/ when MAILROOM_SCREENSHOTS=1. The real spamd is tests/checks' (checks_support.running_spamd)."""

from __future__ import annotations

import email.policy
import os
import shutil
import smtplib
import struct
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "checks"))  # checks_support: the real spamd

from checks_support import running_spamd  # noqa: E402,F401 - re-exported for the browser test

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def png(width: int = 24, height: int = 16) -> bytes:
    """A small red PNG: the thumbnail of an attachment."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xd0\x20\x20" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def start_smtp(db_url: str, log_path: Path) -> tuple[subprocess.Popen, int]:
    from http_support import wait_for_log

    from mailroom import testing

    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env.update(PYTHONUNBUFFERED="1", MAILROOM_DATABASE_URL=testing.as_login(db_url, "mr_inbound"))
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "mailroom", "inbox", "serve", "--port", "0"], env=env,
                                stdout=subprocess.DEVNULL, stderr=log_file)
    return proc, int(wait_for_log(log_path, r"listening on 127\.0\.0\.1:(\d+)", proc).group(1))


def send(port: int, to: str, subject: str, *, text: str = "Hello", html: str | None = None,
         attachments: list[tuple[str, str, bytes]] = (), sender: str = "Example App <app@example.org>") -> None:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = to
    msg["Subject"] = subject
    msg.set_content(text)
    if html is not None:
        msg.add_alternative(html, subtype="html")
    for name, ctype, data in attachments:
        main, sub = ctype.split("/", 1)
        msg.add_attachment(data, maintype=main, subtype=sub, filename=name)
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        smtp.sendmail("app@example.org", [to], msg.as_bytes(policy=email.policy.SMTP))


def shoot(page, name: str, full_page: bool = False) -> None:
    """docs/img/<name>.png when MAILROOM_SCREENSHOTS=1 (docs/http.md shows them)."""
    if os.environ.get("MAILROOM_SCREENSHOTS") == "1":
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS_IMG / f"{name}.png"), full_page=full_page)


def axe_violations(page) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now (empty: none)."""
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    found = []
    for v in results.response["violations"]:
        if v.get("impact") in ("serious", "critical"):
            targets = [n.get("target") for n in v.get("nodes", [])][:3]
            found.append(f"{v['id']} ({v['impact']}): {v.get('help')} at {targets}")
    return found


def open_inbox(page, base: str, box: dict) -> None:
    page.goto(f"{base}/inbox/{box['address']}?token={box['session_token']}")
    assert box["session_token"] not in page.url


OVERFLOW = """() => {
  const w = document.documentElement.clientWidth, out = [];
  document.querySelectorAll("body *").forEach(e => {
    const r = e.getBoundingClientRect();
    if (r.right > w + 0.5 && r.width > 0)
      out.push(e.tagName + (e.id ? "#" + e.id : "") + "." + e.className + " " + Math.round(r.right));
  });
  return [document.documentElement.scrollWidth, out.slice(0, 8)];
}"""


def phone_fits(page, width: int = 375) -> None:
    """No horizontal overflow at phone width: document.scrollWidth <= width (else the elements past it)."""
    scroll, past = page.evaluate(OVERFLOW)
    assert scroll <= width, f"scrollWidth {scroll}: {past}"


class _LinkTarget(BaseHTTPRequestHandler):
    """What the link check asks in the browser test: /ok answers 200, every other path 404."""

    def _answer(self) -> None:
        self.send_response(200 if self.path.split("?", 1)[0] == "/ok" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _answer

    def log_message(self, *args) -> None:
        pass


@contextmanager
def link_target() -> Iterator[str]:
    """A loopback HTTP server on a free 127.0.0.1 port: its base URL (http://127.0.0.1:PORT)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _LinkTarget)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
