"""Test harness: a throwaway cluster per run, migrated databases, pg_prove, pytest.

    python -m mailroom.testing pgtap [FILE ...]   pgTAP files (default tests/pgtap/*.sql)
    python -m mailroom.testing all [PYTEST ARGS]  one cluster: pg_prove, then pytest on it

pytest reuses the cluster named by MAILROOM_TEST_CLUSTER_HOME when set (see tests/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from psycopg import sql

from mailroom.core.errors import UserError
from mailroom.db import cluster as embedded
from mailroom.db.connect import connect
from mailroom.db.migrate import migrate, project_root

CLUSTER_ENV = "MAILROOM_TEST_CLUSTER_HOME"


def start_cluster(prefix: str = "mailroom-test-") -> embedded.Cluster:
    """A new cluster in a fresh temporary directory, tuned for tests (no fsync)."""
    home = Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("MAILROOM_TEST_TMP", "/tmp")))
    return embedded.up(home, fast=True)


def stop_cluster(cluster: embedded.Cluster) -> None:
    cluster.destroy(embedded.find_bindir(), embedded.RunAs.detect())


def create_database(cluster: embedded.Cluster, name: str, *, template: str | None = None) -> str:
    with connect(cluster.url("postgres")) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        stmt = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            stmt += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        conn.execute(stmt)
    return cluster.url(name)


def drop_database(cluster: embedded.Cluster, name: str) -> None:
    with connect(cluster.url("postgres")) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def migrated_database(cluster: embedded.Cluster, name: str, *, pgtap: bool = False) -> str:
    url = create_database(cluster, name)
    migrate(url)
    if pgtap:
        with connect(url) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pgtap")
    return url


def pg_prove(cluster: embedded.Cluster, dbname: str, files: list[str]) -> int:
    exe = shutil.which("pg_prove")
    if exe is None:
        raise UserError("pg_prove not found: apt-get install libtap-parser-sourcehandler-pgtap-perl postgresql-15-pgtap")
    argv = [exe, "--ext", ".sql", "-h", str(cluster.home), "-p", str(cluster.port), "-U", "postgres", "-d", dbname, *files]
    return subprocess.call(argv)


def _pgtap_files(args: list[str]) -> list[str]:
    if args:
        return args
    return [str(p) for p in sorted((project_root() / "tests" / "pgtap").glob("*.sql"))]


def run_pgtap(cluster: embedded.Cluster, files: list[str]) -> int:
    files = _pgtap_files(files)
    if not files:
        print("no pgTAP files", file=sys.stderr)
        return 0
    migrated_database(cluster, "mailroom_pgtap", pgtap=True)
    return pg_prove(cluster, "mailroom_pgtap", files)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("pgtap", "all"):
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    cluster = start_cluster()
    try:
        if command == "pgtap":
            return run_pgtap(cluster, rest)
        rc = run_pgtap(cluster, [])
        env = dict(os.environ, **{CLUSTER_ENV: str(cluster.home)})
        pytest_rc = subprocess.call([sys.executable, "-m", "pytest", *rest], env=env)
        return rc or pytest_rc
    finally:
        stop_cluster(cluster)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as exc:
        print(f"mailroom: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
