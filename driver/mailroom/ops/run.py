"""`mailroom run`: the inbound SMTP server, the collector, the sender, the expiry worker, partition
maintenance, and with --http-port the HTTP face.

Each child is the same CLI command an operator would run on its own, supervised by
mailroom.core.supervisor with restarts (issue 46, item 5; docs/architecture.md, "Isolation"): a child
that dies after its start-up window is started again alone, after a second, the others keep running
with their pids; one that dies within the window failed to start, and then the others are stopped
(exit 1). `run` says "running" only once every child said it serves (mailroom.core.ready); Ctrl-C or
SIGTERM stops them all, exit 0.

Memory (issue 46, item 5): the children are not new interpreters but forked copies of `run` (Child.fork),
which imported every enabled worker's modules first (PRELOAD, before any child connects; it holds no
connection when it forks: the checks below close theirs) and froze them out of the cyclic collector, so
the interpreter, the libraries and those modules are pages the children share. Each child is named
`mr <command>` (ps, top: its comm; its command line is run's). Isolation is unchanged: one process per
worker, each with its own login, and only `collect` and `send` ever read their keys (the parent imports
code, never a secret). A forked child keeps its parent's memory, run's environment block included: so with
a secret in run's environment (SECRET_ENV: MAILROOM_SECRET_KEY, …) every child is a new interpreter again,
and each worker's environment goes without the secrets it does not read.

Start order costs no backoff (issue 34, item 6): the sender's relay is often run's own inbox server
(the demo, a test setup, an activation mail to one of its inboxes), so the children after the inbox
server start only once it serves (its ready byte: it listens). A sender started earlier could try
the first mail before the port listens, and pay the retry backoff (a minute) for it.

The HTTP face (--http-port) serves the REST API and the page; it expires nothing: its inboxes expire
by run's `expire` worker like every other (mailroom_http has no expiry rights). With --no-expire, run
says in one line that something else must expire them (pg_cron, another `mailroom expire`), and
`mailroom doctor` warns when nothing has expired inboxes recently.

MAILROOM_SECRET_KEY in run's environment reaches collect and send: `run` checks it first (the keyring's
active key, by fingerprint: mailroom.db.keyring) and refuses with one line, exit 2.

Which login: each child connects as the login of its URL. One URL for all needs a login granted
mailroom_inbound (inbox serve, expire, maintain), mailroom_collector (collect) and mailroom_sender
(send); or give each worker its own URL (--inbox-url, --collect-url, --send-url, --expire-url,
--maintain-url), each with a login granted that worker's role. `run` checks the grants first and
says which role a login lacks, instead of letting a child fail on its first call.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from mailroom.core import eventloop
from mailroom.core.errors import ConfigError, UserError
from mailroom.core.supervisor import Child, Supervisor, preload
from mailroom.db.connect import granted_roles

INBOX_LISTEN_TIMEOUT = 15.0
MAINTAIN_EVERY = "10m"
# run's own collector flushes a batch 100 ms after the first notification of a quiet period (issue 44,
# item 7: an activation mail in the inbox within 300 ms); `mailroom collect` alone keeps the seed's 5 s,
# and MAILROOM_BATCH_TIMEOUT in run's environment still wins
RUN_BATCH_TIMEOUT = "100ms"

# the workers of `run`, in start order (the inbox first, so relays pointing at it work), with the
# group role each one's login needs and the offset of its metrics port from --metrics-port
WORKERS: dict[str, tuple[str, int]] = {
    "inbox": ("mailroom_inbound", 2),
    "http": ("mailroom_http", 5),
    "collect": ("mailroom_collector", 1),
    "send": ("mailroom_sender", 0),
    "expire": ("mailroom_inbound", 3),
    "maintain": ("mailroom_inbound", 4),
}
# the event loop `inbox serve` and `send` take by default (mailroom.core.eventloop): imported once
# here, its module's pages are shared (idle tree 146 -> 143 MiB PSS, bench/bench_memory.py)
_LOOP = eventloop.auto_modules()
# what `run` imports before it forks each enabled worker (the command's module and what its command
# imports when it starts: measured, bench/bench_memory.py and tests/ops/test_startup.py)
PRELOAD: dict[str, tuple[str, ...]] = {
    "inbox": ("mailroom.inboxes.cli", "mailroom.inboxes.server", *_LOOP),
    "http": ("mailroom.http.cli", "mailroom.http.server", "mailroom.http.app", "mailroom.checks.links",
             "mailroom.checks.spam"),
    "collect": ("mailroom.accounts.cli", "mailroom.accounts.collector"),
    "send": ("mailroom.outbound.cli", "mailroom.outbound.sender", *_LOOP),
    "expire": ("mailroom.inboxes.cli", "mailroom.inboxes.expiry"),
    "maintain": ("mailroom.ops.cli", "mailroom.ops.maintain"),
}
METRICS_ENV = {"inbox": "MAILROOM_INBOX_METRICS_PORT", "collect": "MAILROOM_COLLECT_METRICS_PORT",
               "send": "MAILROOM_SEND_METRICS_PORT", "expire": "MAILROOM_EXPIRE_METRICS_PORT",
               "maintain": "MAILROOM_MAINTAIN_METRICS_PORT"}


@dataclass
class RunPlan:
    """What `mailroom run` starts: the workers, their URLs, the listen URL, the metrics base port."""

    urls: dict[str, str]  # worker -> its database URL (only the enabled workers)
    listen_url: str | None = None  # None: each worker listens on its database URL
    inbox_host: str = "127.0.0.1"
    inbox_port: int = 2525
    metrics_port: int | None = None  # base: send +0, collect +1, inbox +2, expire +3, maintain +4
    http_host: str = "127.0.0.1"
    http_port: int | None = None  # the HTTP face's port (its worker in `urls` when on)
    http_args: tuple[str, ...] = ()  # more options of `http serve` (the checks: --link-check, --spamd; --sink)
    inbox_args: tuple[str, ...] = ()  # more options of `inbox serve` (--sink)


def plan(
    inbox_host: str, inbox_port: int, *, collect: bool, send: bool, expire: bool, inbox: bool,
    maintain: bool = False, metrics_port: int | None = None,
) -> list[Child]:
    """Which commands to run, in start order, without per-worker URLs (the demo's set)."""
    enabled = {"inbox": inbox, "collect": collect, "send": send, "expire": expire, "maintain": maintain}
    return children_of(RunPlan({w: "" for w, on in enabled.items() if on}, None, inbox_host, inbox_port, metrics_port))


# the secrets a worker may find in run's environment, and the workers that read each: every other
# worker's environment goes without it (the attacker review of issue 45: the HTTP and SMTP faces held
# MAILROOM_SECRET_KEY). A forked child keeps its parent's memory, run's environment block included, so
# with any of them set run starts new interpreters instead (docs/operations.md, `run`'s memory).
SECRET_ENV: dict[str, tuple[str, ...]] = {
    "MAILROOM_SECRET_KEY": ("collect", "send"),
    "MAILROOM_ENCRYPTION_KEY": ("send",),  # read only to say it is no longer used
    "MAILROOM_SMTP_PASSWORD": (),  # `outbound sender add`'s, never a worker's
}


def secrets_in_environment() -> bool:
    return any(os.environ.get(name) for name in SECRET_ENV)


def children_of(p: RunPlan, *, fork: bool = False) -> list[Child]:
    """The supervisor's children of a plan: each command with its URL and metrics port in its environment
    (fork: each a forked copy of this process, not a new interpreter: Child.fork)."""
    args = {
        "inbox": ["inbox", "serve", "--host", p.inbox_host, "--port", str(p.inbox_port), *p.inbox_args],
        "collect": ["collect", "--enqueue"]
        + ([] if os.environ.get("MAILROOM_BATCH_TIMEOUT") else ["--batch-timeout", RUN_BATCH_TIMEOUT]),
        "send": ["send"],
        "expire": ["expire"],
        "maintain": ["maintain", "--every", MAINTAIN_EVERY],
        "http": ["http", "serve", "--host", p.http_host, "--port", str(p.http_port or 0), *p.http_args],
    }
    children = []
    for worker, (_role, offset) in WORKERS.items():
        if worker not in p.urls:
            continue
        env: dict[str, str | None] = {}
        if p.urls[worker]:
            env["MAILROOM_DATABASE_URL"] = p.urls[worker]
        if p.listen_url is not None:
            env["MAILROOM_LISTEN_URL"] = p.listen_url
        if p.metrics_port is not None and worker in METRICS_ENV:
            env[METRICS_ENV[worker]] = str(p.metrics_port + offset if p.metrics_port else 0)
        for name, readers in SECRET_ENV.items():
            if worker not in readers:
                env[name] = None  # removed from this worker's environment
        children.append(Child(worker, args[worker], env=env, fork=fork))
    return children


def inbox_first(sup: Supervisor) -> None:
    """The children after the inbox server start once it serves (the module docstring: no backoff paid
    for the start order). Its ready check blocks start() until its ready byte came."""
    for child in sup.children:
        if child.name == "inbox" and child.notify:
            child.ready = lambda c: sup.wait_ready([c])


def check_logins(urls: dict[str, str], connect: Callable[[str], psycopg.Connection]) -> None:
    """Each worker's login holds the group role the worker needs (ConfigError naming it when not). A
    database that cannot be reached is not checked here: the workers wait for it."""
    seen: dict[str, tuple[str, set[str]] | None] = {}
    for worker, url in urls.items():
        if url not in seen:
            try:
                with connect(url) as conn:
                    seen[url] = (conn.info.user, granted_roles(conn))
            except (psycopg.Error, UserError):
                seen[url] = None
        found = seen[url]
        role = WORKERS[worker][0]
        if found is not None and role not in found[1]:
            login = found[0]
            raise ConfigError(
                f"{worker} needs a login granted {role}, and {login} is not: GRANT {role} TO {login}, or give "
                f"--{worker}-url a login that is (mailroom run with one URL needs mailroom_inbound, "
                "mailroom_collector and mailroom_sender; docs/operations.md)"
            )


def check_secret_key(urls: dict[str, str]) -> None:
    """MAILROOM_SECRET_KEY set and a worker that signs (collect, send) in the plan: it must be the
    keyring's active key (ConfigError, one line, exit 2). Out of reach: each child checks once connected."""
    from mailroom.db.keyring import check_at_start, env_fingerprint

    signing = [w for w in ("collect", "send") if w in urls]
    fingerprint = env_fingerprint() if signing else None
    if fingerprint is None:
        return
    url = urls[signing[0]]
    if url:
        check_at_start(url, "run", fingerprint)


def run_all(p: RunPlan, *, check: Callable[[str], psycopg.Connection] | None = None) -> int:
    """Run the plan's workers until a signal (exit 0 when all stopped cleanly) or one fails to start
    (exit 1); a worker that dies later is started again alone."""
    # forked from this process only when it holds no secret in its environment (SECRET_ENV)
    children = children_of(p, fork=not secrets_in_environment())
    if not children:
        raise ConfigError("nothing to run: every component is disabled")
    if check is not None:
        check_logins(p.urls, check)
    check_secret_key(p.urls)
    preload([module for worker in p.urls for module in PRELOAD[worker]])
    sup = Supervisor(children, env=dict(os.environ), restart=True)
    inbox_first(sup)
    if "http" in p.urls and "expire" not in p.urls:
        sup.log.warning("WARN: --no-expire: the inboxes the HTTP face creates expire only if something else "
                        "expires them (pg_cron, another `mailroom expire`; mailroom doctor checks)")

    def started() -> None:
        faces = {"inbox": f"inbox (smtp {p.inbox_host}:{p.inbox_port}{', sink' if p.inbox_args else ''})",
                 "http": f"http ({p.http_host}:{p.http_port})"}
        serving = [faces.get(c.name, c.name) for c in children]
        sup.log.info("running: %s; SIGTERM or Ctrl-C stops all", ", ".join(serving))

    return sup.run(started)
