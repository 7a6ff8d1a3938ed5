"""The claim's row (mailroom.claimed_message) as finalize_and_claim returns it: a composite in a column.

psycopg reads a composite's text form with a regular expression that steps through a quoted value
one character at a time: 0.2-0.3 ms for a row with a 2 KB body, the sender's largest per-message
cost after the socket (issue 37, the default drain's profile). `register()` registers psycopg's
loader for the type, then a subclass that splits the record with `bytes.find` (the same fields,
the same loaders for each, the same row object): tests/outbound/test_claim_row.py compares the two
on rows with quotes, backslashes, NULLs, empty strings and arrays, and fails when the loader is not
installed (psycopg's loader internals: `make_object`, `_tx`; pyproject.toml pins the tested minor).
MAILROOM_FAST_PATHS=off: psycopg's own loader.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg.pq import Format
from psycopg.types.composite import CompositeInfo, register_composite

from mailroom.core import fastpaths
from mailroom.core.log import get_logger

log = get_logger("send")

_UNDOUBLE = re.compile(rb'(["\\])\1')


def split_record(data: bytes) -> list[bytes | None]:
    """The fields of a record's text form without its parentheses, as psycopg's _parse_text_record
    splits them: an empty field is NULL, a quoted one has its doubled quotes and backslashes
    undone (record_out doubles both inside quotes, so a quote inside is always a pair), an unquoted
    one runs to the next comma (record_out quotes any value holding a comma, quote, backslash,
    parenthesis or white space)."""
    out: list[bytes | None] = []
    n = len(data)
    pos = 0
    while True:
        if pos == n:  # nothing after the last comma: a last NULL field
            out.append(None)
            return out
        c = data[pos]
        if c == 44:  # ',': an empty field, NULL
            out.append(None)
            pos += 1
            continue
        if c == 34:  # '"': up to the quote that is not doubled
            start = j = pos + 1
            doubled = False
            while True:
                q = data.find(b'"', j)
                if q < 0:
                    raise psycopg.DataError("unterminated quoted field in a record")
                if q + 1 < n and data[q + 1] == 34:
                    j, doubled = q + 2, True
                    continue
                break
            value = data[start:q]
            if doubled or b"\\" in value:
                value = _UNDOUBLE.sub(rb"\1", value)
            out.append(value)
            pos = q + 1
        else:
            end = data.find(b",", pos)
            if end < 0:
                out.append(data[pos:])
                return out
            out.append(data[pos:end])
            pos = end
        if pos >= n:  # the last field
            return out
        pos += 1  # its comma


def register(info: CompositeInfo, conn: psycopg.AsyncConnection | psycopg.Connection) -> None:
    """Read `info`'s type on `conn` as psycopg's register_composite does (the same row objects),
    splitting the text form with split_record."""
    register_composite(info, conn)
    if not fastpaths.enabled():  # MAILROOM_FAST_PATHS=off: psycopg's own loader
        return
    base: Any = conn.adapters.get_loader(info.oid, Format.TEXT)
    if base is None or not hasattr(base, "make_object"):  # pragma: no cover - another psycopg: its own loader
        log.warning("this psycopg's composite loader changed: claimed rows are read by psycopg's own (slower)")
        return

    class FastLoader(base):  # type: ignore[misc, valid-type]
        def load(self, data: Any) -> Any:
            data = bytes(data)
            args = () if data == b"()" else self._tx.load_sequence(tuple(split_record(data[1:-1])))
            return type(self).make_object(args, self.info)

    conn.adapters.register_loader(info.oid, FastLoader)
