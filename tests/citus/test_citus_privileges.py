"""Least privilege on every node of a Citus topology, not only on the coordinator.

The first install runs migrations/ with DDL propagation off (docs/scale.md): their REVOKEs from
PUBLIC and the default privileges of mailroom_owner held on the coordinator only, and the
functions Citus then created on the workers were executable by anyone there."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.citus

# per function of schemas mailroom and mailroom_internal: who may execute it (PUBLIC as '-'), as the node sees it
ACL = """
SELECT coalesce(string_agg(p.oid::regprocedure::text || ' ' || g.grantees, E'\\n'
                           ORDER BY p.oid::regprocedure::text), '')
FROM pg_catalog.pg_proc AS p
CROSS JOIN LATERAL (
    SELECT coalesce(string_agg(g.name, ',' ORDER BY g.name), '') AS grantees
    FROM (
        SELECT CASE WHEN a.grantee = 0 THEN '-' ELSE a.grantee::regrole::text END AS name
        FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) AS a
        WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
    ) AS g
) AS g
WHERE p.pronamespace IN ('mailroom'::regnamespace, 'mailroom_internal'::regnamespace)
  AND EXISTS (SELECT 1 FROM pg_dist_object AS o WHERE o.classid = 'pg_proc'::regclass AND o.objid = p.oid)
"""


def _public(acl: str) -> list[str]:
    return [line.split(" ")[0] for line in acl.splitlines() if "-" in line.split(" ", 1)[1].split(",")]


def test_functions_on_the_workers_have_the_coordinators_grants(cconn):
    coordinator = cconn.execute(ACL).fetchone()[0]
    assert coordinator.count("\n") > 100  # the functions Citus put on every node
    assert _public(coordinator) == []  # nothing of mailroom is executable by PUBLIC (migrations/0050)
    rows = cconn.execute("SELECT nodename, nodeport, success, result FROM run_command_on_workers(%s)",
                         (ACL,)).fetchall()
    assert len(rows) == 2
    for node, port, success, result in rows:
        assert success, (node, port, result)
        assert _public(result) == [], (node, port, _public(result)[:5])
        assert result == coordinator, (node, port)


def test_the_internal_schema_on_the_workers(cconn):
    """mailroom_internal exists on every node, mailroom_owner's, with no USAGE for PUBLIC or a runtime
    role, and the internals Citus distributes live there on the workers too (migrations/0400)."""
    probe = ("SELECT n.nspowner::regrole::text || ' ' || coalesce(n.nspacl::text, '-') || ' '"
             " || (SELECT count(*) FROM pg_proc AS p WHERE p.pronamespace = n.oid AND p.proname ~ '^(_|trg_)')"
             " || ' ' || (SELECT count(*) FROM pg_proc AS p"
             "            WHERE p.pronamespace = 'mailroom'::regnamespace AND p.proname ~ '^(_|trg_)')"
             " FROM pg_namespace AS n WHERE n.nspname = 'mailroom_internal'")
    rows = cconn.execute("SELECT success, result FROM run_command_on_workers(%s)", (probe,)).fetchall()
    assert len(rows) == 2
    for success, result in rows:
        assert success, result
        owner, acl, internals, left_in_mailroom = result.split(" ")
        assert owner == "mailroom_owner" and acl in ("-", "{mailroom_owner=UC/mailroom_owner}"), result
        assert int(internals) > 100 and left_in_mailroom == "0", result


def test_new_functions_on_the_workers_are_not_public(cconn):
    """What a later migration creates on the workers starts without PUBLIC EXECUTE there too."""
    rows = cconn.execute(
        "SELECT success, result FROM run_command_on_workers($$"
        "SELECT count(*) FROM pg_default_acl AS d"
        " WHERE d.defaclrole = 'mailroom_owner'::regrole AND d.defaclobjtype = 'f'"
        " AND NOT EXISTS (SELECT 1 FROM aclexplode(d.defaclacl) AS a WHERE a.grantee = 0)$$)"
    ).fetchall()
    assert rows == [(True, "1"), (True, "1")], rows
