"""A Citus topology on one machine: a coordinator and N workers, each an embedded cluster.

`mailroom db up --workers N` (and the tests' `citus` fixture) start it: the coordinator lives in
the usual home (./.mailroom, so `mailroom db url` / `db status` / every command find it as they
find a single node), worker i in `<home>/worker<i>`, each its own data directory, port (the
coordinator's + i) and unix socket, all with `shared_preload_libraries = citus`. The nodes know
each other by their socket directories: a Citus node connects to another as a libpq client, and
over the socket the embedded clusters trust their own OS user, so no password is configured
anywhere (a deployment on several hosts registers host names and gives the nodes a passfile or
certificates: docs/scale.md). With --tcp every node also listens on 127.0.0.1.

What needs a superuser is done here, as the operator: CREATE EXTENSION citus in the database of
every node, citus_set_coordinator_host and citus_add_node. `mailroom db migrate` then finds a
coordinator (`is_coordinator`) and distributes the schema (sql/citus/, mailroom.db.migrate).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from mailroom.core.errors import UserError
from mailroom.db import cluster as embedded
from mailroom.db.connect import connect

# Settings of every node. max_prepared_transactions: a transaction that writes on two workers
# commits in two phases. shard_count: 8 shards a table on this machine's scale (the Citus default,
# 32, is for many cores; a deployment sets its own before `db migrate`).
NODE_SETTINGS = {
    "shared_preload_libraries": "citus",
    "max_prepared_transactions": "200",
    "citus.shard_count": "8",
}


def citus_installed(bindir: Path | None = None) -> bool:
    """Whether the Citus extension is installed for the server binaries in use."""
    bindir = bindir or embedded.find_bindir()
    lib = bindir.parent / "lib" / "citus.so"
    share = Path("/usr/share/postgresql") / bindir.parent.name / "extension" / "citus.control"
    return lib.is_file() and share.is_file()


@dataclass
class Topology:
    """The coordinator and its workers (embedded clusters)."""

    coordinator: embedded.Cluster
    workers: list[embedded.Cluster]

    @property
    def nodes(self) -> list[embedded.Cluster]:
        return [self.coordinator, *self.workers]

    def url(self, dbname: str = embedded.DEFAULT_DBNAME) -> str:
        """What every driver connects to: the coordinator."""
        return self.coordinator.url(dbname)

    def pids(self) -> list[int | None]:
        return [node.pid() for node in self.nodes]


def _worker_home(home: Path, index: int) -> Path:
    return home / f"worker{index}"


def load(home: Path) -> Topology:
    """The topology whose coordinator lives in `home` (no workers: a single node)."""
    coordinator = embedded.Cluster(home)
    return Topology(coordinator, [embedded.Cluster(Path(w)) for w in coordinator.workers])


def up(home: Path, workers: int, *, port: int | None = None, tcp: bool | None = None,
       fast: bool = False, dbname: str = embedded.DEFAULT_DBNAME) -> Topology:
    """Create (if needed) and start a coordinator and `workers` workers, and `dbname` on them, registered."""
    if workers < 1:
        raise UserError("--workers must be at least 1", exit_code=2)
    bindir = embedded.find_bindir()
    if not citus_installed(bindir):
        raise UserError("the Citus extension is not installed for this PostgreSQL: run ../shared/citus/build.sh "
                        "(or install a citus package for PostgreSQL 15)")
    run_as = embedded.RunAs.detect()
    home = Path(home).expanduser().resolve()
    current = embedded.Cluster(home)
    if current.exists() and not current.workers:
        raise UserError(f"{home} holds a single-node cluster; choose another --data-dir for a Citus topology")
    if current.workers and len(current.workers) != workers:
        raise UserError(f"the topology in {home} has {len(current.workers)} workers; `mailroom db down` and "
                        "choose another --data-dir to change it")
    coordinator = embedded.Cluster(home, port=port, tcp=tcp, settings=NODE_SETTINGS)
    worker_nodes = [
        embedded.Cluster(_worker_home(home, i), port=coordinator.port + i, tcp=coordinator.tcp, settings=NODE_SETTINGS)
        for i in range(1, workers + 1)
    ]
    coordinator.workers = [str(w.home) for w in worker_nodes]
    for node in (coordinator, *worker_nodes):
        node.init(bindir, run_as, fast=fast)
        node.start(bindir, run_as, fast=fast)
    topology = Topology(coordinator, worker_nodes)
    ensure_database(topology, dbname)
    return topology


def down(home: Path) -> bool:
    """Stop the workers, then the coordinator (each by its postmaster's pid); False when none ran."""
    topology = load(home)
    if not topology.coordinator.exists():
        return False
    bindir, run_as = embedded.find_bindir(), embedded.RunAs.detect()
    stopped = False
    for node in reversed(topology.nodes):
        stopped = node.stop(bindir, run_as) or stopped
    return stopped


def destroy(topology: Topology) -> None:
    bindir, run_as = embedded.find_bindir(), embedded.RunAs.detect()
    for node in reversed(topology.nodes):
        node.destroy(bindir, run_as)


def ensure_database(topology: Topology, dbname: str) -> None:
    """`dbname` on every node with the citus extension, the coordinator and the workers registered (idempotent).

    The operator's part of an install on Citus (superuser): each Citus database is its own cluster of
    nodes, so a new database is created on every node and registered again."""
    for node in topology.nodes:
        embedded.ensure_database(node.url(), dbname)
        with connect(node.url(dbname)) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
    with connect(topology.coordinator.url(dbname)) as conn:
        coordinator = topology.coordinator
        conn.execute("SELECT citus_set_coordinator_host(%s, %s)", (str(coordinator.home), coordinator.port))
        for worker in topology.workers:
            known = conn.execute(
                "SELECT 1 FROM pg_dist_node WHERE nodename = %s AND nodeport = %s", (str(worker.home), worker.port)
            ).fetchone()
            if not known:
                conn.execute("SELECT citus_add_node(%s, %s)", (str(worker.home), worker.port))
        # pgcrypto on every node (Citus propagates CREATE EXTENSION from the coordinator once the
        # nodes are registered): functions that run on the shards hash and sign with it (the
        # suppression list's keyed hashes, the error_log redaction)
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgcrypto WITH SCHEMA public")
    prepare_roles(topology.coordinator.url(dbname))


# mailroom's roles (migrations/0050_roles.sql, 0140_http_role.sql), created by the operator before
# the first `db migrate` on a coordinator: a role created inside the migrate transaction would be
# invisible to the connections Citus opens to the workers as another user (mailroom_owner) in it.
ROLES = (
    "mailroom_owner", "mailroom_app", "mailroom_collector", "mailroom_sender", "mailroom_inbound",
    "mailroom_monitor", "mailroom_admin", "mailroom_timekeeper", "mailroom_http",
)
OWNER = "mailroom_owner"


def prepare_roles(url: str) -> None:
    """The operator's part (superuser, on the coordinator): mailroom's roles on every node.

    They are NOLOGIN on the coordinator, as on a single node. On the workers mailroom_owner may log
    in: Citus reaches a worker as the current user, and the SECURITY DEFINER functions (and the
    migrations) run as mailroom_owner. Who may connect to a worker at all is the workers' pg_hba
    (in the embedded topology: the nodes' own OS user over their sockets; docs/scale.md)."""
    with connect(url) as conn:
        for role in ROLES:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
        owner_may_log_in(conn)


def owner_may_log_in(conn: psycopg.Connection) -> None:
    """mailroom_owner may log in on every worker (superuser), or a clear error saying who must do it.

    Each database of a Citus cluster keeps its own list of the objects it propagated: when a new
    database first needs mailroom_owner on the workers, Citus copies the role with the
    coordinator's attributes (NOLOGIN). `db migrate` calls this right after that happens."""
    superuser = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]
    if superuser:
        # Citus may copy the role to a worker a moment later (its metadata sync runs in the
        # background), with the coordinator's NOLOGIN: wait for the sync, then until every worker
        # says the role logs in
        deadline = time.monotonic() + 30
        while not conn.execute("SELECT coalesce(bool_and(metadatasynced), true) FROM pg_dist_node"
                               " WHERE noderole = 'primary' AND isactive AND groupid <> 0").fetchone()[0]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        while True:
            conn.execute("SELECT run_command_on_workers(%s)", (f"ALTER ROLE {OWNER} LOGIN",))
            rows = conn.execute("SELECT nodename, result FROM run_command_on_workers(%s)",
                                (f"SELECT rolcanlogin FROM pg_roles WHERE rolname = '{OWNER}'",)).fetchall()
            if all(result == "t" for _, result in rows) or time.monotonic() > deadline:
                return
            time.sleep(0.2)
    rows = conn.execute(
        "SELECT nodename, result FROM run_command_on_workers(%s)",
        (f"SELECT rolcanlogin FROM pg_roles WHERE rolname = '{OWNER}'",),
    ).fetchall()
    refused = [str(name) for name, result in rows if result != "t"]
    if refused:
        raise UserError(f"{OWNER} may not log in on the workers {', '.join(refused)}: a superuser runs "
                        f"`SELECT run_command_on_workers('ALTER ROLE {OWNER} LOGIN')` on the coordinator (docs/scale.md)")


