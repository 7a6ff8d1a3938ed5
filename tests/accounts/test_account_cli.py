"""`mailroom account …` (issue 33, item 6): the main story from the CLI, one SQL call per command, as
the login of its role (the application's calls as mailroom_app; list and show as mailroom_admin)."""

from __future__ import annotations

import json

from mailroom.testing import login_for


def _json(proc) -> dict:
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _dequeue(conn) -> tuple[str, str | None]:
    """The collector's part: the next token's signed value (and code), as `mailroom collect` writes it."""
    for _ in range(3):  # a recovery request is turned into its token by one call, dispatched by the next
        row = conn.execute("SELECT signed, code FROM mailroom.dequeue_tokens(10)").fetchone()
        if row is not None:
            break
    assert row is not None
    return row[0], row[1]


def test_the_account_story_from_the_cli(cli, conn):
    created = _json(cli("account", "create", "Story@example.test", "story", "--json"))
    account = created["account"]
    assert created["status"] == "provisioned"

    shown = cli("account", "show", "story@EXAMPLE.test")
    assert shown.returncode == 0, shown.stderr
    assert "story" in shown.stdout and "provisioned" in shown.stdout and str(account) in shown.stdout
    assert _json(cli("account", "show", str(account), "--json"))["email"] == "Story@example.test"

    signed, _ = _dequeue(conn)
    consumed = _json(cli("account", "consume", "--json", "--", signed))
    assert consumed["account"] == account and consumed["outcome"] == "consumed"
    assert _json(cli("account", "show", str(account), "--json"))["status"] == "active"

    used = cli("account", "consume", "--", signed)
    assert used.returncode != 0 and used.stderr.count("\n") == 1 and used.stderr.startswith("mailroom: error: ")

    assert _json(cli("account", "suspend", str(account), "--json"))["status"] == "suspended"
    again = cli("account", "suspend", str(account))
    assert again.returncode == 1 and "already suspended" in again.stderr and again.stderr.count("\n") == 1
    assert _json(cli("account", "unsuspend", str(account), "--json"))["status"] == "active"

    assert cli("account", "recover", "story@example.test").returncode == 0
    signed, code = _dequeue(conn)
    assert code is not None
    wrong = cli("account", "consume", "--code", "00000" if code != "00000" else "11111", "--", signed)
    assert wrong.returncode == 2 and "wrong recovery code" in wrong.stderr and wrong.stderr.count("\n") == 1
    recovered = _json(cli("account", "consume", "--code", code, "--json", "--", signed))
    assert recovered["account"] == account and recovered["outcome"] == "consumed"

    listed = cli("account", "list")
    assert listed.returncode == 0, listed.stderr
    header, *lines = listed.stdout.splitlines()
    assert header.split()[:4] == ["ID", "EMAIL", "LOGIN", "STATUS"]
    assert [line.split()[:4] for line in lines] == [[str(account), "Story@example.test", "story", "active"]]
    assert cli("account", "list", "--status", "suspended").stdout.strip() == "no accounts"


def test_account_list_pages(cli, conn):
    ids = [conn.execute("SELECT mailroom.create_account(%s, %s)", (f"p{i}@example.test", f"p{i}")).fetchone()[0]
           for i in range(3)]
    first = [json.loads(line)["id"] for line in cli("account", "list", "--limit", "2", "--json").stdout.splitlines()]
    assert first == ids[:2]
    rest = cli("account", "list", "--from-id", str(first[-1]), "--json").stdout.splitlines()
    assert [json.loads(line)["id"] for line in rest] == ids[2:]


def test_bad_input_is_one_line_exit_2(cli):
    for args, needle in [
        (("account", "create", "not-an-address", "x"), "invalid email address"),
        (("account", "consume", "garbage"), "malformed"),
        (("account", "list", "--status", "gone"), "--status must be one of"),
        (("account", "recover", "nope"), "invalid email address"),
    ]:
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("mailroom: error: ") and needle in proc.stderr, \
            (args, proc.stderr)
    unknown = cli("account", "show", "999999")
    assert unknown.returncode == 1 and unknown.stderr.strip() == "mailroom: error: unknown account 999999"


def test_each_subcommand_runs_as_the_role_it_needs(db_url):
    """The application's calls as mailroom_app; list and show as mailroom_admin, which the application's
    login cannot do (addresses are PII)."""
    import psycopg
    import pytest

    from mailroom.testing import as_login

    assert {sub: login_for(["account", sub]) for sub in ("create", "suspend", "unsuspend", "consume", "recover")} \
        == dict.fromkeys(("create", "suspend", "unsuspend", "consume", "recover"), "mr_app")
    assert login_for(["account", "list"]) == login_for(["account", "show"]) == "mr_admin"
    with psycopg.connect(as_login(db_url, "mr_app"), autocommit=True) as app, \
            pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute("SELECT * FROM mailroom.list_accounts()")
