"""The schema snapshot: a normalized dump of what `db migrate` builds, one line per catalog fact.

`tests/db/schema.snapshot` is committed; `tests/db/test_schema_snapshot.py` migrates a fresh
database, takes this dump and fails on any difference, printing the diff and the command that
regenerates the file (`make snapshot`). A change of the schema is then always a visible change of
that file in review, and drift (an upgraded database that differs from a fresh one, a function
whose body changed in a file nobody meant to touch) cannot pass unnoticed.

What it holds, for schema mailroom (and mailroom_internal, where the internal functions live: their
lines name the schema): the schemas (owner, privileges), extensions, every table, view, sequence and
type (owner, privileges, comment, partitioning), columns (type, nullability, default, identity,
comment), constraints, indexes, triggers, row-level security and policies, every function
(arguments with names and defaults, result, language, volatility, security, settings, owner,
privileges, comment, and the sha256 of its body) and default privileges. Time partitions
(`…_pYYYYMMDDtHHMM`, made by maintain_partitions for the current date) are left out: they depend
on the day the dump is taken; the DEFAULT partitions and the partitioning are kept.
Grantors are left out of privileges (who ran the GRANT does not change what it grants).
"""

from __future__ import annotations

import hashlib

import psycopg

SCHEMA = "mailroom"
INTERNAL_SCHEMA = "mailroom_internal"  # the internal functions (_x, trg_x): migrations/0400, 0401
TIME_PARTITION = r"_p[0-9]{8}t[0-9]{4}$"

# the relations described (time partitions left out), as a CTE each query starts from
_RELATIONS = f"""
WITH rel AS (
    SELECT c.oid, c.relname, c.relkind
    FROM pg_catalog.pg_class AS c
    WHERE c.relnamespace = '{SCHEMA}'::regnamespace
        AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'c', 'f')
        AND NOT (c.relispartition AND c.relname ~ '{TIME_PARTITION}')
)
"""

_ACL = """
coalesce((SELECT string_agg(
    CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_catalog.pg_get_userbyid(a.grantee) END || '=' || a.privilege_type
        || CASE WHEN a.is_grantable THEN '*' ELSE '' END, ',' ORDER BY 1)
  FROM pg_catalog.aclexplode({acl}) AS a), 'default')
"""


def _acl(column: str) -> str:
    return _ACL.format(acl=column)


