"""`mailroom doctor`: check a deployment, one line per check (OK, WARN or FAIL).

It connects as whoever the URL names (run it as each worker's role to check that role) and
looks at: the server version, the migrations, the roles, whether the URL goes through a
transaction pooler, whether LISTEN/NOTIFY round-trips on the listen URL, server logging that
would write bind parameters (the bearer credentials callers send: links, codes, session tokens)
to the log, clock pinning, and whether anything expires inboxes (an expiry worker reporting in, or
a pg_cron job: the HTTP face and the SMTP server create inboxes but never expire them).

A transaction pooler is recognised by what it does, not by its name: the backend pid differs from
the one the connection was given at start-up (something speaks for the server), and session state
set on this connection shows up on a second one, or this connection's transactions run on several
backends (they are handed out per transaction). PgBouncer reuses the last server first, so a lone
client often keeps one backend: the second connection is what catches it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from mailroom.core.errors import describe_db_error
from mailroom.db import migrate as runner
from mailroom.db.connect import connection_kwargs
from mailroom.ops import probes

ROLES = ("mailroom_owner", "mailroom_app", "mailroom_collector", "mailroom_sender", "mailroom_inbound",
         "mailroom_monitor", "mailroom_admin", "mailroom_timekeeper")


@dataclass
class Check:
    status: str  # OK | WARN | FAIL
    name: str
    text: str

    def line(self) -> str:
        return f"{self.status:<4}  {self.name}: {self.text}"


def _connect(url: str, name: str = "mailroom-doctor") -> psycopg.Connection:
    return psycopg.connect(url, **connection_kwargs(application_name=name, connect_timeout=10))


def run_checks(url: str, listen_url: str | None) -> list[Check]:
    checks: list[Check] = []
    try:
        conn = _connect(url)
    except psycopg.Error as exc:
        return [Check("FAIL", "connect", describe_db_error(exc))]
    with conn:
        checks.append(_guarded("server", _version, conn))
        checks.append(_guarded("migrations", _migrations, conn))
        checks.append(_guarded("roles", _roles, conn))
        checks.append(_guarded("login role", _role_in_use, conn))
        pooler = _guarded("pooler", _pooler, conn, url)
        checks.append(pooler)
        checks.append(_guarded("server log", _logging, conn))
        checks.append(_guarded("clock", _clock, conn))
        checks.append(_guarded("expiry", _expiry, conn))
        checks.extend(_dkim(conn))
    listen = _listen(listen_url)
    if listen.status == "FAIL" and listen_url == url and pooler.text.startswith(TRANSACTION_POOLING):
        listen.text = ("the listen URL is the database URL, which goes through a transaction pooler: LISTEN cannot "
                       "work there; set MAILROOM_LISTEN_URL (--listen-url) to a direct connection (workers poll until then)")
    checks.append(listen)
    return checks


NAMESERVER_ENV = "MAILROOM_DOCTOR_NAMESERVER"  # ip[:port] of the resolver to ask (default: the system's)


def _resolver():  # noqa: ANN202 - a dns.resolver.Resolver
    import os

    import dns.resolver

    where = os.environ.get(NAMESERVER_ENV)
    if not where:
        resolver = dns.resolver.Resolver()
    else:
        resolver = dns.resolver.Resolver(configure=False)
        host, _, port = where.partition(":")
        resolver.nameservers = [host]
        resolver.port = int(port or 53)
    resolver.lifetime = 3.0
    return resolver


def _dkim(conn: psycopg.Connection) -> list[Check]:
    """Each DKIM key's TXT record as DNS publishes it, against the public half in the database
    (mailroom.list_dkim_keys): OK when they match, FAIL when DNS publishes another key, WARN when
    the record is missing or DNS cannot be reached (said so: nothing was checked)."""
    import dns.exception
    import dns.resolver

    from mailroom.db import sqlapi

    try:
        keys = sqlapi.list_dkim_keys.rows(conn)
    except psycopg.errors.InsufficientPrivilege:
        conn.rollback()
        return [Check("OK", "dkim", "not checked: this login may not list the DKIM keys (admin, monitor or sender may)")]
    except psycopg.Error as exc:  # not installed, or a schema before DKIM: the migrations check says so
        conn.rollback()
        return [Check("WARN", "dkim", f"not checked: {describe_db_error(exc)}")]
    if not keys:
        return [Check("OK", "dkim", "no DKIM key: outbound mail is not signed (`mailroom outbound dkim keygen`)")]
    resolver = _resolver()
    checks = []
    for key in keys:
        name = f"dkim {key.domain}"
        try:
            answer = resolver.resolve(key.dns_name, "TXT")
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            checks.append(Check("WARN", name, f"no TXT record at {key.dns_name}: receivers cannot verify its mail; "
                                              f"publish {key.dns_value[:40]}…"))
            continue
        except (dns.exception.Timeout, dns.resolver.NoNameservers, OSError) as exc:
            checks.append(Check("WARN", name, f"DNS not reachable ({type(exc).__name__}): the record at {key.dns_name} "
                                              "was not checked"))
            continue
        published = ["".join(part.decode("ascii", "replace") for part in r.strings) for r in answer]
        found = [p for p in published if p.replace(" ", "").startswith("v=DKIM1")]
        public = [dict(kv.strip().split("=", 1) for kv in p.split(";") if "=" in kv).get("p", "").replace(" ", "")
                  for p in found]
        if key.public_key in public:
            checks.append(Check("OK", name, f"selector {key.selector}: the published record matches"))
        else:
            checks.append(Check("FAIL", name, f"the record at {key.dns_name} publishes another key: signatures fail "
                                              f"until it is {key.dns_value[:40]}…"))
    return checks


def _guarded(name: str, check: Callable[..., Check], *args: object) -> Check:
    """A check that hits an unexpected database error FAILs with it instead of ending the doctor."""
    try:
        return check(*args)
    except psycopg.Error as exc:
        return Check("FAIL", name, f"could not check: {describe_db_error(exc)}")


def _version(conn: psycopg.Connection) -> Check:
    num, text = probes.server_version(conn)
    if num >= 150000:
        return Check("OK", "server", f"PostgreSQL {text}")
    return Check("FAIL", "server", f"PostgreSQL {text}: mailroom needs 15 or newer")


def _migrations(conn: psycopg.Connection) -> Check:
    """The database's schema version next to the one this driver expects (any runtime login may ask:
    mailroom.list_migrations()); pending or edited migrations; a database newer than the driver."""
    from mailroom import __version__
    from mailroom.db.files import schema_version

    expected = schema_version()
    have = runner.database_schema(conn)
    if not have.installed:
        return Check("FAIL", "migrations", "mailroom is not installed in this database (run `mailroom db migrate`)")
    if have.applied is None:
        return Check("WARN", "migrations", f"cannot tell the schema version: {have.reason}")
    applied = have.applied
    files = runner.load_migrations()
    pending = [m.name for m in files if m.version not in applied]
    edited = [m.name for m in files if m.version in applied and not runner.checksum_accepted(m, applied[m.version][1])]
    unknown = [applied[v][0] for v in sorted(applied) if v > expected]
    if edited:
        return Check("FAIL", "migrations", f"applied files changed since: {', '.join(edited)}")
    if pending:
        return Check("FAIL", "migrations", f"schema {have.version}, mailroom {__version__} expects {expected}: "
                                           f"{len(pending)} pending: {', '.join(pending)} (run `mailroom db migrate`)")
    if unknown:
        return Check("WARN", "migrations", f"schema {have.version} is newer than mailroom {__version__} expects "
                                           f"({expected}): {', '.join(unknown)}; upgrade this installation's package")
    return Check("OK", "migrations", f"schema {have.version} ({len(applied)} migrations), the one expected by "
                                     f"mailroom {__version__}")


def _roles(conn: psycopg.Connection) -> Check:
    present = probes.existing_roles(conn, list(ROLES))
    missing = [r for r in ROLES if r not in present]
    if missing:
        return Check("FAIL", "roles", f"missing: {', '.join(missing)}")
    return Check("OK", "roles", "all mailroom_* roles exist")


def _role_in_use(conn: psycopg.Connection) -> Check:
    name, is_super, is_owner, groups = probes.login_role(conn)
    if is_super:
        return Check("WARN", "login role", f"{name} is a superuser: run workers as a login role granted one mailroom_* role")
    if is_owner:
        return Check("WARN", "login role", f"{name} can act as mailroom_owner: runtime workers should not")
    if not groups:
        return Check("FAIL", "login role", f"{name} is granted no mailroom_* role: it can call nothing")
    return Check("OK", "login role", f"{name} acts as {', '.join(groups)}")


TRANSACTION_POOLING = "transaction pooling detected"


def _pooler(conn: psycopg.Connection, url: str) -> Check:
    """A pooler in front (backend pid) and whether it pools transactions (session state moves)."""
    started_with = conn.info.backend_pid  # from the start-up message: a pooler sends its own
    pids = {probes.backend_pid(conn) for _ in range(5)}
    probe = secrets.token_hex(8)
    probes.set_session_value(conn, probe)
    leaked = False
    try:
        with _connect(url, "mailroom-doctor-probe") as other:
            # a pooler hands the probe's server connection to the next client (with round robin
            # within a pool's size of transactions); a session never shows another one's state
            leaked = any(probes.session_value(other) == probe for _ in range(8))
    except psycopg.Error:
        pass
    kept = probes.session_value(conn) == probe
    probes.set_session_value(conn, "")
    if len(pids) > 1 or leaked or not kept:
        return Check("OK", "pooler", f"{TRANSACTION_POOLING} (e.g. PgBouncer pool_mode = transaction): fine for calls; "
                                     "LISTEN needs a direct --listen-url; db migrate needs a direct URL")
    if started_with not in pids:
        return Check("OK", "pooler", "a session pooler or proxy answers for the server (session state is kept)")
    return Check("OK", "pooler", "direct connection")


# What a caller sends by design and a parameter-logging server therefore records (docs/security.md,
# "Server logs"): no key or relay password travels, but these bearer credentials must.
BEARER = "the links and codes applications consume, inbox session tokens"


def _logging(conn: psycopg.Connection) -> Check:
    """Would the server write bind parameters to its log?

    No key and no relay password is ever a parameter (the keyring and the sender key stay put), but
    some values are bearer credentials a caller must send: the link it consumes, a recovery code,
    an inbox session token. Logged statements carry their parameters unless
    log_parameter_max_length = 0; a failing statement's error carries them unless
    log_parameter_max_length_on_error = 0. Read in this session: database and role settings apply."""
    settings = probes.log_settings(conn)
    logs_statements = (
        settings.get("log_statement") == "all"
        or int(settings.get("log_min_duration_statement", "-1")) >= 0
        or int(settings.get("log_min_duration_sample", "-1")) >= 0
    )
    params_logged = settings.get("log_parameter_max_length", "-1") != "0"
    params_on_error = settings.get("log_parameter_max_length_on_error", "0") != "0"
    problems = []
    if logs_statements and params_logged:
        problems.append("statements are logged with their bind parameters")
    if params_on_error:
        problems.append("failing statements are logged (and reported) with their bind parameters")
    if problems:
        return Check(
            "WARN", "server log",
            f"{'; '.join(problems)}: the log records bearer credentials callers send ({BEARER}; no key or relay "
            "password); ALTER DATABASE … SET log_parameter_max_length = 0, log_parameter_max_length_on_error = 0 "
            "(docs/security.md)",
        )
    if logs_statements:
        return Check("OK", "server log", "statements are logged without bind parameters")
    return Check("OK", "server log", "statements are not logged")


def _clock(conn: psycopg.Connection) -> Check:
    may_pin = probes.may_pin_clock(conn)
    if may_pin:
        return Check("WARN", "clock", "this login may pin mailroom.clock() (tests and demos only)")
    return Check("OK", "clock", "this login cannot move mailroom.clock()")


EXPIRY_FIX = ("run `mailroom expire` (or `mailroom run`), or schedule CALL mailroom.run_expiry() with pg_cron "
              "(docs/operations.md)")


def _expiry(conn: psycopg.Connection) -> Check:
    """WARN when no process has expired inboxes recently (no expiry worker running: one that reported in
    within workers.lost_after, mailroom.worker_health) and pg_cron schedules no expiry job. Inboxes past
    their expiry (mailroom.queue_health) are counted in the line. A login that may not read the workers
    (mailroom_monitor) gets a WARN saying so."""
    from mailroom.db import sqlapi

    cron = probes.cron_expiry_jobs(conn)
    if cron:
        return Check("OK", "expiry", f"pg_cron runs inbox expiry (job {', '.join(cron)})")
    try:
        with conn.transaction():
            workers = sqlapi.worker_health.rows(conn)
            overdue = {r.queue: r for r in sqlapi.queue_health.rows(conn)}.get("inbox_expiry")
    except psycopg.errors.InsufficientPrivilege:
        return Check("WARN", "expiry", "cannot tell whether anything expires inboxes: this login may not read "
                                      "mailroom.worker_health() (grant it mailroom_monitor, or run doctor as one)")
    running = [w for w in workers if w.kind == "expiry" and w.state == "running"]
    if running:
        return Check("OK", "expiry", f"{len(running)} expiry worker(s) running")
    late = ""
    if overdue is not None and overdue.due:
        late = f"; {overdue.due} inbox(es) past their expiry, the oldest for {overdue.oldest_due_age_seconds:.0f}s"
    where = "pg_cron schedules no expiry job" if cron is not None else "pg_cron is not installed"
    return Check("WARN", "expiry", f"no process has expired inboxes recently (no expiry worker has reported in) and "
                                   f"{where}{late}: {EXPIRY_FIX}")


def _listen(listen_url: str | None) -> Check:
    if listen_url is None:
        return Check("WARN", "listen", "no listen URL: workers poll (set MAILROOM_LISTEN_URL to a direct connection)")
    channel = f"mailroom_doctor_{secrets.token_hex(4)}"
    nonce = secrets.token_hex(8)
    try:
        with _connect(listen_url, "mailroom-doctor-listen") as listener:
            probes.listen(listener, channel)
            with _connect(listen_url, "mailroom-doctor-notify") as notifier:
                probes.notify(notifier, channel, nonce)
            deadline = time.monotonic() + 3
            while (left := deadline - time.monotonic()) > 0:
                for note in listener.notifies(timeout=left, stop_after=1):
                    if note.payload == nonce:
                        return Check("OK", "listen", "LISTEN/NOTIFY round-trips on the listen URL")
    except psycopg.Error as exc:
        return Check("FAIL", "listen", f"cannot LISTEN on the listen URL ({describe_db_error(exc)})")
    return Check("FAIL", "listen", "NOTIFY did not come back on the listen URL (a transaction pooler?): workers will poll")
