"""Fixtures of the `citus` tests: a coordinator and two workers (mailroom.db.citus) for the module.

Each test process (an xdist worker) starts one topology, which its modules share (starting three
nodes is a third of a module's setup); each module gets its own database on it, migrated through the
coordinator (so distributed by sql/citus/); Citus cannot clone a distributed database from a
template, so tests of a module share it and keep their rows apart (their own mailboxes, senders,
accounts). Skipped with a
reason when the Citus extension is not installed (../shared/citus/build.sh installs it; CI runs it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from mailroom import testing
from mailroom.db import citus as citus_db

pytestmark = pytest.mark.citus


@pytest.fixture(scope="session")
def citus() -> Iterator[citus_db.Topology]:
    if not citus_db.citus_installed():
        pytest.skip("the Citus extension is not installed (../shared/citus/build.sh)")
    topology = testing.start_citus(workers=2)
    try:
        yield topology
    finally:
        testing.stop_citus(topology)


@pytest.fixture(scope="module")
def citus_url(citus: citus_db.Topology) -> str:
    return testing.citus_database(citus, "mailroom")


@pytest.fixture
def cconn(citus_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(citus_url, autocommit=True) as connection:
        yield connection


def _env(url: str, args: tuple[str, ...], env: dict[str, str] | None) -> dict[str, str]:
    merged = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    merged["PYTHONUNBUFFERED"] = "1"
    merged["MAILROOM_DATABASE_URL"] = url
    merged.update(env or {})
    return testing.driver_env(merged, args)


@pytest.fixture
def ccli(citus_url: str) -> Callable[..., subprocess.CompletedProcess]:
    """`python -m mailroom …` against the coordinator, as the command's least-privilege login."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60, cwd: str | Path | None = None):
        return subprocess.run([sys.executable, "-m", "mailroom", *args], env=_env(citus_url, args, env),
                              capture_output=True, text=True, timeout=timeout, cwd=cwd)

    return run


@pytest.fixture
def ccli_popen(citus_url: str) -> Iterator[Callable[..., subprocess.Popen]]:
    procs: list[subprocess.Popen] = []

    def start(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        proc = subprocess.Popen([sys.executable, "-m", "mailroom", *args], env=_env(citus_url, args, env), **kwargs)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _remote_commands(cconn, statement: str, params: tuple = (), *, local: bool = False) -> tuple[list, list[str]]:
    """A statement's rows and the commands the coordinator sent the workers for it
    (citus.log_remote_commands; what runs on the coordinator itself is not sent); local=True: those
    too, in order, each as "locally: <statement>" (Citus' local execution of a statement on a
    coordinator's shard or on an intermediate result)."""
    seen: list[str] = []

    def heard(diag) -> None:
        seen.append(diag.message_primary or "")

    cconn.add_notice_handler(heard)
    cconn.execute("SET citus.log_remote_commands = on")
    cconn.execute("SET client_min_messages = log")
    try:
        rows = cconn.execute(statement, params).fetchall()
    finally:
        cconn.execute("RESET citus.log_remote_commands")
        cconn.execute("RESET client_min_messages")
        cconn.remove_notice_handler(heard)
    if local:
        return rows, [m.removeprefix("issuing ").replace("executing the command locally:", "locally:", 1)
                      for m in seen if m.startswith(("issuing ", "executing the command locally:"))]
    return rows, [m.removeprefix("issuing ") for m in seen if m.startswith("issuing ")]


@pytest.fixture
def remote_commands() -> Callable[..., tuple[list, list[str]]]:
    """_remote_commands: a statement's rows and what the coordinator sent the workers for it."""
    return _remote_commands