def drop_database(topology: Topology, dbname: str, *, patience: float = 15.0) -> None:
    """Drop `dbname` on every node. WITH (FORCE) ends the sessions of clients, but Citus' maintenance
    daemon, a background worker of a database with the extension, may still hold it for a moment
    (55006 "being accessed by other users"; met on a topology just started): the statement, which
    drops or does nothing, is tried again within `patience` seconds."""
    statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname))
    for node in topology.nodes:
        deadline = time.monotonic() + patience
        with connect(node.url("postgres")) as conn:
            while True:
                try:
                    conn.execute(statement)
                    break
                except psycopg.errors.ObjectInUse:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)


def is_coordinator(conn: psycopg.Connection) -> bool:
    """Whether `conn` is a Citus coordinator with workers: the citus extension, and active primary workers."""
    has_citus = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone()
    if not has_citus:
        return False
    row = conn.execute(
        "SELECT count(*) FROM pg_dist_node WHERE groupid <> 0 AND isactive AND noderole = 'primary'"
    ).fetchone()
    return bool(row and row[0])


def is_distributed(conn: psycopg.Connection) -> bool:
    """Whether mailroom's schema on this coordinator has been distributed (sql/citus/ ran)."""
    row = conn.execute(
        "SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('mailroom.messages')"
    ).fetchone()
    return row is not None