QUERIES: list[str] = [
    # the schema
    f"""SELECT format('schema %s owner=%s acl=%s comment=%s', n.nspname, pg_catalog.pg_get_userbyid(n.nspowner),
               {_acl('n.nspacl')}, coalesce(pg_catalog.obj_description(n.oid, 'pg_namespace'), '-'))
        FROM pg_catalog.pg_namespace AS n WHERE n.nspname IN ('{SCHEMA}', '{INTERNAL_SCHEMA}')""",
    # extensions (pgcrypto) and where they live
    """SELECT format('extension %s schema=%s', e.extname, e.extnamespace::regnamespace)
        FROM pg_catalog.pg_extension AS e WHERE e.extname NOT IN ('plpgsql', 'pgtap', 'pg_cron')""",
    # relations
    _RELATIONS + f"""
        SELECT format('relation %s kind=%s owner=%s acl=%s rls=%s%s%s%s options=%s comment=%s',
            r.relname, c.relkind, pg_catalog.pg_get_userbyid(c.relowner), {_acl('c.relacl')},
            c.relrowsecurity, CASE WHEN c.relforcerowsecurity THEN ' force' ELSE '' END,
            coalesce(' partition-by=' || pg_catalog.pg_get_partkeydef(c.oid), ''),
            CASE WHEN c.relispartition THEN ' partition-of=' || (SELECT i.inhparent::regclass::text
                FROM pg_catalog.pg_inherits AS i WHERE i.inhrelid = c.oid) || ' '
                || pg_catalog.pg_get_expr(c.relpartbound, c.oid) ELSE '' END,
            coalesce(array_to_string(c.reloptions, ','), '-'),
            coalesce(pg_catalog.obj_description(c.oid, 'pg_class'), '-'))
        FROM rel AS r JOIN pg_catalog.pg_class AS c ON c.oid = r.oid""",
    # columns, in their order
    _RELATIONS + """
        SELECT format('column %s.%s #%s %s%s%s%s%s comment=%s', r.relname, a.attname,
            row_number() OVER (PARTITION BY r.oid ORDER BY a.attnum),
            pg_catalog.format_type(a.atttypid, a.atttypmod),
            CASE WHEN a.attnotnull THEN ' not-null' ELSE '' END,
            coalesce(' default=' || pg_catalog.pg_get_expr(d.adbin, d.adrelid), ''),
            CASE a.attidentity WHEN 'a' THEN ' identity-always' WHEN 'd' THEN ' identity-by-default' ELSE '' END,
            CASE WHEN a.attgenerated = 's' THEN ' generated' ELSE '' END
                || CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation
                        THEN ' collate=' || a.attcollation::regcollation::text ELSE '' END,
            coalesce(pg_catalog.col_description(r.oid, a.attnum), '-'))
        FROM rel AS r
        JOIN pg_catalog.pg_attribute AS a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
        JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid
        LEFT JOIN pg_catalog.pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE r.relkind <> 'S'""",
    # constraints of relations (a partition's inherited ones are its parent's) and of domains
    _RELATIONS + """
        SELECT format('constraint %s %s %s%s', r.relname, k.conname, pg_catalog.pg_get_constraintdef(k.oid),
            coalesce(' comment=' || pg_catalog.obj_description(k.oid, 'pg_constraint'), ''))
        FROM rel AS r JOIN pg_catalog.pg_constraint AS k ON k.conrelid = r.oid
        WHERE k.conparentid = 0""",
    f"""SELECT format('constraint %s %s %s', t.typname, k.conname, pg_catalog.pg_get_constraintdef(k.oid))
        FROM pg_catalog.pg_constraint AS k JOIN pg_catalog.pg_type AS t ON t.oid = k.contypid
        WHERE t.typnamespace = '{SCHEMA}'::regnamespace""",
    # indexes (of the relations kept)
    _RELATIONS + """
        SELECT format('index %s %s%s', i.indexrelid::regclass, pg_catalog.pg_get_indexdef(i.indexrelid),
            coalesce(' comment=' || pg_catalog.obj_description(i.indexrelid, 'pg_class'), ''))
        FROM rel AS r JOIN pg_catalog.pg_index AS i ON i.indrelid = r.oid""",
    # triggers written in SQL (not a constraint's, not a partition's clone of its parent's)
    _RELATIONS + """
        SELECT format('trigger %s %s enabled=%s%s', r.relname, pg_catalog.pg_get_triggerdef(g.oid), g.tgenabled,
            coalesce(' comment=' || pg_catalog.obj_description(g.oid, 'pg_trigger'), ''))
        FROM rel AS r JOIN pg_catalog.pg_trigger AS g ON g.tgrelid = r.oid
        WHERE NOT g.tgisinternal AND g.tgparentid = 0""",
    # row-level security policies
    _RELATIONS + """
        SELECT format('policy %s %s %s %s roles=%s using=%s check=%s', r.relname, p.polname, p.polcmd,
            CASE WHEN p.polpermissive THEN 'permissive' ELSE 'restrictive' END,
            (SELECT string_agg(CASE WHEN x = 0 THEN 'PUBLIC' ELSE pg_catalog.pg_get_userbyid(x) END, ',' ORDER BY 1)
             FROM unnest(p.polroles) AS x),
            coalesce(pg_catalog.pg_get_expr(p.polqual, p.polrelid), '-'),
            coalesce(pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid), '-'))
        FROM rel AS r JOIN pg_catalog.pg_policy AS p ON p.polrelid = r.oid""",
    # views: the definition's digest
    _RELATIONS + """
        SELECT format('view %s definition=%s', r.relname, pg_catalog.pg_get_viewdef(r.oid))
        FROM rel AS r WHERE r.relkind IN ('v', 'm')""",
    # sequences
    _RELATIONS + """
        SELECT format('sequence %s %s start=%s increment=%s min=%s max=%s cache=%s cycle=%s owned-by=%s', r.relname,
            s.seqtypid::regtype, s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle,
            coalesce((SELECT d.refobjid::regclass || '.' || a.attname FROM pg_catalog.pg_depend AS d
                      JOIN pg_catalog.pg_attribute AS a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                      WHERE d.classid = 'pg_class'::regclass AND d.objid = r.oid
                          AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')), '-'))
        FROM rel AS r JOIN pg_catalog.pg_sequence AS s ON s.seqrelid = r.oid""",
    # types: enums (labels in order), domains, composite types (their columns are listed above)
    f"""SELECT format('type %s kind=%s owner=%s acl=%s%s%s comment=%s', t.typname, t.typtype,
            pg_catalog.pg_get_userbyid(t.typowner), {_acl('t.typacl')},
            CASE WHEN t.typtype = 'e' THEN ' labels=' || (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                FROM pg_catalog.pg_enum AS e WHERE e.enumtypid = t.oid) ELSE '' END,
            CASE WHEN t.typtype = 'd' THEN ' base=' || pg_catalog.format_type(t.typbasetype, t.typtypmod)
                || CASE WHEN t.typnotnull THEN ' not-null' ELSE '' END
                || coalesce(' default=' || t.typdefault, '') ELSE '' END,
            coalesce(pg_catalog.obj_description(t.oid, 'pg_type'), '-'))
        FROM pg_catalog.pg_type AS t
        WHERE t.typnamespace = '{SCHEMA}'::regnamespace AND t.typtype IN ('e', 'd', 'c', 'r', 'm')
            AND NOT (t.typtype = 'c' AND (SELECT c.relkind FROM pg_catalog.pg_class AS c WHERE c.oid = t.typrelid) <> 'c')""",
    # functions and procedures: the whole signature, attributes, privileges, comment, body digest
    f"""SELECT format('function %s(%s) returns=%s kind=%s lang=%s volatility=%s strict=%s security=%s leakproof=%s '
            'parallel=%s cost=%s rows=%s config=%s owner=%s acl=%s body=%s comment=%s',
            CASE WHEN p.pronamespace = '{SCHEMA}'::regnamespace THEN p.proname
                ELSE p.pronamespace::regnamespace || '.' || p.proname END,
            pg_catalog.pg_get_function_arguments(p.oid),
            coalesce(pg_catalog.pg_get_function_result(p.oid), '-'), p.prokind, l.lanname, p.provolatile,
            p.proisstrict, CASE WHEN p.prosecdef THEN 'definer' ELSE 'invoker' END, p.proleakproof, p.proparallel,
            p.procost, p.prorows, coalesce(array_to_string(p.proconfig, ','), '-'),
            pg_catalog.pg_get_userbyid(p.proowner), {_acl('p.proacl')}, '%BODY%' || p.prosrc || '%END%',
            coalesce(pg_catalog.obj_description(p.oid, 'pg_proc'), '-'))
        FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_language AS l ON l.oid = p.prolang
        WHERE p.pronamespace IN ('{SCHEMA}'::regnamespace, to_regnamespace('{INTERNAL_SCHEMA}'))""",
    # default privileges of mailroom's roles
    """SELECT format('default-privileges role=%s schema=%s objects=%s acl=%s', pg_catalog.pg_get_userbyid(d.defaclrole),
            coalesce(d.defaclnamespace::regnamespace::text, '*'), d.defaclobjtype, """ + _acl("d.defaclacl") + """)
        FROM pg_catalog.pg_default_acl AS d
        WHERE pg_catalog.pg_get_userbyid(d.defaclrole) LIKE 'mailroom\\_%'""",
]


