"""The guard of the hot GETs' fast paths (mailroom.http.app: _HotGets, before the middleware stack, and
_fast_get, in the route, when the access log or CORS is on): with the fast paths on, a plain GET
…/messages or …/wait is served by the one the configuration chooses, so a Starlette or FastAPI on which
one silently stops serving (a route's `app` no longer called, the middleware order changed) fails here;
with MAILROOM_FAST_PATHS=off, neither serves. And _fast_get answers as the route does.

In process (the app on a real database, its lifespan run here, httpx's ASGI transport as the client), so
the counts of mailroom.core.fastpaths are this process's.
"""

from __future__ import annotations

import asyncio
import collections

import httpx
import pytest

from mailroom.core import fastpaths
from mailroom.http.app import create_app
from mailroom.http.state import HttpConfig
from mailroom.testing import as_login

CONFIGS = {"plain": {}, "access_log": {"access_log": True}, "cors": {"cors_origins": ["https://app.example"]}}
EXPECTED = {"plain": "http.hot_gets", "access_log": "http.fast_get", "cors": "http.fast_get"}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_plain_hot_get_is_served_by_its_fast_path_exactly_when_switched_on(db_url, deliver, name):
    app = create_app(HttpConfig(database_url=as_login(db_url, "mr_http"), **CONFIGS[name]))

    async def run() -> tuple:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app, client=("127.0.0.1", 1)), base_url="http://127.0.0.1") as client:
            created = await client.post("/api/v1/mailboxes")
            assert created.status_code == 201, created.text
            box = created.json()
            deliver(box["address"], "one", "body")
            auth = {"Authorization": f"Bearer {box['session_token']}"}
            path = f"/api/v1/mailboxes/{box['address']}"
            before = collections.Counter(fastpaths.served)
            listed = await client.get(path + "/messages?limit=5", headers=auth)
            waited = await client.get(path + "/wait?timeout=1", headers=auth)
            served = collections.Counter(fastpaths.served) - before
            # the way FastAPI parses (a sign): never a fast path
            declared = await client.get(path + "/messages?limit=%2B5", headers=auth)
            assert collections.Counter(fastpaths.served) - before == served
            return listed, waited, declared, served

    listed, waited, declared, served = asyncio.run(run())
    assert listed.status_code == waited.status_code == declared.status_code == 200, (listed.text, waited.text)
    assert [m["subject"] for m in listed.json()] == ["one"] and waited.json()["subject"] == "one"
    assert listed.content == declared.content
    for header in ("content-type", "content-security-policy", "x-content-type-options", "x-frame-options"):
        assert listed.headers.get(header) == declared.headers.get(header), header
    assert served == (collections.Counter({EXPECTED[name]: 2}) if fastpaths.enabled() else collections.Counter())
