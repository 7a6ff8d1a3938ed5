"""The sender reads finalize_and_claim's claimed rows with its own split of the record's text form
(outbound/claimrow.py): the same fields and row objects as psycopg's register_composite."""

from __future__ import annotations

import psycopg
import pytest
from outbound_support import add_sender
from psycopg.types.composite import CompositeInfo, _parse_text_record, register_composite
from psycopg.types.json import Jsonb

from mailroom.outbound import claimrow

# values record_out quotes (or not) in every way: quotes, backslashes, commas, parentheses, white
# space, line ends, empty strings, NULLs first, in the middle and last
SUBJECTS = ['plain', 'with "quotes"', 'back\\slash \\\\ and "\\"', 'a,b (c) d', '', '"', '""', '\\', 'x"', ',']
BODIES = [None, '', 'line\nline\r\nend', 'Lorem ipsum, dolor "sit" amet.\n' * 70, '"quoted" \\ ,']


@pytest.mark.parametrize("raw", [
    b",", b",,", b"a", b"a,", b",a", b"a,,b", b'""', b'"",""', b'""""', b'"a""",b', b'"\\\\",', b'x,"y,z",',
    b'"(1,2)",{a,b},"{""x y"",z}"',
])
def test_split_record_is_psycopgs(raw):
    assert claimrow.split_record(raw) == _parse_text_record(raw)


def test_split_record_of_nothing_is_one_null(conn):
    # psycopg's loader answers "()" before it splits (its splitter fails on nothing), so PostgreSQL is
    # the reference here: "()" is how record_out writes a one-field record holding NULL
    assert conn.execute("SELECT ROW(NULL::text)::text").fetchone()[0] == "()"
    assert claimrow.split_record(b"") == [None]


def test_claimed_rows_load_as_register_composite_loads_them(conn):
    add_sender(conn, 2525)
    for i, subject in enumerate(SUBJECTS):
        conn.execute(
            "SELECT mailroom.enqueue_message(p_sender => 'main', p_to => %s, p_subject => %s, p_text_body => %s,"
            " p_html_body => %s, p_cc => %s, p_headers => %s)",
            ([f"r{i}@example.com"], subject.replace("\n", " "), BODIES[i % len(BODIES)] or "x",
             BODIES[(i + 1) % len(BODIES)], [] if i % 2 else [f"c{i}@example.com", f"d{i}@example.com"],
             Jsonb({} if i % 3 else {"X-Tag": subject or "t"})),
        )
    info = CompositeInfo.fetch(conn, "mailroom.claimed_message")
    query = "SELECT c::mailroom.claimed_message FROM mailroom.claim_messages(100, 'test-claim-row') AS c"
    with conn.transaction(force_rollback=True):
        texts = [r[0] for r in conn.execute(query.replace("::mailroom.claimed_message", "::text")).fetchall()]
    assert len(texts) == len(SUBJECTS)
    with psycopg.connect(conn.info.dsn, autocommit=True) as theirs, psycopg.connect(conn.info.dsn) as ours:
        register_composite(info, theirs)
        claimrow.register(info, ours)
        for text in texts:
            expected = theirs.execute("SELECT %s::mailroom.claimed_message", (text,)).fetchone()[0]
            got = ours.execute("SELECT %s::mailroom.claimed_message", (text,)).fetchone()[0]
            assert got == expected
            assert got._fields == expected._fields


def test_the_split_loader_is_installed_exactly_when_switched_on(conn):
    """A psycopg whose composite loader the split does not fit would leave psycopg's own loader in place
    with every comparison above still passing: this fails instead (MAILROOM_FAST_PATHS=off: psycopg's)."""
    from psycopg.pq import Format

    from mailroom.core import fastpaths

    info = CompositeInfo.fetch(conn, "mailroom.claimed_message")
    with psycopg.connect(conn.info.dsn) as ours:
        claimrow.register(info, ours)
        loader = ours.adapters.get_loader(info.oid, Format.TEXT)
        assert (loader.__name__ == "FastLoader") is fastpaths.enabled(), (psycopg.__version__, loader)