def mailboxes_local(conn: psycopg.Connection) -> bool:
    """Whether mailboxes is a Citus local table (the layout of the earlier release, moved by sql/citus/10)."""
    row = conn.execute(
        "SELECT 1 FROM pg_dist_partition WHERE logicalrelid = to_regclass('mailroom.mailboxes') AND partmethod = 'n'"
    ).fetchone()
    return row is not None


# Before sql/ is applied again on a coordinator: Citus keeps a table it adds to its metadata under
# a shard name and puts a new table of the old name in front, so a function declared with that
# table's row type (RETURNS mailroom.mailboxes) now names the shard's type, and CREATE OR REPLACE
# would refuse the change of type. Those functions are dropped first, in the migrate transaction.
DROP_SHARD_ROWTYPE_FUNCTIONS = """DO $drop$
DECLARE
    v_fn regprocedure;
BEGIN
    FOR v_fn IN
        SELECT DISTINCT p.oid::regprocedure
        FROM pg_catalog.pg_proc AS p
        CROSS JOIN LATERAL unnest(p.prorettype || p.proargtypes::oid[]) AS a (typ)
        INNER JOIN pg_catalog.pg_type AS t ON t.oid = a.typ
        -- (pg_class hides shards from a coordinator's sessions; pg_type does not)
        WHERE p.pronamespace IN ('mailroom'::regnamespace, to_regnamespace('mailroom_internal'))
            AND t.typrelid <> 0 AND t.typname ~ '_[0-9]+$'
            AND t.typnamespace = 'mailroom'::regnamespace
    LOOP
        EXECUTE format('DROP FUNCTION %s', v_fn);
    END LOOP;
END;
$drop$"""


