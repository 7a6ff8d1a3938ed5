"""What the README tells a newcomer to type works: the psql session and every CLI command it names."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_psql_session_works_when_pasted(db_url):
    block = re.search(r"A short session.*?```sql\n(.*?)```", README, re.S).group(1)
    proc = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", db_url], input=block,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^\s*active \| t\s*$", proc.stdout, re.M), proc.stdout
    # the last statement is the refused second use, with its own message
    assert "ERROR:  token already used" in proc.stderr


def cli_commands() -> list[list[str]]:
    table = README.split("## The CLI", 1)[1].split("\n\n", 2)[1]
    commands = []
    for cell in re.findall(r"^\| `mailroom ([^`]+)`", table, re.M):
        words = cell.replace("[", " ").split()
        head = [w for w in words if re.fullmatch(r"[a-z]+", w)]
        if not head:  # `mailroom --version`: a flag of the root command
            commands.append(words)
            continue
        group, rest = head[0], head[1:]
        if rest and "/" in cell:  # `db up / down / …`: every sub-command
            subs = [s.strip().split()[0] for s in cell.split(" ", 1)[1].split("/")]
            commands += [[group, s] for s in subs if re.fullmatch(r"[a-z]+", s)]
        else:
            commands.append([group, *rest[:1]] if rest else [group])
    return commands


@pytest.mark.parametrize("command", cli_commands(), ids=" ".join)
def test_cli_command_named_in_readme_exists(command):
    proc = subprocess.run([sys.executable, "-m", "mailroom", *command, "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_readme_cli_table_is_parsed():
    names = {" ".join(c) for c in cli_commands()}
    assert {"db up", "db url", "collect", "inbox serve", "expire", "send", "outbound status",
            "outbound reap", "run", "demo"} <= names


def test_waiting_and_suppression_session_works_when_pasted(db_url):
    """The second psql block: the message is delivered while wait_for_message is waiting."""
    import threading

    import psycopg

    block = re.search(r"Testing a sign-up flow from psql.*?```sql\n(.*?)```", README, re.S).group(1)
    with psycopg.connect(db_url, autocommit=True) as conn:
        address, session_token = conn.execute(
            "SELECT address, session_token FROM mailroom.create_mailbox(30, 'free')").fetchone()
    link = "https://app.example/activate?t=AbC123_-x"
    body = f"Welcome! Activate your account: {link}\nor type the code 48213.\n"
    raw = (f"From: app@example.com\r\nTo: {address}\r\nSubject: Activate your account\r\n\r\n"
           f"{body}").encode()

    def deliver_later() -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("SELECT pg_sleep(1)")
            conn.execute("SELECT mailroom.deliver_message(%s, %s, 'app@example.com', "
                         "'Activate your account', 'app@example.com', %s)", (address, raw, body))

    thread = threading.Thread(target=deliver_later)
    thread.start()
    try:
        proc = subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", "-v", f"address={address}",
                               "-v", f"session_token={session_token}", db_url], input=block,
                              capture_output=True, text=True, timeout=60)
    finally:
        thread.join()
    assert proc.returncode == 0, proc.stderr
    assert link in proc.stdout
    assert re.search(r"^\s*48213\s*$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^\s*t\s*$", proc.stdout, re.M), proc.stdout  # is_suppressed, other case
    assert re.search(r"^\s*bounced@example\.com \| manual\s*$", proc.stdout, re.M), proc.stdout
