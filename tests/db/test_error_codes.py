"""The error vocabulary is data in SQL: mailroom.error_codes lists exactly the MR codes sql/ raises, and the
driver classifies errors by the rows it reads (no MR code in Python)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import psycopg

from mailroom.core import errors
from mailroom.db import connect as connect_module

ROOT = Path(__file__).resolve().parents[2]
RAISE = re.compile(r"ERRCODE\s*=\s*'(MR[0-9]{3})'")


def test_the_table_lists_every_code_raised_in_sql_and_no_other(conn: psycopg.Connection) -> None:
    raised = {code for path in (ROOT / "sql").glob("*.sql") for code in RAISE.findall(path.read_text())}
    listed = {code for (code,) in conn.execute("SELECT code FROM mailroom.error_codes()")}
    assert raised, "no RAISE … ERRCODE = 'MRnnn' found in sql/"
    assert sorted(raised - listed) == [], "raised in sql/ but missing from mailroom.error_codes (add a row)"
    assert sorted(listed - raised) == [], "in mailroom.error_codes but raised nowhere in sql/"


def test_no_mr_code_in_the_driver() -> None:
    found = []
    for path in sorted((ROOT / "driver" / "mailroom").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(r"\bMR[0-9]{3}\b", node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:40]!r}")
    assert found == [], "an MR code written in Python (read mailroom.error_codes instead):\n" + "\n".join(found)


def test_a_connection_teaches_the_process_the_vocabulary(db_url: str, monkeypatch) -> None:
    monkeypatch.setattr(errors, "_ERROR_CODES", {})  # a process that has learned nothing yet
    monkeypatch.setattr(connect_module, "_vocabulary_read", False)
    with connect_module.connect(db_url) as conn:
        with conn.cursor() as cur:
            try:
                cur.execute("SELECT mailroom.show_outbound_message(-1)")
            except psycopg.Error as exc:
                error = exc
    assert error.sqlstate == "MR340"
    assert errors.kind_of(error) is errors.Kind.NOT_FOUND
    assert errors.error_code(error).meaning == "no outbound message with this id"


def test_the_cli_exit_code_follows_the_kind_in_the_table(cli, conn: psycopg.Connection) -> None:
    proc = cli("outbound", "show", "999999")
    assert proc.returncode == 1, proc.stderr  # MR340 not_found: a runtime failure
    assert "SQLSTATE MR340" in proc.stderr
    conn.execute("UPDATE mailroom.error_codes SET kind = 'usage' WHERE code = 'MR340'")
    proc = cli("outbound", "show", "999999")
    assert proc.returncode == 2, proc.stderr  # the same error, now usage: exit 2
