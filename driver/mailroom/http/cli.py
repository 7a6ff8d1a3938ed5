"""`mailroom http serve`, `mailroom apikey …`, `mailroom smtpcred …` and `mailroom catchall …`: the HTTP
face's commands.

`http serve` runs mailroom.http.app under uvicorn (FastAPI, imported only by this command);
`apikey`, `smtpcred` and `catchall` are operator commands (role mailroom_admin), one SQL call each.
`smtpcred` (the SMTP capture credential of `inbox serve`'s AUTH) sits beside `apikey`, its model: its
SQL and its digest are the inboxes' (mailroom.inboxes.sqlapi, mailroom.inboxes.auth).
"""

from __future__ import annotations

import json
import secrets
from typing import Annotated, Any, Optional

import typer

from mailroom.core.errors import ConfigError
from mailroom.core.options import duration_option, new_app
from mailroom.db.config import DatabaseUrlOption, ListenUrlOption, resolve_database_url, resolve_listen_url

http_app = new_app("http", "The inboxes' HTTP face: REST API, web page, live events, SES hook.")
apikey_app = new_app("apikey", "API keys (owner type api) of the HTTP API.")
smtpcred_app = new_app(
    "smtpcred", "SMTP capture credentials: an app's SMTP login whose mail all goes to its owner's capture inbox.")
catchall_app = new_app("catchall", "Catch-all inbox domains: unknown addresses get an inbox at RCPT.")

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]


def _print_rows(rows: list[Any], as_json: bool) -> None:
    for row in rows:
        record = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row._asdict().items()}
        if as_json:
            print(json.dumps(record))
        else:
            print("  ".join(f"{k}={v}" for k, v in record.items() if v is not None))


