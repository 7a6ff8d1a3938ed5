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
                    .replace("SELECT mailroom._suppressed(p_address);", "SELECT mailroom._suppressed(p_email);"))
    before = runtime_api(previous)
    migrate.migrate(previous, root=root)
    problems = broken_calls(before, previous)
    assert problems and all("is_suppressed(text)" in p and "42883" in p for p in problems), problems
