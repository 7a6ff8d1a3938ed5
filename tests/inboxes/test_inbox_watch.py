"""Waiting for mail (issue 15 part 3): wait_for_message from a second connection while the real
`mailroom inbox serve` receives the mail over SMTP, its timeout, extract_link/extract_code on a
real multipart mail, NOTIFY mailroom_inbox, and `mailroom inbox watch`."""

from __future__ import annotations

import json
import queue
import signal
import smtplib
import subprocess
import threading
import time
from email.message import EmailMessage

import psycopg
import pytest

from mailroom import testing


def _app_url(db_url: str) -> str:
    """The application's least-privilege login: wait_for_message is granted to mailroom_app."""
    return testing.as_login(db_url, "mr_app")


def _send(server, to: str, subject: str, text: str | None = None, html: str | None = None) -> None:
    msg = EmailMessage()
    msg["From"] = "App <app@example.org>"
    msg["To"] = to
    msg["Subject"] = subject
    if text is not None:
        msg.set_content(text)
        if html is not None:
            msg.add_alternative(html, subtype="html")
    else:
        msg.set_content(html or "", subtype="html")
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.send_message(msg, from_addr="app@example.org", to_addrs=[to])


def test_wait_for_message_returns_as_soon_as_the_mail_is_committed(server, db_url, make_mailbox):
    box = make_mailbox()
    result: dict = {}

    def wait() -> None:
        with psycopg.connect(_app_url(db_url), autocommit=True) as waiter:
            started = time.monotonic()
            result["row"] = waiter.execute(
                "SELECT message_id, subject, from_header, text_body"
                " FROM mailroom.wait_for_message(%s, %s, interval '20 seconds', 'Activate%%')",
                (box.address, box.token),
            ).fetchone()
            result["returned"] = time.monotonic()
            result["started"] = started

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.7)  # the waiter is polling, nothing there yet
    assert "row" not in result
    _send(server, box.address, "Something else", "not this one")
    time.sleep(0.3)
    assert "row" not in result, "a message whose subject does not match must not end the wait"
    _send(server, box.address, "Activate your account", "Click https://app.example.org/a?t=1")
    sent = time.monotonic()  # smtplib returned after the 250, which comes after the commit
    waiter.join(timeout=25)
    assert not waiter.is_alive()
    message_id, subject, from_header, text_body = result["row"]
    assert subject == "Activate your account"
    assert from_header == "App <app@example.org>"
    assert "https://app.example.org/a?t=1" in text_body
    assert result["returned"] - sent < 2.0, "wait_for_message should return within a poll of the commit"
    assert result["returned"] - result["started"] >= 1.0  # it did wait for the mail


def test_wait_for_message_times_out_with_mr212(db_url, make_mailbox):
    box = make_mailbox()
    with psycopg.connect(_app_url(db_url), autocommit=True) as app:
        started = time.monotonic()
        with pytest.raises(psycopg.Error) as err:
            app.execute("SELECT * FROM mailroom.wait_for_message(%s, %s, interval '0.5 seconds')",
                        (box.address, box.token))
        elapsed = time.monotonic() - started
        assert err.value.sqlstate == "MR212"
        assert "no matching message arrived within" in str(err.value)
        assert 0.5 <= elapsed < 5
        for bad in ("-1 second", "1 hour"):
            with pytest.raises(psycopg.Error) as err:
                app.execute("SELECT * FROM mailroom.wait_for_message(%s, %s, %s::interval)",
                            (box.address, box.token, bad))
            assert err.value.sqlstate == "MR213"


def test_wait_for_message_refuses_to_wait_in_repeatable_read(db_url, make_mailbox):
    box = make_mailbox()
    with psycopg.connect(_app_url(db_url)) as app:
        app.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        started = time.monotonic()
        with pytest.raises(psycopg.Error) as err:
            app.execute("SELECT * FROM mailroom.wait_for_message(%s, %s, interval '30 seconds')",
                        (box.address, box.token))
        assert err.value.sqlstate == "MR214"
        assert time.monotonic() - started < 5, "it must say so at once, not wait in vain"


def test_extract_link_and_code_from_a_real_mail(server, db_url, make_mailbox):
    box = make_mailbox()
    other = make_mailbox()
    _send(server, box.address, "Confirm",
          "Welcome!\nConfirm: https://app.example.org/confirm?token=Ab-9_x.\nYour code is 40213.\n",
          '<p>Welcome! <a href="https://app.example.org/confirm?token=Ab-9_x&amp;html=1">Confirm</a></p>')
    _send(server, box.address, "Code", None,
          '<html><body><p>Your code: <b>77031</b></p>'
          '<a href="https://app.example.org/reset?a=1&amp;b=2">reset</a></body></html>')
    with psycopg.connect(_app_url(db_url), autocommit=True) as app:
        text_id = app.execute("SELECT message_id FROM mailroom.wait_for_message(%s, %s, '10 s', 'Confirm')",
                              (box.address, box.token)).fetchone()[0]
        html_id = app.execute("SELECT message_id FROM mailroom.wait_for_message(%s, %s, '10 s', 'Code')",
                              (box.address, box.token)).fetchone()[0]

        def one(sql: str, *params) -> str:
            return app.execute(sql, params).fetchone()[0]

        assert one("SELECT mailroom.extract_link(%s, %s, %s)", box.address, box.token, text_id) == \
            "https://app.example.org/confirm?token=Ab-9_x"
        assert one("SELECT mailroom.extract_code(%s, %s, %s)", box.address, box.token, text_id) == "40213"
        assert one("SELECT mailroom.extract_link(%s, %s, %s, '%%reset%%')", box.address, box.token, html_id) == \
            "https://app.example.org/reset?a=1&b=2"
        assert one("SELECT mailroom.extract_code(%s, %s, %s)", box.address, box.token, html_id) == "77031"
        with pytest.raises(psycopg.Error) as err:
            app.execute("SELECT mailroom.extract_link(%s, %s, %s)", (other.address, other.token, text_id))
        assert err.value.sqlstate == "MR209"
        with pytest.raises(psycopg.Error) as err:
            app.execute("SELECT mailroom.extract_code(%s, %s, %s)", (box.address, other.token, text_id))
        assert err.value.sqlstate == "MR204"
        with pytest.raises(psycopg.Error) as err:
            app.execute("SELECT mailroom.extract_link(%s, %s, %s, '%%nowhere%%')", (box.address, box.token, text_id))
        assert err.value.sqlstate == "MR215"


