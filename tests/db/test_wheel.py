"""Issue 20 item 1: the package carries its SQL. Build the sdist and the wheel from this checkout (the
wheel from the sdist, as `make wheel` does), install the wheel into a fresh virtualenv in a
temporary directory, and run one whole activation with it, away from any checkout: the working
directory is the temporary one, PYTHONPATH and MAILROOM_HOME are unset, nothing of the checkout is
importable. The database owner is a non-superuser (the README's install); each worker runs as its
own login."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import psycopg
import pytest

from mailroom import __version__, testing

ROOT = Path(__file__).resolve().parents[2]
OWNER = "mr_wheel_owner"

pytestmark = pytest.mark.slow


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{argv}: {proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A virtualenv with only the wheel (and its dependencies) in it; its bin/ directory."""
    tmp = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "build", "--outdir", str(tmp / "dist"), str(ROOT)], timeout=600, cwd=tmp)
    wheels = list((tmp / "dist").glob("mailroom-*.whl"))
    assert len(wheels) == 1, wheels
    _run([sys.executable, "-m", "venv", str(tmp / "venv")], timeout=300, cwd=tmp)
    _run([str(tmp / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", str(wheels[0])], timeout=600, cwd=tmp)
    return tmp / "venv" / "bin"


def test_the_wheel_and_the_sdist_carry_every_package_and_all_the_sql(installed):
    dist = installed.parent.parent / "dist"
    names = set(zipfile.ZipFile(next(dist.glob("*.whl"))).namelist())
    packages = {str(p.parent.relative_to(ROOT / "driver")) for p in (ROOT / "driver" / "mailroom").rglob("__init__.py")}
    missing = {p for p in packages if f"{p}/__init__.py" not in names}
    assert not missing, f"driver packages missing from the wheel (list them in pyproject.toml): {missing}"
    for folder, package in (("migrations", "mailroom/db/migrations"), ("sql", "mailroom/db/sql")):
        files = {p.name for p in (ROOT / folder).glob("*.sql")}
        assert files and {f"{package}/{f}" for f in files} <= names, f"{folder}/ is not all in the wheel"
    # data-only folders of the driver: the page's static files, the HTML check's data
    for folder in ("http/static", "checks/data"):
        files = {p.name for p in (ROOT / "driver" / "mailroom" / folder).iterdir() if p.is_file()}
        assert files and {f"mailroom/{folder}/{f}" for f in files} <= names, f"mailroom/{folder} is not all in the wheel"
    # the pgTAP suite `mailroom db verify` runs (issue 47), its fixtures included
    suite = {p.relative_to(ROOT / "tests" / "pgtap").as_posix() for p in (ROOT / "tests" / "pgtap").rglob("*.sql")}
    assert suite and {f"mailroom/db/pgtap/{f}" for f in suite} <= names, "tests/pgtap is not all in the wheel"
    sdist = subprocess.run(["tar", "tzf", str(next(dist.glob("*.tar.gz")))], capture_output=True, text=True).stdout
    assert re.search(r"/migrations/0001_foundation\.sql$", sdist, re.M) and re.search(r"/sql/00_clock\.sql$", sdist, re.M)


def test_one_activation_from_the_wheel_outside_the_checkout(installed, pg, tmp_path):
    name = f"wheel_{os.getpid()}"
    with psycopg.connect(pg.url("postgres"), autocommit=True) as dba:
        if not dba.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (OWNER,)).fetchone():
            dba.execute(f"CREATE ROLE {OWNER} LOGIN CREATEROLE")
        dba.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        dba.execute(f"CREATE DATABASE {name} OWNER {OWNER}")
    url = pg.url(name)
    procs: list[subprocess.Popen] = []
    try:
        base_env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("MAILROOM_", "PYTHON", "VIRTUAL_ENV", "PG"))}
        base_env["PATH"] = f"{installed}:/usr/bin:/bin"

        def env(login: str | None, **extra: str) -> dict[str, str]:
            return {**base_env, "MAILROOM_DATABASE_URL": testing.as_login(url, login), **extra}

        def mailroom(*args: str, login: str | None = None, **extra: str) -> str:
            return _run([str(installed / "mailroom"), *args], env=env(login, **extra), cwd=tmp_path, timeout=120).stdout

        where = _run([str(installed / "python"), "-c", "import mailroom, sys; print(mailroom.__file__); print(sys.path)"],
                     env=base_env, cwd=tmp_path, timeout=60).stdout
        assert where.startswith(str(installed.parent)), where
        assert str(ROOT) not in where, f"the checkout is importable: {where}"

        schema = max(int(p.name[:4]) for p in (ROOT / "migrations").glob("*.sql"))
        assert mailroom("--version") == f"mailroom {__version__} (schema {schema})\n"

        # migrate as the non-superuser owner; what the migrations say is printed (0080 cannot set a
        # server setting as a non-superuser: it says so)
        out = _run([str(installed / "mailroom"), "db", "migrate"], env=env(OWNER), cwd=tmp_path, timeout=300)
        assert "could not set log_parameter_max_length" in out.stderr, out.stderr
        testing.ensure_test_logins(url)
        status = mailroom("db", "status", login="mr_admin")
        assert f"schema:   {schema} (" in status and "pending:  none" in status, status

        inbox_port = testing._free_port()
        with psycopg.connect(testing.as_login(url, "mr_admin"), autocommit=True) as admin:
            domain = admin.execute("SELECT mailroom.setting('inbox.domain')").fetchone()[0]
            admin.execute("SELECT mailroom.upsert_sender('wheel', %s, '127.0.0.1', %s)", (f"noreply@{domain}", inbox_port))
            admin.execute("SELECT mailroom.set_setting('collector.sender', 'wheel')")
            admin.execute("SELECT mailroom.set_setting('collector.link_base_url', 'https://app.example')")

        # an inbox (the CLI) and an account whose email is that inbox
        created = dict(line.split(": ", 1) for line in mailroom("inbox", "create", login="mr_app").splitlines())
        address, session = created["address"], created["session_token"]
        with psycopg.connect(testing.as_login(url, "mr_app"), autocommit=True) as app:
            account = app.execute("SELECT mailroom.create_account(%s, 'wheel-user')", (address,)).fetchone()[0]

        logs = {}
        for worker, login, args in (("inbox", "mr_inbound", ["inbox", "serve", "--port", str(inbox_port)]),
                                    ("collect", "mr_collector", ["collect", "--enqueue"]),
                                    ("send", "mr_sender", ["send", "--poll-interval", "0.5s"])):
            logs[worker] = tmp_path / f"{worker}.log"
            with open(logs[worker], "w") as log:
                procs.append(subprocess.Popen([str(installed / "mailroom"), *args], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                              stderr=log, env=env(login, MAILROOM_BATCH_TIMEOUT="100ms")))
            if worker == "inbox":  # the relay is up before anything is sent to it
                deadline = time.monotonic() + 60
                while "listening on" not in logs[worker].read_text() and time.monotonic() < deadline:
                    assert procs[-1].poll() is None, logs[worker].read_text()
                    time.sleep(0.1)

        def worker_logs() -> str:
            return "\n".join(f"--- {w}\n{log.read_text()[-1500:]}" for w, log in logs.items())

        with psycopg.connect(testing.as_login(url, "mr_app"), autocommit=True) as app:
            try:
                # the procedure commits between polls (a wait of more than a minute)
                message_id = app.execute(
                    "CALL mailroom.await_message(%s, %s, '120 seconds', 'Activate%%', NULL, NULL, NULL)",
                    (address, session)).fetchone()[0]
            except psycopg.Error as exc:
                raise AssertionError(f"no activation email: {exc.diag.message_primary}\n{worker_logs()}") from None
            link = app.execute("SELECT mailroom.extract_link(%s, %s, %s, '%%/activate%%')",
                               (address, session, message_id)).fetchone()[0]
            signed = link.split("token=", 1)[1]
            # consume the link as the application would (no key: the keyring verifies)
            app.execute("SELECT * FROM mailroom.consume_token(p_signed => %s)", (signed,))
        with psycopg.connect(url, autocommit=True) as dba:
            assert dba.execute("SELECT status FROM mailroom.accounts WHERE id = %s", (account,)).fetchone()[0] == "active"

        doctor = subprocess.run([str(installed / "mailroom"), "doctor"], env=env("mr_collector"), cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert "FAIL" not in doctor.stdout, doctor.stdout
        assert re.search(r"^OK +migrations: schema \d+ .*expected by mailroom", doctor.stdout, re.M), doctor.stdout
        # the whole shipped suite, from the wheel, outside the checkout, on this used database beside its
        # running workers (issue 47's "done when"): every file passes, none is skipped
        with psycopg.connect(url, autocommit=True) as dba:
            dba.execute("CREATE EXTENSION IF NOT EXISTS pgtap")
        verified = subprocess.run([str(installed / "mailroom"), "db", "verify"],
                                  env=env(None), cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert verified.returncode == 0 and verified.stdout.rstrip().endswith("Result: PASS"), verified.stdout[-3000:]
        assert "skipped" not in verified.stdout, verified.stdout[-3000:]
        for worker, log in logs.items():
            assert "Traceback" not in log.read_text(), f"{worker}: {log.read_text()[-2000:]}"
        assert all(p.poll() is None for p in procs), {w: p.returncode for w, p in zip(logs, procs, strict=True)}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        testing.drop_database(pg, name)
