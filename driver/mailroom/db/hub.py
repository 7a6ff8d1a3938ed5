"""The one LISTEN of a server process, fanned out to every open event stream, long poll and MCP wait.

`Hub` runs one mailroom.db.listen.Listener (one database connection for the whole process, on the
direct listen URL) on the channel `mailroom_inbox`, whose payloads are ids only
(`{"mailbox_id": …, "message_id": …}`, sql/21_delivery.sql). Each waiter registers the mailbox id
it follows and gets an asyncio.Event set on every delivery to that mailbox, and on every
(re)connect of the listener (what was announced meanwhile is gone: look again). While the listener
is not listening (a transaction pooler, a lost link, `--listen-url none`), waiters time out every
`poll_interval` and look anyway: the polling fallback.

The hub also fills the search vector of the messages it hears about (`index_messages`, sql/27),
batched, after their delivery committed: never on the accept path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable

from mailroom.core.log import get_logger
from mailroom.db.listen import Listener

log = get_logger("http")

CHANNEL = "mailroom_inbox"


class Hub:
    def __init__(
        self,
        listen_url: str | None,
        *,
        poll_interval: float = 2.0,
        indexer: Callable[[list[int]], Awaitable[None]] | None = None,
    ) -> None:
        self.listen_url = listen_url
        self.poll_interval = poll_interval
        self.indexer = indexer
        self._waiters: dict[int, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: Listener | None = None
        self._to_index: list[int] = []
        self._index_task: asyncio.Task | None = None

    @property
    def listening(self) -> bool:
        return self._listener is not None and self._listener.listening

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._listener = Listener(
            self.listen_url, [CHANNEL], name="mailroom-http", log=log,
            on_notify=self._on_notify, on_connect=self._on_connect,
            poll_hint=f"event streams poll every {self.poll_interval:g}s",
        ).start()

    async def stop(self) -> None:
        if self._listener is not None:
            await asyncio.to_thread(self._listener.stop)
        if self._index_task is not None:
            self._index_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._index_task
        for events in self._waiters.values():
            for event in events:
                event.set()

    def wait_timeout(self, idle: float) -> float:
        """How long a waiter sleeps before it looks again: `idle` while listening, else the poll interval."""
        return idle if self.listening else min(idle, self.poll_interval)

    def subscribe(self, mailbox_id: int) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters.setdefault(mailbox_id, set()).add(event)
        return event

    def unsubscribe(self, mailbox_id: int, event: asyncio.Event) -> None:
        events = self._waiters.get(mailbox_id)
        if events is not None:
            events.discard(event)
            if not events:
                del self._waiters[mailbox_id]

    @property
    def streams(self) -> int:
        return sum(len(v) for v in self._waiters.values())

    # -- called from the listener's thread -------------------------------------------------------

    def _on_notify(self, channel: str, payload: str) -> None:
        try:
            note = json.loads(payload)
            mailbox_id, message_id = int(note["mailbox_id"]), int(note["message_id"])
        except (ValueError, KeyError, TypeError):
            return
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._delivered, mailbox_id, message_id)

    def _on_connect(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake_all)

    # -- on the event loop -----------------------------------------------------------------------

    def _delivered(self, mailbox_id: int, message_id: int) -> None:
        for event in self._waiters.get(mailbox_id, ()):
            event.set()
        if self.indexer is not None:
            self._to_index.append(message_id)
            if self._index_task is None or self._index_task.done():
                self._index_task = asyncio.ensure_future(self._index())

    def _wake_all(self) -> None:
        for events in self._waiters.values():
            for event in events:
                event.set()

    async def _index(self) -> None:
        """Fill search vectors in batches of up to 1000 ids, a little after they were heard."""
        assert self.indexer is not None
        while self._to_index:
            await asyncio.sleep(0.05)  # let a burst of deliveries gather into one call
            batch, self._to_index = self._to_index[:1000], self._to_index[1000:]
            try:
                await self.indexer(batch)
            except Exception as exc:  # noqa: BLE001 - search matches unfilled messages anyway
                log.warning("filling search vectors of %d message(s) failed: %s", len(batch), type(exc).__name__)