@http_app.command("serve")
def serve_cmd(
    database_url: DatabaseUrlOption = None,
    listen_url: ListenUrlOption = None,
    host: Annotated[str, typer.Option(envvar="MAILROOM_HTTP_HOST", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="MAILROOM_HTTP_PORT", help="TCP port (0: any free port).")] = 8025,
    workers: Annotated[int, typer.Option(envvar="MAILROOM_HTTP_WORKERS",
                                         help="Server processes on the port, each with its pool and one LISTEN.")] = 1,
    pool_size: Annotated[int, typer.Option(envvar="MAILROOM_HTTP_POOL_SIZE",
                                           help="Database connections of each process.")] = 8,
    poll_interval: Annotated[float, duration_option(
        "--poll-interval", positive=True, maximum=3600,
        help="Between looks of event streams and long polls while LISTEN is down.")] = "2s",
    tls_cert: Annotated[Optional[str], typer.Option(envvar="MAILROOM_HTTP_TLS_CERT",
                                                    help="PEM certificate: serve HTTPS.")] = None,
    tls_key: Annotated[Optional[str], typer.Option(envvar="MAILROOM_HTTP_TLS_KEY", help="PEM private key of --tls-cert.")] = None,
    cors_origin: Annotated[Optional[list[str]], typer.Option(
        help="An origin allowed to call the API from a browser (repeatable; default: none, CORS off).")] = None,
    proxy: Annotated[Optional[str], typer.Option(
        envvar="MAILROOM_HTTP_PROXY",
        help="Addresses of a trusted reverse proxy: its X-Forwarded-For/-Proto are believed (comma-separated).")] = None,
    secure_cookies: Annotated[Optional[bool], typer.Option(
        help="Mark the page's cookie Secure (default: with --tls-cert or --proxy).")] = None,
    ses_topic: Annotated[Optional[list[str]], typer.Option(
        envvar="MAILROOM_SES_TOPICS",
        help="SNS topic ARN whose SES receipts POST /hooks/ses accepts (repeatable; none: the hook is off).")] = None,
    sns_cert_dir: Annotated[Optional[str], typer.Option(
        envvar="MAILROOM_SNS_CERT_DIR", help="Directory of SNS signing certificates (instead of fetching them).")] = None,
    sns_ca_file: Annotated[Optional[str], typer.Option(
        envvar="MAILROOM_SNS_CA_FILE", help="CA bundle for fetching SNS certificates and confirming subscriptions.")] = None,
    sns_connect_to: Annotated[Optional[str], typer.Option(
        envvar="MAILROOM_SNS_CONNECT_TO", hidden=True, help="host:port that SNS HTTPS requests go to (tests).")] = None,
    access_log: Annotated[bool, typer.Option(help="Log one line per request (the route, never the address).")] = False,
    statement_timeout: Annotated[float, duration_option(
        "--statement-timeout", positive=True, maximum=600,
        help="Each request's SQL statement at most this long (SET LOCAL statement_timeout), then 504.")] = "5s",
    pool_timeout: Annotated[float, duration_option(
        "--pool-timeout", positive=True, maximum=600,
        help="A request waits this long for a database connection, then 503 with Retry-After.")] = "3s",
    link_check: Annotated[bool, typer.Option(
        envvar="MAILROOM_LINK_CHECK",
        help="Run the link check (GET …/checks/links: the server fetches every link of a message; off: 503).")] = False,
    link_check_allow: Annotated[Optional[list[str]], typer.Option(
        envvar="MAILROOM_LINK_CHECK_ALLOW", metavar="CIDR",
        help="A network the link check may reach although private or loopback (CIDR, repeatable, comma-separated).")] = None,
    spamd: Annotated[Optional[str], typer.Option(
        envvar="MAILROOM_SPAMD", metavar="HOST:PORT",
        help="host:port of a SpamAssassin spamd: runs the spam check (off: 503).")] = None,
    sink: Annotated[bool, typer.Option(
        envvar="MAILROOM_HTTP_SINK",
        help="The sink (docs/inboxes.md): on a loopback bind, the inbox listing needs no key and lists the sink's "
        "inboxes.")] = False,
    sink_public: Annotated[bool, typer.Option(
        "--sink-public", envvar="MAILROOM_HTTP_SINK_PUBLIC",
        help="With --sink on an address that is not loopback: list the sink's inboxes without a key there too "
        "(anyone who reaches the port reads them).")] = False,
) -> None:
    """Serve the REST API (/api/v1, /docs), the inbox page (/inbox/{address}) and the SES hook."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {port}")
    for name, value in (("--workers", workers), ("--pool-size", pool_size)):
        if value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}")
    if bool(tls_cert) != bool(tls_key):
        raise ConfigError("--tls-cert and --tls-key go together")
    topics = [t.strip() for value in ses_topic or [] for t in value.split(",") if t.strip()]
    if sns_cert_dir is not None:
        from pathlib import Path

        if not Path(sns_cert_dir).is_dir():
            raise ConfigError(f"--sns-cert-dir {sns_cert_dir} is not a directory")
    allow = [n.strip() for value in link_check_allow or [] for n in value.split(",") if n.strip()]
    from mailroom.checks.links import LinkPolicy
    from mailroom.checks.spam import Spamd

    try:
        LinkPolicy.parse(allow)
        if spamd:
            Spamd.parse(spamd)
    except ValueError as exc:
        raise ConfigError(f"--link-check-allow: {exc}" if "network" in str(exc) else str(exc)) from None
    if allow and not link_check:
        raise ConfigError("--link-check-allow goes with --link-check")
    if sink_public and not sink:
        raise ConfigError("--sink-public goes with --sink")
    sink_listing = sink and (sink_public or is_loopback(host))
    if sink and not sink_listing:
        from mailroom.core.log import get_logger

        get_logger("http").warning(f"--sink on {host}, not loopback: the inbox listing still needs a key "
                                   "(--sink-public lists the sink's inboxes to anyone who reaches the port)")
    elif sink and not is_loopback(host):
        from mailroom.core.log import get_logger

        get_logger("http").warning(f"WARN: --sink-public: anyone who reaches {host}:{port} lists and reads the "
                                   "sink's inboxes without a key")
    url = resolve_database_url(database_url)
    from mailroom.http.server import serve

    serve(
        url, resolve_listen_url(listen_url, url), host=host, port=port, workers=workers, pool_size=pool_size,
        poll_interval=poll_interval, tls_cert=tls_cert, tls_key=tls_key, cors_origins=cors_origin or [],
        proxy=proxy, secure_cookies=secure_cookies if secure_cookies is not None else bool(tls_cert or proxy),
        ses_topics=topics, sns_cert_dir=sns_cert_dir, sns_ca_file=sns_ca_file, sns_connect_to=sns_connect_to,
        access_log=access_log, statement_timeout=statement_timeout, pool_timeout=pool_timeout,
        link_check=link_check, link_check_allow=allow, spamd=spamd, sink_listing=sink_listing,
        sink_public=sink_public,
    )


def is_loopback(host: str) -> bool:
    """Whether a bind address is loopback only (127.0.0.0/8, ::1, localhost): the sink's open listing."""
    import ipaddress

    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@apikey_app.command("create")