# The Citus seams (issue 36): every function that sql/citus/ defines and sql/ defines too, named
# `name(argument types)`, with why it differs on Citus. A seam is a hook: its base definition in
# sql/ is small (tests/db/test_citus_seams.py: at most SEAM_MAX_LINES lines of code) and does
# nothing, or the single-node thing; the logic every deployment shares stays in the base functions
# that call it, written once. Each base definition names its Citus form in the comment above it.
# A function in sql/citus/ that replaces a base function not declared here fails that test.
SEAM_MAX_LINES = 15
SEAMS: dict[str, str] = {
    # accounts and tokens (sql/citus/12_accounts.sql, 13_token_digests.sql)
    "mailroom_internal._triggers_cascade()":
        "row triggers run on a worker, on their row's shard: they cannot write another table",
    "mailroom_internal._insert_account(text, text)":
        "login and email are unique through lookup tables distributed by those keys; the token is made here",
    "mailroom_internal._issue_token(bigint, mailroom.token_action)":
        "the reissue's revocation and its NOTIFY, done by the token triggers on one node, run on the coordinator",
    "mailroom_internal._lock_account_by_email(text)":
        "an account is found by address through account_emails (one shard), then locked on its own shard",
    "mailroom_internal._after_consume(bigint, mailroom.token_action)":
        "the activation of the trigger after_token_consumed, which cannot run on a worker",
    "mailroom_internal._dequeue_tokens(integer, bytea, boolean)":
        "SKIP LOCKED runs only in a single-shard statement: the dequeue walks the shards",
    "mailroom_internal._delete_tokens_past_retention(text, timestamptz, integer)":
        "ctid batches with SKIP LOCKED are refused on a distributed table; the digests' lookup rows go too",
    "mailroom_internal._erase_account_keys(bigint[], text)":
        "an erased account's keys are also in account_emails, account_logins and token_digests",
    "mailroom_internal._token_digest_replaced(bigint, bytea, bytea)":
        "token_digests routes a link's digest to its account's shard",
    "mailroom_internal._forget_token_digests(text)":
        "a dropped tokens partition's digests leave token_digests",
    "mailroom_internal._token_by_digest(bytea)":
        "a digest is found through token_digests (one shard), then the token on its account's shard",
    "mailroom_internal._delete_tokens_before(timestamptz)":
        "purge_tokens' deleted tokens leave token_digests too",
    # inboxes (sql/citus/30_mailboxes.sql)
    "mailroom_internal._mailbox_id(text)":
        "a mailbox is found by address through mailbox_addresses (distributed by address)",
    "mailroom_internal._insert_mailbox(text, text, mailroom.mailbox_owner_type, text, bytea, timestamptz, timestamptz, text)":
        "an address is kept unique by its reservation in mailbox_addresses",
    "mailroom_internal._delete_mailbox(text)":
        "no trigger deletes the messages, and the address's reservation goes too",
    "mailroom_internal._expire_due_mailboxes(timestamptz, integer)":
        "SKIP LOCKED runs only in a single-shard statement: expiry walks the shards",
    "mailroom_internal._purge_inactive_mailboxes(timestamptz, integer)":
        "shard by shard (SKIP LOCKED), with the messages and the addresses' reservations",
    # outbound and maintenance (sql/citus/20_queue.sql, 25_maintenance.sql)
    "mailroom_internal._claim_lanes(bigint[])":
        "a claim token carries its lane: finalize and release write those lanes' shards, not every worker's",
    "mailroom_internal._outbound_scopes()":
        "SKIP LOCKED runs only in a single-shard statement: one statement a lane (one shard each)",
    "mailroom_internal._delete_outbound_past_retention(text, timestamptz, integer)":
        "ctid batches with SKIP LOCKED are refused on a distributed table: lane by lane, the keys apart",
    "mailroom_internal._delete_messages_past_retention(text, timestamptz, integer)":
        "ctid batches with SKIP LOCKED are refused on a distributed table: by inactive mailbox",
    "mailroom_internal._orphan_idempotency_keys(timestamptz, integer)":
        "the keys stay on the coordinator, the messages on the workers: Citus joins neither way",
}

# Whole bodies sql/citus/ still replaces, each with why it is not a hook yet. Only ever shrinks:
# the test fails when an entry is no longer overridden, and when the list grows past its count.
WHOLE_OVERRIDES_MAX = 2
WHOLE_OVERRIDES: dict[str, str] = {
    "mailroom_internal._claim(timestamptz, integer, text, interval, boolean)":
        "row type moving, issue 36 item 3: the claim lane by lane (_claim_lane) is restructured after the row",
    "mailroom_internal._queue_verb_change(text, text, text, text, bigint[], text, text[], boolean, timestamptz)":
        "the operator verbs lane by lane, the deleted messages' idempotency keys (a coordinator table) in a "
        "statement of their own; the queue verbs become a table (issue 36 item 3) first",
}
