"""Progress of long work (issue 23, item 6): one line redrawn on a terminal, nothing in a log or a pipe."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time

from mailroom import testing
from mailroom.core.progress import Progress


def test_progress_draws_on_a_terminal_only():
    quiet = io.StringIO()
    with Progress("purging", total=10, stream=quiet) as progress:  # a StringIO is not a terminal
        progress.update(5)
    assert quiet.getvalue() == ""
    shown = io.StringIO()
    with Progress("purging", total=10, stream=shown, force=True) as progress:
        progress.update(5)
        time.sleep(0.15)
        progress.update(10)
    text = shown.getvalue()
    assert "\rpurging: 0/10 (0%), 0s" in text and "\rpurging: 10/10 (100%)" in text
    assert text.endswith("\r"), repr(text)  # the line is cleared at the end: the summary follows alone


def test_purge_shows_progress_on_a_terminal(conn, db_url):
    conn.execute("SELECT mailroom.upsert_sender('p', 'robot@mailroom.test', '127.0.0.1', 2525)")
    conn.execute("SELECT count(mailroom.enqueue_message('p', ARRAY['r' || g || '@example.com'], 's', 't'))"
                 " FROM generate_series(1, 50) AS g")
    conn.execute("UPDATE mailroom.outbound_messages SET status = 'sent', sent_at = now() - interval '1 day'")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env["MAILROOM_DATABASE_URL"] = testing.as_login(db_url, "mr_admin")
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "mailroom", "outbound", "purge", "--sent-before", "1h", "--batch",
                             "10", "--yes"], env=env, stdout=subprocess.PIPE, stderr=follower, stdin=subprocess.DEVNULL)
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        readable, _, _ = select.select([leader], [], [], 0.5)
        if readable:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    out, _ = proc.communicate(timeout=30)
    os.close(leader)
    assert proc.returncode == 0, seen
    assert b"purging sent messages: " in seen and b"/50 (" in seen, seen
    assert out.decode().startswith("purged 50 sent message(s)")