def test_delivery_notifies_mailroom_inbox_with_ids_only(server, db_url, conn, make_mailbox):
    box = make_mailbox()
    with psycopg.connect(_app_url(db_url), autocommit=True) as listener:
        listener.execute("LISTEN mailroom_inbox")
        listener.execute("SELECT mailroom.listen(ARRAY['mailroom_inbox'])")  # sql/08: notified while registered
        _send(server, box.address, "Secret subject", "body")
        notes = list(listener.notifies(timeout=10, stop_after=1))
    assert notes and notes[0].channel == "mailroom_inbox"
    payload = json.loads(notes[0].payload)
    message_id = conn.execute("SELECT message_id FROM mailroom.list_messages(%s, %s)",
                              (box.address, box.token)).fetchone()[0]
    assert payload == {"mailbox_id": box.id, "message_id": message_id}
    assert box.address.split("@")[0] not in notes[0].payload and "Secret" not in notes[0].payload


def _read_lines(stream, out: queue.Queue) -> None:
    for line in stream:
        out.put(line.rstrip("\n"))


@pytest.mark.parametrize("listen", [True, False], ids=["listen", "poll"])
def test_inbox_watch_prints_each_new_message(server, cli_popen, make_mailbox, tmp_path, listen):
    box = make_mailbox()
    other = make_mailbox()
    _send(server, box.address, "Already there", "old")
    err_path = tmp_path / "watch.err"
    with open(err_path, "w") as err_file:
        args = ["inbox", "watch", box.address, "--token", box.token, "--poll-interval", "0.3s"]
        if not listen:
            args += ["--listen-url", "none"]
        proc = cli_popen(*args, stdout=subprocess.PIPE, stderr=err_file, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + 15
    while "watching" not in err_path.read_text() and time.monotonic() < deadline:
        assert proc.poll() is None, err_path.read_text()
        time.sleep(0.05)
    time.sleep(0.5)  # the listener's self-test
    _send(server, other.address, "Not mine", "x")
    _send(server, box.address, "Welcome aboard", "hello")
    line = lines.get(timeout=10)
    message_id, received_at, sender, subject = line.split("\t")
    assert subject == "Welcome aboard", line  # the old message and the other inbox's are not printed
    assert sender == "App <app@example.org>"
    assert int(message_id) > 0 and received_at.startswith("20")
    _send(server, box.address, "Second", "again")
    assert lines.get(timeout=10).endswith("\tSecond")
    proc.send_signal(signal.SIGTERM if listen else signal.SIGINT)
    assert proc.wait(timeout=10) == 0, err_path.read_text()
    assert lines.empty()
    assert box.address not in err_path.read_text()


def test_inbox_watch_with_a_wrong_token_fails_in_one_line(cli, make_mailbox):
    box = make_mailbox()
    result = cli("inbox", "watch", box.address, "--token", "wrong", timeout=30)
    assert result.returncode == 1
    assert "MR204" in result.stderr and "Traceback" not in result.stderr


def test_wait_for_message_ends_when_the_inbox_is_deleted_meanwhile(db_url, conn, make_mailbox):
    box = make_mailbox()
    result: dict = {}

    def wait() -> None:
        with psycopg.connect(_app_url(db_url), autocommit=True) as waiter:
            try:
                waiter.execute("SELECT * FROM mailroom.wait_for_message(%s, %s, interval '20 seconds')",
                               (box.address, box.token))
            except psycopg.Error as exc:
                result["sqlstate"] = exc.sqlstate
            result["ended"] = time.monotonic()

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.5)
    conn.execute("SELECT mailroom.delete_mailbox(%s, %s)", (box.address, box.token))
    deleted = time.monotonic()
    thread.join(timeout=25)
    assert result["sqlstate"] == "MR206"
    assert result["ended"] - deleted < 2.0


def test_inbox_watch_existing_as_json_while_polling(server, cli_popen, make_mailbox):
    box = make_mailbox()
    _send(server, box.address, "Already there", "old")
    proc = cli_popen("inbox", "watch", box.address, "--token", box.token, "--existing", "--json",
                     "--listen-url", "none", "--poll-interval", "0.2s", stdout=subprocess.PIPE,
                     stderr=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    first = json.loads(lines.get(timeout=15))
    assert first["subject"] == "Already there" and first["from"] == "App <app@example.org>"
    _send(server, box.address, "New one", "new")
    second = json.loads(lines.get(timeout=10))
    assert second["subject"] == "New one" and second["message_id"] > first["message_id"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
