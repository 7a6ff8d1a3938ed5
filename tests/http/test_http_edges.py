"""The HTTP face's edges under attack and faults (issue 34, items 1 and 2).

- A caller's pattern is input: the reproduction of the review (`(.*)(.*)(.*)\\3\\2\\1$` over a
  400-character text), sent 16 times at once, is refused (400, MR010: never run, so never 504) and
  another inbox's GET, sent with them, still answers.
- Every statement runs under the server's statement timeout (SET LOCAL per transaction): a request
  held past it answers 504, once; a statement the server cancelled or terminated is never run again.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import urllib.parse

import psycopg

from mailroom.testing import as_login

EVIL = "(.*)(.*)(.*)\\3\\2\\1$"


def _create(server) -> dict:  # noqa: ANN001
    resp = server.request("POST", "/api/v1/mailboxes")
    assert resp.status == 201, resp.body
    return resp.json()


def _dbname(db_url: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]


def _http_backends(admin: psycopg.Connection, db_url: str, *, waiting: bool = False) -> int:
    return admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'mailroom-http' AND datname = %s"
        " AND (NOT %s OR wait_event_type = 'Lock')", (_dbname(db_url), waiting)).fetchone()[0]


def test_the_reviews_regex_16_at_once_is_refused_and_others_are_served(server, deliver):
    victim = _create(server)
    other = _create(server)
    message_id = deliver(victim["address"], "hello", "a" * 400 + "b")
    deliver(other["address"], "plain", "plain text")
    path = (f"/api/v1/mailboxes/{victim['address']}/messages/{message_id}/code?pattern="
            + urllib.parse.quote(EVIL, safe=""))

    # All 17 requests leave together (a barrier, not a clock): the other inbox's GET is in flight with the
    # 16 hostile ones. Had a hostile pattern run, its statement would hold a pooled connection until the
    # server's statement timeout and answer 504 (MR timeout), so the refusals below are exact, and the other
    # GET is answered 200 (no wall-clock bound: on a loaded 2-core machine it only measured the machine).
    go = threading.Barrier(17)

    def evil() -> tuple[int, str]:
        go.wait(timeout=30)
        resp = server.request("GET", path, token=victim["session_token"], timeout=60)
        return resp.status, resp.error_code if resp.status >= 400 else ""

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(evil) for _ in range(16)]
        go.wait(timeout=30)
        resp = server.request("GET", f"/api/v1/mailboxes/{other['address']}/messages", token=other["session_token"])
        results = [f.result() for f in futures]
    assert resp.status == 200 and [m["subject"] for m in resp.json()] == ["plain"], (resp.status, resp.body)
    assert results == [(400, "MR010")] * 16, results
    assert "Traceback" not in server.log()


def test_a_bounded_pattern_still_extracts(server, deliver):
    box = _create(server)
    message_id = deliver(box["address"], "your code", "Your code is ABC-12345 today")
    path = (f"/api/v1/mailboxes/{box['address']}/messages/{message_id}/code?pattern="
            + urllib.parse.quote("ABC-([0-9]{5})", safe=""))
    resp = server.request("GET", path, token=box["session_token"])
    assert resp.status == 200 and resp.json()["code"] == "12345", resp.body


def test_a_statement_past_the_timeout_answers_504_once(start_server, pg, db_url):
    server = start_server("--statement-timeout", "1s")
    box = _create(server)
    with psycopg.connect(pg.url(_dbname(db_url)), autocommit=True) as admin, \
            psycopg.connect(pg.url(_dbname(db_url))) as locker:
        # every read of the inboxes waits behind this lock, until the statement timeout ends it
        locker.execute("LOCK TABLE mailroom.mailboxes IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        resp = server.request("GET", f"/api/v1/mailboxes/{box['address']}", token=box["session_token"], timeout=30)
        seconds = time.monotonic() - started
        assert resp.status == 504 and resp.json()["error"]["code"] == "57014", resp.body
        assert seconds < 4, f"the statement timeout took {seconds:.1f}s: was it retried?"
        time.sleep(0.3)
        assert _http_backends(admin, db_url, waiting=True) == 0, "a cancelled statement was run again"
        locker.rollback()
    assert server.request("GET", f"/api/v1/mailboxes/{box['address']}", token=box["session_token"]).status == 200


def test_a_terminated_statement_answers_503_and_is_not_run_again(start_server, pg, db_url):
    server = start_server("--statement-timeout", "30s")
    box = _create(server)
    with psycopg.connect(pg.url(_dbname(db_url)), autocommit=True) as admin, \
            psycopg.connect(pg.url(_dbname(db_url))) as locker:
        locker.execute("LOCK TABLE mailroom.mailboxes IN ACCESS EXCLUSIVE MODE")
        answer: list = []
        thread = threading.Thread(target=lambda: answer.append(server.request(
            "GET", f"/api/v1/mailboxes/{box['address']}", token=box["session_token"], timeout=30)))
        thread.start()
        deadline = time.monotonic() + 10
        while _http_backends(admin, db_url, waiting=True) == 0:
            assert time.monotonic() < deadline, "the request never reached the lock"
            time.sleep(0.05)
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'mailroom-http'"
                      " AND wait_event_type = 'Lock' AND datname = %s", (_dbname(db_url),))
        thread.join(10)
        assert answer and answer[0].status == 503, answer and answer[0].body
        assert answer[0].headers.get("retry-after", "").isdigit()
        time.sleep(0.3)
        assert _http_backends(admin, db_url, waiting=True) == 0, "a terminated statement was run again"
        locker.rollback()
    assert "Traceback" not in server.log()


def test_the_app_role_is_bounded_too(db_url):
    # mailroom_app reaches extract_code in SQL: the same bound applies there
    with psycopg.connect(as_login(db_url, "mr_app"), autocommit=True) as app:
        try:
            app.execute("SELECT mailroom.extract_code('x@example.test', 't', 1, %s)", (EVIL,))
        except psycopg.Error as exc:
            assert exc.sqlstate == "MR010"
        else:
            raise AssertionError("the pattern was not refused")
