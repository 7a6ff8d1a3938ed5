"""Upgrading from the previous release for real, and the expand/contract rule (CONTRIBUTING).

The previous release is installed from its own bundle (tests/db/releases/mailroom-0.1.0.sql, what
its `db migrate --print --offline` printed: migrations AND its sql/ pass), as the README's
non-superuser owner. Then this release's `db migrate` upgrades it, and:
- the result is the committed schema snapshot, the same as a fresh install;
- every function the previous release let a runtime role call can still be called the way that
  release's workers call it (named arguments with their types, with and without the defaulted
  ones), by that role, with the same result columns: workers of the previous release keep working
  against the new schema until they are restarted. A function may go only if the previous
  release's comment on it begins with "Deprecated" (the contract step, one release later).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from mailroom import testing
from mailroom.db import migrate, snapshot

HERE = Path(__file__).resolve().parent
PREVIOUS = HERE / "releases" / "mailroom-0.1.0.sql"
OWNER = "mr_install_owner"

# the test login that acts as each group role
LOGIN_OF = {"mailroom_app": "mr_app", "mailroom_http": "mr_http", "mailroom_collector": "mr_collector",
            "mailroom_sender": "mr_sender", "mailroom_inbound": "mr_inbound", "mailroom_monitor": "mr_monitor",
            "mailroom_admin": "mr_admin", "mailroom_timekeeper": "mr_app"}


@dataclass(frozen=True)
class Callable_:
    signature: str  # name(identity arguments)
    name: str
    params: tuple[tuple[str, str, bool], ...]  # (name, type, has a default)
    result: tuple[str, ...]  # result columns "name type" (TABLE / OUT), or the scalar type
    roles: frozenset[str]
    comment: str

    def calls(self) -> list[str]:
        """The named-notation calls the workers make: every argument, and only the required ones."""
        shapes = [self.params]
        required = tuple(p for p in self.params if not p[2])
        if required != self.params:
            shapes.append(required)
        return [
            f"SELECT * FROM mailroom.{self.name}("
            + ", ".join(f"{n} => ${i}::{t}" for i, (n, t, _d) in enumerate(shape, 1)) + ")"
            for shape in shapes
        ]


API_QUERY = """
SELECT p.oid::regprocedure::text, p.proname, p.pronargs, p.pronargdefaults,
    ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a (t, i) ORDER BY i),
    ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proallargtypes) WITH ORDINALITY AS a (t, i) ORDER BY i),
    p.proargnames, p.proargmodes::text[], format_type(p.prorettype, NULL),
    ARRAY(SELECT r.rolname FROM pg_roles AS r WHERE r.rolname = ANY(%s) AND has_function_privilege(r.oid, p.oid, 'EXECUTE')),
    coalesce(obj_description(p.oid, 'pg_proc'), '')
FROM pg_proc AS p
WHERE p.pronamespace = 'mailroom'::regnamespace AND p.prokind = 'f'
"""


def runtime_api(url: str) -> dict[str, Callable_]:
    """Every function of schema mailroom some runtime role may execute."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(API_QUERY, (list(LOGIN_OF),)).fetchall()
    api = {}
    for signature, name, nargs, ndefaults, in_types, all_types_, names_, modes_, rettype, roles, comment in rows:
        if not roles:
            continue
        modes = modes_ or ["i"] * nargs
        names = names_ or [""] * len(modes)
        all_types = all_types_ or in_types
        in_names = [n for n, m in zip(names, modes, strict=True) if m in ("i", "b", "v")]
        params = tuple((n, t, pos >= nargs - ndefaults) for pos, (n, t) in enumerate(zip(in_names, in_types, strict=True)))
        result = tuple(f"{n} {t}" for n, t, m in zip(names, all_types, modes, strict=True) if m in ("o", "t", "b")) \
            or (rettype,)
        api[signature] = Callable_(signature, name, params, result, frozenset(roles), comment)
    return api


def install_previous_release(pg, name: str) -> str:
    """The previous release's bundle through psql, as a non-superuser database owner (README)."""
    with psycopg.connect(pg.url("postgres"), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (OWNER,)).fetchone():
            conn.execute(f"CREATE ROLE {OWNER} LOGIN CREATEROLE")
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name} OWNER {OWNER}")
    url = testing.as_login(pg.url(name), OWNER)
    proc = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(PREVIOUS), url],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return url


@pytest.fixture
def previous(pg):
    name = "upgrade_from_0_1_0"
    url = install_previous_release(pg, name)
    yield url
    testing.drop_database(pg, name)


def test_the_previous_release_really_ran_its_sql_pass(previous):
    with psycopg.connect(previous, autocommit=True) as conn:
        version = conn.execute("SELECT max(version) FROM mailroom.schema_migrations").fetchone()[0]
        functions = conn.execute("SELECT count(*) FROM pg_proc WHERE pronamespace = 'mailroom'::regnamespace").fetchone()[0]
    assert version == 100
    assert functions > 100, "its sql/ created the functions"


