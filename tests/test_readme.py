"""What the README tells a newcomer to type works: the psql session and every CLI command it names."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mailroom import testing

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def login_granted(db_url: str, *roles: str) -> str:
    """`db_url` as a login granted exactly `roles` (created once for the cluster): what a block of the
    README names is what it runs as, never the superuser."""
    import psycopg
    from psycopg import sql

    login = "readme_" + "_".join(r.removeprefix("mailroom_") for r in roles)
    with psycopg.connect(db_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (login,)).fetchone():
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(login)))
        for role in roles:
            conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(login)))
    return testing.as_login(db_url, login)


def psql(url: str, block: str, *variables: str) -> subprocess.CompletedProcess:
    args = [a for v in variables for a in ("-v", v)]
    return subprocess.run(["psql", "-X", "-v", "ON_ERROR_STOP=1", *args, url], input=block,
                          capture_output=True, text=True, timeout=60)


def test_psql_session_works_when_pasted(db_url):
    intro, block = re.search(r"(A short session.*?)```sql\n(.*?)```", README, re.S).groups()
    roles = re.findall(r"`(mailroom_[a-z]+)`", intro)
    assert roles == ["mailroom_app", "mailroom_collector"], roles  # the roles the README names
    proc = psql(login_granted(db_url, *roles), block)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^\s*active\s*$", proc.stdout, re.M), proc.stdout
    # LISTEN token_insert alone hears the account's token (the seed's walkthrough, issue 33)
    assert 'Asynchronous notification "token_insert" with payload "1" received' in proc.stdout, proc.stdout
    # the last statement is the refused second use, with its own message
    assert "ERROR:  token already used" in proc.stderr


def test_the_api_listing_shows_the_api_only(db_url):
    """`\\df mailroom.*` and the README's query list the public API, each function with its comment, and no
    internal helper (issue 36, item 1): as a runtime login, which may not even see mailroom_internal."""
    section = README.split("## The SQL API for psql users", 1)[1]
    assert "`\\df mailroom.*`" in section
    query = re.search(r"```sql\n(.*?)```", section, re.S).group(1)
    url = login_granted(db_url, "mailroom_app")
    import psycopg

    with psycopg.connect(url) as conn:
        rows = [(str(f), comment or "") for f, comment in conn.execute(query).fetchall()]
    assert len(rows) > 100, rows[:5]
    assert [f for f, _ in rows if re.match(r"mailroom\.(_|trg_)", f) or not f.startswith("mailroom.")] == []
    assert [f for f, comment in rows if not comment.strip()] == []
    df = psql(url, "\\pset format unaligned\n\\pset tuples_only on\n\\df mailroom.*\n")
    assert df.returncode == 0, df.stderr
    names = {line.split("|")[1] for line in df.stdout.splitlines() if line.startswith("mailroom|")}
    assert names == {f.split("(", 1)[0].removeprefix("mailroom.") for f, _ in rows}
    assert not any(n.startswith(("_", "trg_")) for n in names), sorted(names)


def cli_commands() -> list[list[str]]:
    table = README.split("## The CLI", 1)[1].split("\n\n", 2)[1]
    commands = []
    for cell in re.findall(r"^\| `mailroom ([^`]+)`", table, re.M):
        words = cell.replace("[", " ").split()
        head = [w for w in words if re.fullmatch(r"[a-z][a-z-]*", w)]
        if not head:  # `mailroom --version`: a flag of the root command
            commands.append(words)
            continue
        group, rest = head[0], head[1:]
        if rest and "/" in cell:  # `db up / down / …`: every sub-command
            subs = [s.strip().split()[0] for s in cell.split(" ", 1)[1].split("/")]
            commands += [[group, s] for s in subs if re.fullmatch(r"[a-z][a-z-]*", s)]
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
            "outbound reap", "outbound run-now", "outbound hold", "settings set", "status", "plans", "run",
            "demo"} <= names


def test_waiting_and_suppression_session_works_when_pasted(db_url):
    """The second psql block: the message is delivered while wait_for_message is waiting."""
    import threading

    import psycopg

    waiting = re.search(r"Testing a sign-up flow from psql.*?```sql\n(.*?)```", README, re.S).group(1)
    suppressing = re.search(r"The suppression list is the operator's.*?```sql\n(.*?)```", README, re.S).group(1)
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
        proc = psql(testing.as_login(db_url, "mr_app_nopin"), waiting, f"address={address}",
                    f"session_token={session_token}")  # as the application's login (mailroom_app only)
    finally:
        thread.join()
    assert proc.returncode == 0, proc.stderr
    assert link in proc.stdout
    assert re.search(r"^\s*48213\s*$", proc.stdout, re.M), proc.stdout
    proc = psql(login_granted(db_url, "mailroom_admin"), suppressing)  # as the operator's login
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^\s*t\s*$", proc.stdout, re.M), proc.stdout  # is_suppressed, other case
    assert re.search(r"^\s*bounced@example\.com \| manual\s*$", proc.stdout, re.M), proc.stdout
