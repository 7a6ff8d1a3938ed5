"""`mailroom keys …` as an admin login: the keyring from the CLI, and the upgrade's one import."""

from __future__ import annotations

import re

import psycopg

from mailroom.testing import as_login


def test_keys_list_rotate_export_retire(cli, conn):
    listed = cli("keys", "list")
    assert listed.returncode == 0, listed.stderr
    (first,) = [int(line.split()[0]) for line in listed.stdout.splitlines()[1:]]
    assert re.search(rf"^\s*{first}\s+active\s+generated\s+[0-9a-f]{{16}}\s", listed.stdout, re.M), listed.stdout

    rotated = cli("keys", "rotate")
    assert rotated.returncode == 0 and "the active signing key" in rotated.stdout
    states = dict(conn.execute("SELECT id, state::text FROM mailroom.signing_keys").fetchall())
    assert states[first] == "verify_only" and sorted(states.values()) == ["active", "verify_only"]

    exported = cli("keys", "export", str(first))
    assert exported.returncode == 0 and re.fullmatch(r"[0-9a-f]{64}\n", exported.stdout)
    key = conn.execute("SELECT key FROM mailroom.signing_keys WHERE id = %s", (first,)).fetchone()[0]
    assert bytes(key).hex() == exported.stdout.strip()

    assert cli("keys", "retire", str(first)).returncode == 0
    gone = cli("keys", "export", str(first))
    assert gone.returncode == 1 and gone.stderr.startswith("mailroom: error: signing key") and "MR123" in gone.stderr
    active = cli("keys", "retire", str(max(states)))
    assert active.returncode == 1 and "rotate first" in active.stderr


def test_keys_import_once_keeps_links_of_the_previous_release_working(cli, conn):
    old_hex = "0badf00d" * 8
    conn.execute("SELECT mailroom.create_account('old@example.test', 'old')")
    # a collector of the previous release signed with its MAILROOM_SECRET_KEY
    signed = conn.execute("SELECT signed FROM mailroom.dequeue_tokens(10, %s)", (bytes.fromhex(old_hex),)).fetchone()[0]
    missing = cli("keys", "import")
    assert missing.returncode == 2 and "MAILROOM_SECRET_KEY is not set" in missing.stderr
    imported = cli("keys", "import", env={"MAILROOM_SECRET_KEY": old_hex})
    assert imported.returncode == 0, imported.stderr
    assert "verify-only" in imported.stdout and old_hex not in imported.stdout + imported.stderr
    assert conn.execute("SELECT account FROM mailroom.consume_token(%s)", (signed,)).fetchone()[0]


def test_keys_are_the_admins(db_url):
    with psycopg.connect(as_login(db_url, "mr_app"), autocommit=True) as app:
        for call in ("SELECT mailroom.rotate_signing_key()", "SELECT mailroom.export_signing_key()",
                     "SELECT * FROM mailroom.list_signing_keys()"):
            try:
                app.execute(call)
                raise AssertionError(f"{call} as mailroom_app")
            except psycopg.errors.InsufficientPrivilege:
                pass
