"""The queue verbs are data (issue 36): the rows of mailroom.queue_verbs, read by _queue_verb, by the CLI
(its declaration, sqlapi.QUEUE_VERBS) and by the docs (docs/outbound.md's table), which must agree."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from outbound_support import add_sender, enqueue, row

from mailroom.outbound import cli as outbound_cli
from mailroom.outbound import sqlapi

ROOT = Path(__file__).resolve().parents[2]
VERBS = """
SELECT verb, function_name, command, from_statuses, to_status, deletes, due, wakes_senders, destructive,
       log_line, past_tense, description
FROM mailroom.queue_verbs ORDER BY verb
"""


def _rows(conn: psycopg.Connection) -> list[dict]:
    return conn.cursor(row_factory=psycopg.rows.dict_row).execute(VERBS).fetchall()


def test_the_cli_declares_each_verb_as_its_row(conn):
    declared = {v.verb: v for v in sqlapi.QUEUE_VERBS}
    rows = _rows(conn)
    assert sorted(declared) == [r["verb"] for r in rows], "a verb without its declaration (or the other way round)"
    for r in rows:
        v = declared[r["verb"]]
        assert (v.function.name, v.command, list(v.from_statuses), v.destructive, v.past_tense, v.description) == (
            r["function_name"], r["command"], r["from_statuses"], r["destructive"], r["past_tense"], r["description"]
        ), r["verb"]
        # the declared function is the verb's own: the selection and the verb's result
        assert v.function.columns == sqlapi.VERB_RESULT and "ids" in v.function.by_name
        assert outbound_cli.VERBS[v.command] is v, f"no `mailroom outbound {v.command}`"
    registered = {c.name for c in outbound_cli.outbound.registered_commands}
    assert {v.command for v in sqlapi.QUEUE_VERBS} <= registered


def _docs_table() -> list[list[str]]:
    text = (ROOT / "docs" / "outbound.md").read_text()
    section = text.split("### The queue verbs (`mailroom.queue_verbs`)", 1)[1]
    table = next(block for block in section.split("\n\n") if block.startswith("| verb |"))
    lines = table.splitlines()[2:]
    return [[cell.strip().strip("`") for cell in line.strip("|").split(" | ")] for line in lines]


def test_the_docs_table_is_the_rows(conn):
    def target(r: dict) -> str:
        if r["to_status"]:
            return r["to_status"]
        return "(deleted)" if r["deletes"] else "(due now)" if r["due"] == "now" else "(kept)"

    expected = [
        [r["verb"], f"outbound {r['command']}", r["function_name"], ", ".join(r["from_statuses"]), target(r),
         r["log_line"], "yes" if r["wakes_senders"] else "no", "yes" if r["destructive"] else "no", r["description"]]
        for r in _rows(conn)
    ]
    assert sorted(_docs_table()) == sorted(expected)


# The recipe of CONTRIBUTING.md ("Adding a queue verb"): the files a new verb touches
RECIPE = [
    "migrations/",  # its row of mailroom.queue_verbs (a new migration)
    "sql/37_outbound_queue.sql",  # its public function, COMMENT and GRANT
    "driver/mailroom/outbound/sqlapi.py",  # its SqlFunction and QueueVerb: the CLI command follows
    "tests/pgtap/37_outbound_queue.sql",  # what it does
    "docs/outbound.md",  # its row of the verbs' table
]


def test_the_recipe_names_at_most_six_files():  # five today: the grant's line is the matrix
    text = (ROOT / "CONTRIBUTING.md").read_text()
    recipe = text.split("### Adding a queue verb", 1)[1].split("\n#", 1)[0]
    named = re.findall(r"^\d+\. `([^`]+)`", recipe, re.MULTILINE)
    assert named == RECIPE and len(named) <= 6
    assert all((ROOT / path).exists() for path in named)


def test_a_verb_added_as_data(conn):
    """The recipe's SQL part: a row and a function of three lines, nothing else in SQL (`uncancel`:
    cancelled mail back to the queue as it was, the senders woken)."""
    conn.execute("""
        INSERT INTO mailroom.queue_verbs (verb, function_name, command, from_statuses, to_status, wakes_senders,
                                          log_line, past_tense, description)
        VALUES ('uncancel', 'uncancel_messages', 'uncancel', '{cancelled}', 'queued', true,
                'uncancelled by operator', 'uncancelled', 'Queue cancelled messages again, due when they were.')
    """)
    conn.execute("""
        CREATE FUNCTION mailroom.uncancel_messages(
            p_ids bigint[] DEFAULT null, p_domain text DEFAULT null, p_all boolean DEFAULT false,
            p_status text DEFAULT null, p_dry_run boolean DEFAULT false
        )
        RETURNS TABLE (changed bigint, in_flight bigint, suppressed bigint, sample_ids bigint[], suppressed_ids bigint[])
        LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
        AS $$ SELECT * FROM mailroom_internal._queue_verb('uncancel', p_ids, p_domain, p_all, p_status, p_dry_run) $$;
        REVOKE ALL ON FUNCTION mailroom.uncancel_messages(bigint[], text, boolean, text, boolean) FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION mailroom.uncancel_messages(bigint[], text, boolean, text, boolean) TO mailroom_admin;
    """)
    add_sender(conn, 2525)
    first, second = enqueue(conn, 2)
    conn.execute("SELECT * FROM mailroom.cancel_messages(ARRAY[%s, %s]::bigint[])", (first, second))
    with conn.transaction():
        conn.execute("SET LOCAL ROLE mailroom_admin")
        (changed, in_flight, _, sample, _) = conn.execute(
            "SELECT * FROM mailroom.uncancel_messages(ARRAY[%s]::bigint[])", (first,)).fetchone()
    assert (changed, in_flight, sample) == (1, 0, [first])
    stored = row(conn, first)
    assert stored["status"] == "queued" and stored["error_log"].endswith(" uncancelled by operator")
    assert row(conn, second)["status"] == "cancelled"
    with pytest.raises(psycopg.Error) as info:  # the row's statuses: a queued message is not uncancelled
        conn.execute("SELECT * FROM mailroom.uncancel_messages(ARRAY[%s]::bigint[])", (first,))
    assert info.value.sqlstate == "MR341" and "uncancel applies to cancelled messages" in str(info.value)
    with conn.transaction():  # least privilege: its own grant, the sender has none
        conn.execute("SET LOCAL ROLE mailroom_sender")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM mailroom.uncancel_messages(p_all => true)")
