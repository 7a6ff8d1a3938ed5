"""`mailroom inbox watch ADDRESS`: print each new message's summary as it arrives.

It hears `NOTIFY mailroom_inbox` (payload `{"mailbox_id": …, "message_id": …}`, sent by
`mailroom.deliver_message` at commit) through mailroom.db.listen.Listener, and reads the inbox
only through the SQL API (`mailroom.list_messages`, authorized by the session token or owner).
A notification only wakes it; what is new is decided by listing the inbox. While the listener is
down (no listen URL, a transaction pooler, a lost connection) it polls every `poll_interval`, and
after every (re)connect it looks once, because notifications sent meanwhile are gone.

A notification names a mailbox id, which the watcher does not know at first: it learns it from
the first notified message that turns up in its own inbox, and from then on ignores the
notifications of other inboxes.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from typing import Any, TextIO

import psycopg

from mailroom.core.errors import Kind, UserError, db_user_error, describe_db_error, kind_of
from mailroom.core.log import get_logger
from mailroom.db.listen import Listener
from mailroom.db.reconnect import LazyConnection
from mailroom.inboxes import sqlapi

log = get_logger("inbox-watch")

CHANNEL = "mailroom_inbox"
PAGE = 500
REWIND = 50  # re-read this many already seen messages: a pinned clock can file a new one earlier

def summary_line(row: Any, as_json: bool) -> str:
    """One message of mailroom.inboxes.sqlapi.list_messages as a line."""
    message_id, received_at, subject = row.message_id, row.received_at, row.subject
    sender = row.from_header or row.envelope_from or ""
    if as_json:
        return json.dumps({"message_id": message_id, "received_at": received_at.isoformat(),
                           "from": sender, "subject": subject})
    return f"{message_id}\t{received_at.isoformat()}\t{sender}\t{subject or ''}"


class InboxWatcher:
    """Watch one inbox until stop(); see the module docstring."""

    def __init__(
        self,
        url: str,
        address: str,
        *,
        token: str | None = None,
        owner_type: str | None = None,
        owner_id: str | None = None,
        listen_url: str | None = None,
        poll_interval: float = 2.0,
        existing: bool = False,
        as_json: bool = False,
        out: TextIO | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self.url = url
        self.listen_url = listen_url
        self.auth = {"address": address, "session_token": token, "owner_type": owner_type, "owner_id": owner_id}
        self.poll_interval = poll_interval
        self.existing = existing
        self.as_json = as_json
        self.out = out or sys.stdout
        self.on_ready = on_ready or (lambda: None)
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.seen: set[int] = set()
        self.mailbox_id: int | None = None
        self._notified: dict[int, int] = {}  # message id -> mailbox id, heard since the last look
        self._lock = threading.Lock()
        self._db = LazyConnection(url, "mailroom-inbox-watch")
        self.listener: Listener | None = None

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()

    # -- notifications (listener thread) -------------------------------------------------------

    def _on_notify(self, _channel: str, payload: str) -> None:
        try:
            data: Any = json.loads(payload)
            mailbox_id, message_id = int(data["mailbox_id"]), int(data["message_id"])
        except (ValueError, KeyError, TypeError):
            self.wake.set()  # a payload it cannot read: look anyway
            return
        if self.mailbox_id is not None and mailbox_id != self.mailbox_id:
            return  # another inbox's mail
        with self._lock:
            self._notified[message_id] = mailbox_id
        self.wake.set()

    # -- reading -------------------------------------------------------------------------------

    def _new_messages(self) -> list[Any]:
        """The inbox's messages not printed yet, oldest first."""
        conn = self._db.get()
        offset = max(0, len(self.seen) - REWIND)
        fresh: list[Any] = []
        while True:
            rows = sqlapi.list_messages.rows(conn, **self.auth, limit=PAGE, offset=offset)
            fresh.extend(r for r in rows if r.message_id not in self.seen)
            if len(rows) < PAGE:
                return fresh
            offset += PAGE

    def _look(self, *, show: bool = True) -> None:
        with self._lock:
            notified, self._notified = self._notified, {}
        for row in self._new_messages():
            self.seen.add(row.message_id)
            if self.mailbox_id is None and row.message_id in notified:
                self.mailbox_id = notified[row.message_id]
            if show:
                print(summary_line(row, self.as_json), file=self.out, flush=True)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        """Print new messages until stop(). Authorization and closed inboxes end it (UserError)."""
        try:
            self._look(show=self.existing)  # the baseline; a wrong token or closed inbox fails here
        except psycopg.Error as exc:
            self._db.close()
            raise db_user_error(exc) from None
        self.listener = Listener(
            self.listen_url, [CHANNEL], name="mailroom-inbox-watch-listen", log=log,
            on_notify=self._on_notify, on_connect=self.wake.set,
            poll_hint=f"polling every {self.poll_interval:g}s",
        ).start()
        log.info("watching (%s)", "LISTEN " + CHANNEL if self.listen_url else "polling")
        self.on_ready()
        try:
            while not self.stop_event.is_set():
                # Listening: a notification wakes it (the timeout is only a safety net); else poll.
                listening = self.listener.listening
                self.wake.wait(self.poll_interval * (15 if listening else 1))
                self.wake.clear()
                if self.stop_event.is_set():
                    break
                try:
                    self._look()
                except UserError as exc:  # cannot connect: say so and try again at the next poll
                    log.warning("WARN: %s", exc)
                except psycopg.Error as exc:
                    self._db.close()
                    if kind_of(exc) is not Kind.UNAVAILABLE:
                        raise db_user_error(exc) from None
                    log.warning("WARN: reading the inbox failed: %s", describe_db_error(exc))
        finally:
            self.listener.stop()
            self._db.close()
