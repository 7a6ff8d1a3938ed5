"""Every parsed field travels as one document (issue 36, item 6): ParsedMessage.document() is the
`p_parsed` jsonb of deliver_messages (the group commit's own statement), deliver_message and
deliver_ses_message, and each field of it is stored in the `messages` column of its name.

Generic on purpose: a field added to ParsedMessage is filled, sent and looked for here with no
change to this test, so a field the SQL side forgets to store fails it (CONTRIBUTING, "Recipes").
"""

from __future__ import annotations

import asyncio
from dataclasses import fields

import psycopg
from psycopg.types.json import Jsonb

from mailroom.http import sqlapi as http_sqlapi
from mailroom.inboxes import sqlapi
from mailroom.inboxes.delivery import DeliveryParams, _deliver, receipt_key
from mailroom.inboxes.mime import ParsedMessage

NOT_STORED = {"defects"}  # counted for the log, not kept with the message


def _filled(tag: str) -> ParsedMessage:
    """A ParsedMessage with a distinct value in every stored field (not ASCII, to cross the JSON)."""
    values = {}
    for f in fields(ParsedMessage):
        if f.name in NOT_STORED:
            continue
        if f.default_factory is list:
            values[f.name] = [{"filename": f"{tag}-{f.name}.txt", "content_type": "text/plain", "size": 1}]
        else:
            values[f.name] = f"{tag} {f.name} é ✓ \"q\" \\"
    return ParsedMessage(**values)


def _stored(conn: psycopg.Connection, ids: list[int], parsed: ParsedMessage) -> None:
    rows = conn.execute("SELECT to_jsonb(m) FROM mailroom.messages AS m WHERE m.id = ANY(%s)", (ids,)).fetchall()
    assert len(rows) == len(ids) > 0
    for (row,) in rows:
        for name, value in parsed.document().items():
            if name in NOT_STORED:
                continue
            assert name in row, f"ParsedMessage.{name} has no column of mailroom.messages"
            assert row[name] == value, f"ParsedMessage.{name} was not stored as sent"


def test_the_group_commit_stores_every_field_of_the_document(conn, db_url, make_mailbox):
    one, two = make_mailbox(), make_mailbox()
    group = [DeliveryParams(b"Subject: a\r\n\r\nx", _filled("first"), "a@example.com", [one.address]),
             DeliveryParams(b"Subject: b\r\n\r\ny", _filled("second"), "", [one.address, two.address])]

    key = receipt_key()

    async def deliver() -> list:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            return await _deliver(aconn, group, key)

    rows = asyncio.run(deliver())
    assert [r.verdict for r in rows] == ["ok", "ok"]
    # the server's one statement leaves its receipt, in its own transaction (issue 37: one round trip)
    assert sqlapi.settle_delivery.value(conn, key=key) == [r.reply for r in rows]
    for params, row in zip(group, rows, strict=True):
        _stored(conn, row.message_ids, params.parsed)


def test_deliver_message_and_the_ses_hook_store_every_field(conn, make_mailbox):
    box = make_mailbox()
    alone = _filled("alone")
    message_id = sqlapi.deliver_message.value(conn, address=box.address, raw=b"x", envelope_from="",
                                              parsed=Jsonb(alone.document()))
    _stored(conn, [message_id], alone)
    ses = _filled("ses")
    rows = http_sqlapi.deliver_ses_message.rows(conn, ses_message_id="ses-doc", recipients=[box.address], raw=b"x",
                                                envelope_from="", parsed=Jsonb(ses.document()))
    assert [r.outcome for r in rows] == ["stored"]
    _stored(conn, [rows[0].message_id], ses)