def _digest_bodies(line: str) -> str:
    """Function bodies (and view definitions) become a short sha256: the diff names what changed."""
    start = line.find("%BODY%")
    if start >= 0:
        end = line.index("%END%", start)
        body = line[start + len("%BODY%"):end]
        line = line[:start] + "sha256:" + hashlib.sha256(body.encode()).hexdigest()[:16] + line[end + len("%END%"):]
    if line.startswith("view ") and " definition=" in line:
        head, _, definition = line.partition(" definition=")
        line = f"{head} definition=sha256:{hashlib.sha256(definition.encode()).hexdigest()[:16]}"
    return line


def _one_line(text: str) -> str:
    return " ".join(text.split()) if "\n" in text else text


def take(conn: psycopg.Connection) -> str:
    """The snapshot of the database `conn` is connected to, as text (sorted lines)."""
    lines: list[str] = []
    for query in QUERIES:
        for (line,) in conn.execute(query).fetchall():
            lines.append(_one_line(_digest_bodies(line)))
    header = ("# mailroom schema snapshot: what a fresh `mailroom db migrate` builds (mailroom.db.snapshot).\n"
              "# Regenerate with `make snapshot` after changing migrations/ or sql/, and commit it.\n")
    return header + "\n".join(sorted(lines)) + "\n"
