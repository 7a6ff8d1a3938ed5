"""Where a batch of dequeued tokens goes: stdout (csv / jsonl) or the outbound queue (--enqueue).

Each sink runs ONE batch as one transaction on the collector's work connection: dequeue (which
marks the tokens dispatched in this transaction), hand off, and COMMIT only once the hand-off
succeeded. A failed write rolls back, so an unwritten token stays eligible.
"""

from __future__ import annotations

import json
import os
import sys
from typing import BinaryIO

import psycopg

from mailroom.accounts import sqlapi
from mailroom.core.errors import UserError
from mailroom.db.connect import connection_lost


class OutputClosed(Exception):
    """stdout could not be written (the downstream reader went away); the batch was rolled back."""

    def __init__(self, rows: int, reason: str) -> None:
        super().__init__(reason)
        self.rows = rows
        self.reason = reason


class CommitLost(Exception):
    """The connection dropped during COMMIT of a batch that was already written."""

    def __init__(self, rows: int, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.rows = rows
        self.cause = cause


def format_csv(rows: list[tuple], codes: dict[str, int]) -> bytes:
    """One line per batch: `action,email,login,signed,code` records joined by commas, the action as its
    numeric code (`output_code` of mailroom.token_actions: 1 activation, 2 password recovery; the
    original C collector's, which downstream senders switch on).

    The format has no quoting. Emails cannot hold a comma; a login can (any printable text), so a
    comma in a login is written as `%2C` to keep the record framing (use jsonl for exact values).
    """
    fields: list[str] = []
    for action, email, login, signed, code, _token_id in rows:
        if "," in login:
            login = login.replace(",", "%2C")  # noqa: PLW2901 - framing-safe form of this one field
        fields += (str(codes[action]), email, login, signed, code or "")
    return (",".join(fields) + "\n").encode()


def format_jsonl(rows: list[tuple], codes: dict[str, int]) -> bytes:
    """One JSON object per token."""
    lines = [
        json.dumps(
            {"action": action, "email": email, "login": login, "signed": signed, "code": code,
             "token_id": token_id},
            separators=(",", ":"),
        )
        for action, email, login, signed, code, token_id in rows
    ]
    return ("\n".join(lines) + "\n").encode()


FORMATS = {"csv": format_csv, "jsonl": format_jsonl}


def _commit(conn: psycopg.Connection, rows: int) -> None:
    try:
        conn.commit()
    except psycopg.Error as exc:
        if not connection_lost(conn, exc):
            raise
        raise CommitLost(rows, exc) from None


class StdoutSink:
    """Write each batch to stdout, flush, then commit.

    The one window left is a connection drop between the flush and the COMMIT, whose outcome is
    unknown. If the COMMIT did not happen, the dispatch rolled back, and with it the digests of the
    secrets that were written: those lines' links never work. Their token ids are remembered; when
    the backlog drain after the reconnect dequeues them again, they come back with new links, which
    are written (the first lines were dead, so each token still has exactly one working link), and
    counted in `reissued` for the collector to report. Tokens that do not come back were committed.
    """

    def __init__(self, output: str, stream: BinaryIO | None = None) -> None:
        self.format = FORMATS[output]
        self.stream = stream if stream is not None else sys.stdout.buffer
        self.unconfirmed: set[int] = set()  # written, commit lost
        self.reissued = 0
        self.codes: dict[str, int] = {}  # mailroom.token_actions: action -> CSV code

    def _codes_for(self, conn: psycopg.Connection, rows: list[tuple]) -> dict[str, int]:
        """The CSV codes of the batch's types, read from mailroom.token_actions (again when a type is new
        to this process); a type without a row is refused, never written with another's code."""
        if any(r[0] not in self.codes for r in rows):
            self.codes = {a.action: a.output_code for a in sqlapi.token_actions.rows(conn)}
            unknown = sorted({r[0] for r in rows} - self.codes.keys())
            if unknown:
                conn.rollback()
                raise UserError(f"token action {', '.join(unknown)} has no row in mailroom.token_actions; "
                                "rolled back the batch")
        return self.codes

    def run_batch(self, conn: psycopg.Connection, limit: int) -> int:
        # minted and signed with the keyring's active key in the database: the links come back as results
        rows = [tuple(r) for r in sqlapi.dequeue_tokens.rows(conn, limit=limit)]
        if not rows:
            # nothing was handed out, but the call may have issued requested recovery tokens
            # (handed out by the next call): commit, which costs nothing when it wrote nothing
            conn.commit()
            return 0
        data = self.format(rows, self._codes_for(conn, rows))
        try:
            self.stream.write(data)
            self.stream.flush()
        except (OSError, ValueError) as exc:
            conn.rollback()
            self._silence()
            reason = "the reader closed the pipe" if isinstance(exc, BrokenPipeError) else str(exc)
            raise OutputClosed(len(rows), reason) from None
        try:
            _commit(conn, len(rows))
        except CommitLost:
            self.unconfirmed.update(r[5] for r in rows)
            raise
        if self.unconfirmed:
            again = self.unconfirmed.intersection(r[5] for r in rows)
            self.reissued += len(again)
            self.unconfirmed -= again
        return len(rows)

    def settle(self) -> None:
        """After a complete backlog drain, tokens still unconfirmed were committed after all."""
        self.unconfirmed.clear()

    def _silence(self) -> None:
        """Point fd 1 at /dev/null so the interpreter's exit flush cannot print a traceback."""
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


class EnqueueSink:
    """Turn each batch into outbound messages in SQL (mailroom.enqueue_token_emails), then commit."""

    reissued = 0

    def run_batch(self, conn: psycopg.Connection, limit: int) -> int:
        # the emails get their links when the sender claims them: none rests in the queue
        value = sqlapi.enqueue_token_emails.value(conn, limit=limit)
        count = int(value) if value is not None else 0
        if count == 0:
            conn.commit()  # it may have issued requested recovery tokens (see StdoutSink.run_batch)
            return 0
        _commit(conn, count)
        return count

    def settle(self) -> None:
        """Nothing to settle: the outbox rows and the dispatch commit or roll back together."""
