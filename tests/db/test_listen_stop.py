"""A Listener's stop() wakes its read at once, and the reads still deliver every notification.

The listening thread waits on its connection in slices (READ_SLICE); stop() used to wait out the slice
in progress, so every worker's stop took up to half a second more than its work: `send --until-idle`
on an empty queue took 0.8 s of which 0.5 s was the listener's join. Here the slice is made long, so
a stop that waits it out fails the bound.
"""

from __future__ import annotations

import logging
import threading
import time

import psycopg
import pytest

from mailroom import testing
from mailroom.db import listen
from mailroom.db.listen import Listener

LOG = logging.getLogger("mailroom.test.listen")


@pytest.fixture
def sender_url(db_url: str) -> str:
    return testing.as_login(db_url, "mr_sender")  # a worker's role: LISTEN, mailroom.listen, await_writers


def test_stop_wakes_the_read_at_once(monkeypatch, sender_url):
    monkeypatch.setattr(listen, "READ_SLICE", 30.0)
    listener = Listener(sender_url, ["outbound_ready"], name="test-stop", log=LOG).start()
    assert listener.wait_listening(20)
    time.sleep(0.2)  # the thread is in its (30 s) read
    started = time.monotonic()
    listener.stop(timeout=5)
    took = time.monotonic() - started
    assert not listener._thread.is_alive() and took < 1.5, took
    assert listener._wake is None  # the wake pipe is closed with the thread


def test_notifications_arrive_between_and_during_reads(monkeypatch, db_url, sender_url):
    monkeypatch.setattr(listen, "READ_SLICE", 30.0)
    heard: list[str] = []
    got = threading.Event()

    def on_notify(_channel: str, payload: str) -> None:
        heard.append(payload)
        if len(heard) == 3:
            got.set()

    listener = Listener(sender_url, ["outbound_ready"], name="test-read", log=LOG, on_notify=on_notify).start()
    try:
        assert listener.wait_listening(20)
        with psycopg.connect(db_url, autocommit=True) as conn:
            for n in range(3):
                conn.execute("SELECT pg_notify('outbound_ready', %s)", (str(n),))
                time.sleep(0.05 * n)
        assert got.wait(5), heard  # each within the 30 s read, not after it
        assert heard == ["0", "1", "2"]
    finally:
        listener.stop()


def test_a_connection_past_descriptor_1024_is_heard(db_url, sender_url):
    """A server holding many sockets (the HTTP face's waits, inbox sessions) gives the listener's
    connection a descriptor past select()'s 1,024: the read still waits on it (poll)."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit of open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    fillers = []
    try:
        while not fillers or fillers[-1] < 1030:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        heard = threading.Event()
        listener = Listener(sender_url, ["outbound_ready"], name="test-fd", log=LOG,
                            on_notify=lambda _c, _p: heard.set()).start()
        try:
            assert listener.wait_listening(20)
            with psycopg.connect(db_url, autocommit=True) as conn:
                conn.execute("SELECT pg_notify('outbound_ready', 'x')")
            assert heard.wait(5)
            assert listener._thread.is_alive()
        finally:
            listener.stop()
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
