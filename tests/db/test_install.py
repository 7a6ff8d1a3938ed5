"""README "Install on an existing server", followed literally on a fresh cluster: a non-superuser
database owner with CREATEROLE migrates, the logins it creates can do their job and nothing else."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def _install_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("<!-- install:begin -->"):text.index("<!-- install:end -->")]
    match = re.search(r"```sh\n(.*?)```", section, re.S)
    assert match, "README has the install block"
    return match.group(1)


def test_readme_install_as_a_non_superuser_owner(private_cluster):
    home, port = str(private_cluster.home), str(private_cluster.port)
    script = _install_block().replace("host=db.internal", f"host={home} port={port}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAILROOM_", "PG"))}
    env.update(PGHOST=home, PGPORT=port, PGUSER="postgres", PGDATABASE="postgres",
               PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '')}")
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env, capture_output=True, text=True,
                         timeout=180, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAIL" not in out.stdout, out.stdout  # the doctor's lines, as the collector's login
    # issue 21 item 9: the owner may not set log_parameter_max_length, and migrate says so
    assert "migrations/0080_log_parameters.sql: NOTICE: mailroom: could not set log_parameter_max_length = 0" \
        in out.stderr, out.stderr
    # issue 23: the doctor does not warn about the ledger for a worker login on a correct install
    assert "OK    migrations: schema" in out.stdout, out.stdout

    def url(user: str) -> str:
        return f"host={home} port={port} dbname=mail user={user}"

    with psycopg.connect(url("postgres"), autocommit=True) as dba:
        assert dba.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'mail_owner'").fetchone()[0] is False
        owners = {o for (o,) in dba.execute(
            "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class WHERE relnamespace = 'mailroom'::regnamespace")}
        assert owners == {"mailroom_owner"}
        assert dba.execute("SELECT count(*) FROM pg_extension WHERE extname = 'dblink'").fetchone()[0] == 0
    with psycopg.connect(url("myapp"), autocommit=True) as app:
        assert app.execute("SELECT mailroom.create_account('first@example.test', 'first')").fetchone()[0] > 0
        try:
            app.execute("SELECT secret FROM mailroom.tokens")
            raise AssertionError("the application login read the tokens table")
        except psycopg.errors.InsufficientPrivilege:
            pass
    with psycopg.connect(url("collector"), autocommit=True) as collector:
        rows = collector.execute("SELECT login FROM mailroom.dequeue_tokens(10)").fetchall()
        assert rows == [("first",)]
