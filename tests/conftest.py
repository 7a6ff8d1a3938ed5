"""Shared fixtures: one real PostgreSQL cluster per run, one fresh database per test.

- `pg`: the run's cluster (reused from MAILROOM_TEST_CLUSTER_HOME when `make test` started one).
- `private_cluster`: a cluster of the test's own, for tests that stop and start the server.
- `template_db`: a database migrated from migrations/ + sql/ once per run.
- `db_url`: a new database cloned from the template for each test (CREATE DATABASE … TEMPLATE).
- `conn`: an autocommit psycopg connection to it.
- `cli` / `cli_popen`: the real `python -m mailroom` as a subprocess pointed at `db_url`, logged in
  as the command's least-privilege role (mailroom.testing.TEST_LOGINS).
- `pooler`: a real PgBouncer in transaction mode in front of `pg`, once per run
  (mailroom.testing.PgBouncer); `pooler.pooled_url(url)` is the same database and user through it.
- `pooled_db_url`: `db_url` through the pooler.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from mailroom import testing
from mailroom.db import cluster as embedded

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def pg() -> Iterator[embedded.Cluster]:
    home = os.environ.get(testing.CLUSTER_ENV)
    if home:
        cluster = embedded.Cluster(Path(home))
        assert cluster.is_running(), f"{testing.CLUSTER_ENV}={home} is not a running cluster"
        yield cluster
        return
    cluster = testing.start_cluster()
    try:
        yield cluster
    finally:
        testing.stop_cluster(cluster)


@pytest.fixture
def private_cluster() -> Iterator[embedded.Cluster]:
    """A cluster of the test's own, for tests that stop and start the server."""
    cluster = testing.start_cluster(prefix="mailroom-private-")
    try:
        yield cluster
    finally:
        testing.stop_cluster(cluster)


@pytest.fixture(scope="session")
def template_db(pg: embedded.Cluster) -> Iterator[str]:
    name = f"mailroom_tpl_{os.getpid()}"
    testing.migrated_database(pg, name)
    yield name
    testing.drop_database(pg, name)


@pytest.fixture
def db_url(pg: embedded.Cluster, template_db: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = testing.create_database(pg, name, template=template_db)
    yield url
    testing.drop_database(pg, name)


@pytest.fixture(scope="session")
def pooler(pg: embedded.Cluster) -> Iterator[testing.PgBouncer]:
    """PgBouncer, pool_mode = transaction, 3 server connections per database and user."""
    bouncer = testing.PgBouncer(pg).start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture
def pooled_db_url(pooler: testing.PgBouncer, db_url: str) -> str:
    return pooler.pooled_url(db_url)


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True) as connection:
        yield connection


def _cli_env(db_url: str | None, env: dict[str, str] | None, args: tuple[str, ...] = ()) -> dict[str, str]:
    """The command's environment; its database URLs log in as the command's least-privilege role
    (mailroom.testing.login_for: collect as mr_collector, send as mr_sender, …), never the superuser."""
    merged = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    merged["PYTHONUNBUFFERED"] = "1"
    if db_url is not None:
        merged["MAILROOM_DATABASE_URL"] = db_url
    merged.update(env or {})
    return testing.driver_env(merged, args)


@pytest.fixture
def cli(db_url: str) -> Callable[..., subprocess.CompletedProcess]:
    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60, input: str | None = None,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "mailroom", *args],
            env=_cli_env(db_url, env, args),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            cwd=cwd,
        )

    return run


@pytest.fixture
def cli_popen(db_url: str) -> Iterator[Callable[..., subprocess.Popen]]:
    procs: list[subprocess.Popen] = []

    def start(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        proc = subprocess.Popen([sys.executable, "-m", "mailroom", *args], env=_cli_env(db_url, env, args), **kwargs)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
