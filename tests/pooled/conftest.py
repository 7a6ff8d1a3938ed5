"""Fixtures of the pooled tests: every driver talks to PostgreSQL through a real PgBouncer in
transaction mode (tests/conftest.py `pooler`), LISTEN goes direct where a test says so.

The helpers of the other areas' tests are reused: their folders go on sys.path here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for area in ("accounts", "outbound", "inboxes"):
    if str(HERE.parent / area) not in sys.path:
        sys.path.append(str(HERE.parent / area))

from pooled_support import WorkerUrls, worker_urls  # noqa: E402


@pytest.fixture
def urls(pooler, db_url) -> Callable[[str], WorkerUrls]:
    """urls(role): the database URL through the pooler and the direct listen URL for that role."""
    return lambda role: worker_urls(pooler, db_url, role)


@pytest.fixture
def workers():
    """workers(args, env) starts a Worker (pooled_support); every one is killed after the test."""
    from pooled_support import Worker

    started: list[Worker] = []

    def start(*args: str, **kw) -> Worker:
        w = Worker(list(args), **kw)
        started.append(w)
        return w

    yield start
    for w in started:
        w.kill()