def test_upgrade_from_the_previous_release_matches_a_fresh_install(pg, previous):
    before = runtime_api(previous)
    result = migrate.migrate(previous)
    pending = [m for m in migrate.load_migrations() if m.version > 100]
    # in one transaction in order, then those that cannot run in one (mailroom:no-transaction), in order
    assert [m.name for m in pending if m.transactional] + [m.name for m in pending if not m.transactional] \
        == result.applied
    with psycopg.connect(previous, autocommit=True) as conn:
        upgraded = snapshot.take(conn)
        # the previous release's workers and an application's own listeners do not register with
        # mailroom.listen: an upgraded database keeps notifying every channel (docs/upgrading.md)
        assert conn.execute("SELECT mailroom.setting('notify.always')").fetchone()[0] == "true"
    want = (testing.checkout_root() / testing.SNAPSHOT).read_text()
    assert upgraded == want, "an upgraded database differs from the committed snapshot (a fresh install)"
    # every function of the previous release is still there, or still answers its calls (a parameter
    # with a default added), or was deprecated, or was contracted on purpose (CONTRACTED)
    assert not broken_calls(before, previous)


# Calls of the previous release removed in this one on purpose, with the reason. Only operator calls
# may be here (a worker of the previous release runs through an upgrade; an operator's command comes
# from the new package): a key passed as a parameter is what issue 20 removes, and the keyed admin
# forms cannot stay beside the keyless ones (upsert_sender's eighth argument is now the sealed
# password: the old form would make every eight-argument call ambiguous).
CONTRACTED = {
    "mailroom.sign_token(mailroom.token_action,bytea,text,bytea)": "keys never travel: the keyring signs (issue 20)",
    "mailroom.upsert_sender(text,text,text,integer,text,text,text,bytea)":
        "keys never travel: the password is sealed for the sender key (issue 20)",
}


def broken_calls(before: dict[str, Callable_], url: str) -> list[str]:
    """The calls of the previous release's workers that fail on the schema at `url` (see above)."""
    testing.ensure_test_logins(testing.as_login(url, "postgres"))  # (this release's roles exist now)
    after = runtime_api(url)
    problems = []
    for signature, old in sorted(before.items()):
        if old.comment.startswith("Deprecated"):
            continue  # contracted one release after it was deprecated
        if signature in CONTRACTED:
            assert old.roles == {"mailroom_admin"}, f"{signature}: only an operator's call may be contracted at once"
            continue
        new = after.get(signature)
        if new is not None:
            if not set(old.result) <= set(new.result):
                problems.append(f"{signature}: result {old.result} became {new.result}")
            if not old.roles <= new.roles:
                problems.append(f"{signature}: {', '.join(sorted(old.roles - new.roles))} may no longer call it")
        for role in sorted(old.roles):
            with psycopg.connect(testing.as_login(url, LOGIN_OF[role]), autocommit=True) as conn:
                for number, call in enumerate(old.calls()):
                    try:
                        conn.execute(f"PREPARE old_call_{number} AS {call}")
                        conn.execute(f"DEALLOCATE old_call_{number}")
                    except psycopg.Error as exc:
                        problems.append(f"{signature} as {role}: {call}: {exc.sqlstate} {exc.diag.message_primary}")
    return problems


def test_workers_of_the_previous_release_can_call_everything_they_could(previous):
    """Expand/contract: each call shape of the previous release still resolves (PREPARE: parse and
    name resolution, nothing runs) as each role that could make it, with the same result columns."""
    before = runtime_api(previous)
    assert len(before) > 50
    migrate.migrate(previous)
    problems = broken_calls(before, previous)
    assert not problems, "the previous release's workers would fail:\n" + "\n".join(problems)


def test_the_check_fails_for_an_argument_renamed_in_place(previous, tmp_path):
    """The check can fail: a migration drops a function to rename its argument (same types, so the
    signature looks unchanged) and sql/ re-creates it: the old workers' named call breaks."""
    import shutil

    root = tmp_path / "project"
    shutil.copytree(testing.checkout_root() / "migrations", root / "migrations")
    shutil.copytree(testing.checkout_root() / "sql", root / "sql")
    (root / "migrations" / "9990_rename_in_place.sql").write_text("DROP FUNCTION mailroom.is_suppressed(text);\n")
    path = root / "sql" / "38_outbound_suppressions.sql"
    text = path.read_text()
    assert "is_suppressed(p_address text)" in text
    path.write_text(text.replace("is_suppressed(p_address text)", "is_suppressed(p_email text)")
                    .replace("SELECT mailroom_internal._suppressed(p_address);",
                             "SELECT mailroom_internal._suppressed(p_email);"))
    before = runtime_api(previous)
    migrate.migrate(previous, root=root)
    problems = broken_calls(before, previous)
    assert problems and all("is_suppressed(text)" in p and "42883" in p for p in problems), problems