def apikey_create(
    owner: Annotated[str, typer.Argument(
        metavar="OWNER", help="Owner id: the API key reads and creates inboxes of owner (api, OWNER).")],
    label: Annotated[Optional[str], typer.Option(help="A note to tell keys apart.")] = None,
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make an API key for OWNER; it is printed once (the database keeps only its sha256)."""
    from mailroom.core.credentials import key_digest
    from mailroom.db.connect import call_once
    from mailroom.http import sqlapi

    key = "mrk_" + secrets.token_urlsafe(32)
    rows = call_once(resolve_database_url(database_url), sqlapi.create_api_key, application_name="mailroom-apikey",
                     owner_id=owner, key_digest=key_digest(key), label=label, hint=key[-4:])
    record = {"key_id": rows[0][0], "owner_id": owner, "api_key": key}
    if as_json:
        print(json.dumps(record))
    else:
        print(f"key_id: {record['key_id']}\nowner_id: {owner}\napi_key: {key}\n(shown once: store it now)")


@apikey_app.command("list")
def apikey_list(
    owner: Annotated[Optional[str], typer.Option(help="Only this owner's keys.")] = None,
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """List API keys (never the key: its last 4 characters)."""
    from mailroom.db.connect import call_once
    from mailroom.http import sqlapi

    _print_rows(call_once(resolve_database_url(database_url), sqlapi.list_api_keys,
                          application_name="mailroom-apikey", owner_id=owner), as_json)


@apikey_app.command("revoke")
def apikey_revoke(
    key_id: Annotated[int, typer.Argument(metavar="ID", help="The key's id (apikey list).")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Revoke an API key: its next request is refused (401)."""
    from mailroom.db.connect import call_once
    from mailroom.http import sqlapi

    rows = call_once(resolve_database_url(database_url), sqlapi.revoke_api_key, application_name="mailroom-apikey",
                     key_id=key_id)
    print("revoked" if rows[0][0] else "already revoked")


@apikey_app.command("grant-sender")
def apikey_grant_sender(
    key_id: Annotated[int, typer.Argument(metavar="KEY_ID", help="The key's id (apikey list).")],
    sender: Annotated[str, typer.Argument(metavar="SENDER", help="An outbound sender's name (outbound sender list).")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Let an API key send mail over HTTP (POST /api/v1/send) through SENDER, to send.allowed_recipients."""
    from mailroom.db.connect import call_once
    from mailroom.http import sqlapi

    rows = call_once(resolve_database_url(database_url), sqlapi.grant_api_key_sender,
                     application_name="mailroom-apikey", key_id=key_id, sender=sender)
    print("granted" if rows[0][0] else "already granted")


@apikey_app.command("revoke-sender")
def apikey_revoke_sender(
    key_id: Annotated[int, typer.Argument(metavar="KEY_ID", help="The key's id (apikey list).")],
    sender: Annotated[str, typer.Argument(metavar="SENDER", help="The sender's name.")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Take back an API key's grant of SENDER: its next send through it is refused (403)."""
    from mailroom.db.connect import call_once
    from mailroom.http import sqlapi

    rows = call_once(resolve_database_url(database_url), sqlapi.revoke_api_key_sender,
                     application_name="mailroom-apikey", key_id=key_id, sender=sender)
    print("revoked" if rows[0][0] else "not granted")


@apikey_app.command("senders")
def apikey_senders(
    key_id: Annotated[Optional[int], typer.Argument(metavar="KEY_ID", help="Only this key's grants.")] = None,
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the senders API keys may send through over HTTP (grant-sender)."""
    from mailroom.db.connect import call_once
    from mailroom.http import sqlapi

    _print_rows(call_once(resolve_database_url(database_url), sqlapi.list_api_key_senders,
                          application_name="mailroom-apikey", key_id=key_id), as_json)


@smtpcred_app.command("create")
def smtpcred_create(
    owner: Annotated[str, typer.Option(
        help="Owner id: the capture inbox is of owner (api, OWNER), read with an API key of OWNER.")],
    label: Annotated[Optional[str], typer.Option(help="A note to tell credentials apart.")] = None,
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """Make an SMTP login for OWNER (username and secret, printed once: the database keeps only the
    secret's sha256) and its capture inbox."""
    from mailroom.db.connect import call_once
    from mailroom.inboxes import sqlapi
    from mailroom.inboxes.auth import new_secret, secret_digest

    secret = new_secret()
    rows = call_once(resolve_database_url(database_url), sqlapi.create_smtp_credential,
                     application_name="mailroom-smtpcred", owner_id=owner, digest=secret_digest(secret), label=label)
    row = rows[0]
    record = {"credential_id": row.credential_id, "owner_id": owner, "username": row.username, "secret": secret,
              "capture_address": row.capture_address, "expires_at": row.expires_at.isoformat()}
    if as_json:
        print(json.dumps(record))
    else:
        print("\n".join(f"{k}: {v}" for k, v in record.items()) + "\n(the secret is shown once: store it now)")


@smtpcred_app.command("list")
def smtpcred_list(
    owner: Annotated[Optional[str], typer.Option(help="Only this owner's credentials.")] = None,
    database_url: DatabaseUrlOption = None,
    as_json: JsonOption = False,
) -> None:
    """List SMTP capture credentials (never a secret or its digest)."""
    from mailroom.db.connect import call_once
    from mailroom.inboxes import sqlapi

    _print_rows(call_once(resolve_database_url(database_url), sqlapi.list_smtp_credentials,
                          application_name="mailroom-smtpcred", owner_id=owner), as_json)


@smtpcred_app.command("revoke")
def smtpcred_revoke(
    credential_id: Annotated[int, typer.Argument(metavar="ID", help="The credential's id (smtpcred list).")],
    database_url: DatabaseUrlOption = None,
) -> None:
    """Revoke an SMTP capture credential: its next login is refused (535)."""
    from mailroom.db.connect import call_once
    from mailroom.inboxes import sqlapi

    rows = call_once(resolve_database_url(database_url), sqlapi.revoke_smtp_credential,
                     application_name="mailroom-smtpcred", credential_id=credential_id)
    print("revoked" if rows[0][0] else "already revoked")


@catchall_app.command("set")
def catchall_set(
    domain: Annotated[str, typer.Argument(metavar="DOMAIN", help="The domain (its MX points at `mailroom inbox serve`).")],
    owner: Annotated[str, typer.Option(help="Owner id of its inboxes: an API key of this owner reads them.")],
    plan: Annotated[str, typer.Option(help="Plan of its inboxes.")] = "free",
    max_open: Annotated[int, typer.Option(help="Quota: inboxes of the domain open at once.")] = 100,
    ttl: Annotated[Optional[float], duration_option(
        "--ttl", positive=True, help="The inboxes' TTL, whole minutes (default: the plan's).")] = None,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Make DOMAIN catch-all: the first RCPT to an unknown address on it creates that inbox."""
    from mailroom.db.connect import call_once
    from mailroom.http import sqlapi

    call_once(resolve_database_url(database_url), sqlapi.set_catchall_domain, application_name="mailroom-catchall",
              domain=domain, owner_id=owner, plan=plan, max_open=max_open,
              ttl_minutes=None if ttl is None else max(1, round(ttl / 60)))
    print(f"catch-all: {domain.strip().lower()}")


@catchall_app.command("list")
def catchall_list(database_url: DatabaseUrlOption = None, as_json: JsonOption = False) -> None:
    """The catch-all domains, their owner, plan, quota and open inboxes."""
    from mailroom.db.connect import call_once
    from mailroom.http import sqlapi

    _print_rows(call_once(resolve_database_url(database_url), sqlapi.list_catchall_domains,
                          application_name="mailroom-catchall"), as_json)


@catchall_app.command("remove")
def catchall_remove(domain: Annotated[str, typer.Argument(metavar="DOMAIN")], database_url: DatabaseUrlOption = None) -> None:
    """Stop DOMAIN being catch-all (its inboxes stay until they expire)."""
    from mailroom.db.connect import call_once
    from mailroom.http import sqlapi

    rows = call_once(resolve_database_url(database_url), sqlapi.remove_catchall_domain,
                     application_name="mailroom-catchall", domain=domain)
    print("removed" if rows[0][0] else "was not catch-all")