# -- MAILROOM_SECRET_KEY through the upgrade (issue 33, item 2) ---------------------------------------

SECRET_HEX = "5ec7e7" * 10 + "abcd"  # the previous release's MAILROOM_SECRET_KEY (32 bytes)
ENCRYPTION_HEX = "e1" * 32  # its MAILROOM_ENCRYPTION_KEY (relay passwords)


def _verifies(signed: str, key: bytes) -> bool:
    """The application's own verifier (the seed's layout): b64url(secret || HMAC-SHA256(key, '/activate' || secret))."""
    import base64
    import hashlib
    import hmac

    raw = base64.urlsafe_b64decode(signed + "=" * (-len(signed) % 4))
    secret, mac = raw[:32], raw[32:]
    return hmac.compare_digest(mac, hmac.new(key, b"/activate" + secret, hashlib.sha256).digest())


def test_migrate_with_the_variable_imports_it_and_links_signed_after_verify_with_it(previous, tmp_path):
    """An upgrade from 0.1.0 run with MAILROOM_SECRET_KEY in `db migrate`'s environment makes it the
    keyring's active key (the key 0125 generated is retired: it signed nothing), and says which one-time
    steps are left (the relay-password conversion). Links the previous release's collector signed keep
    working; links signed after the upgrade verify with the key the application's verifier holds."""
    import os
    import sys

    key = bytes.fromhex(SECRET_HEX)
    with psycopg.connect(previous, autocommit=True) as conn:
        conn.execute("SELECT mailroom.create_account('before@example.test', 'before')")
        (old_link,) = conn.execute("SELECT signed FROM mailroom.dequeue_tokens(10, %s)", (key,)).fetchone()
        conn.execute("SELECT mailroom.upsert_sender('relay', 'noreply@example.test', '127.0.0.1', 2525, 'none', "
                     "'user', 'pass', %s)", (bytes.fromhex(ENCRYPTION_HEX),))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env.update(MAILROOM_DATABASE_URL=previous, MAILROOM_SECRET_KEY=SECRET_HEX)
    proc = subprocess.run([sys.executable, "-m", "mailroom", "db", "migrate"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "MAILROOM_SECRET_KEY is now the active signing key" in proc.stderr, proc.stderr
    assert "one-time steps left" in proc.stderr
    steps = [line for line in proc.stderr.splitlines() if line.startswith("  ")]
    assert [s.split(":")[0].strip() for s in steps] == [
        "1. mailroom outbound sender-key init", "2. mailroom outbound convert-passwords"], proc.stderr
    assert SECRET_HEX not in proc.stderr + proc.stdout

    with psycopg.connect(previous, autocommit=True) as conn:
        keys = conn.execute("SELECT state::text, origin FROM mailroom.signing_keys ORDER BY id").fetchall()
        assert keys == [("retired", "generated"), ("active", "imported")]
        assert conn.execute("SELECT key FROM mailroom.signing_keys WHERE state = 'active'").fetchone()[0] == key
        # the previous release's link still consumes; a link signed now verifies with MAILROOM_SECRET_KEY
        assert conn.execute("SELECT outcome FROM mailroom.consume_token(%s)", (old_link,)).fetchone()[0] == "consumed"
        conn.execute("SELECT mailroom.create_account('after@example.test', 'after')")
        (new_link,) = conn.execute("SELECT signed FROM mailroom.dequeue_tokens(10)").fetchone()
    assert _verifies(new_link, key) and _verifies(old_link, key)

    # a second migrate imports nothing again, and says the same steps are left
    again = subprocess.run([sys.executable, "-m", "mailroom", "db", "migrate"], env=env, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0 and "now the active signing key" not in again.stderr
    assert "mailroom outbound convert-passwords" in again.stderr and "keys import" not in again.stderr


def test_migrate_without_the_variable_leaves_the_keyring_its_own_key(previous):
    result = migrate.migrate(previous, environ={})
    assert result.imported_key is None and result.steps == []
    with psycopg.connect(previous, autocommit=True) as conn:
        assert conn.execute("SELECT state::text, origin FROM mailroom.signing_keys").fetchall() == [("active", "generated")]
    # the variable set later: nothing is imported (the keyring already signs), the step is named
    later = migrate.migrate(previous, environ={"MAILROOM_SECRET_KEY": SECRET_HEX})
    assert later.imported_key is None
    assert [s[1] for s in later.steps] == ["mailroom keys import --active"]
