"""Run the HTTP app under uvicorn: one socket bound here (so `--port 0` logs the real port before
the workers start), `--workers` processes sharing it, each with its own pool and its one LISTEN."""

from __future__ import annotations

import logging
import os
import signal

from mailroom.core.log import get_logger
from mailroom.core.sockets import listening_socket
from mailroom.db.heartbeat import SERVES_ENV
from mailroom.http.state import CONFIG_ENV, HttpConfig

log = get_logger("http")


def serve(database_url: str, listen_url: str | None, *, host: str, port: int, workers: int, pool_size: int,
          poll_interval: float, tls_cert: str | None, tls_key: str | None, cors_origins: list[str],
          proxy: str | None, secure_cookies: bool, ses_topics: list[str], sns_cert_dir: str | None,
          sns_ca_file: str | None, sns_connect_to: str | None, access_log: bool, statement_timeout: float = 5.0,
          pool_timeout: float = 3.0, link_check: bool = False, link_check_allow: list[str] | None = None,
          spamd: str | None = None, sink_listing: bool = False, sink_public: bool = False) -> None:
    import uvicorn

    config = HttpConfig(
        database_url=database_url, listen_url=listen_url, pool_size=pool_size, poll_interval=poll_interval,
        cors_origins=cors_origins, ses_topics=ses_topics, sns_cert_dir=sns_cert_dir, sns_ca_file=sns_ca_file,
        sns_connect_to=sns_connect_to, secure_cookies=secure_cookies, access_log=access_log,
        statement_timeout=statement_timeout, pool_timeout=pool_timeout,
        link_check=link_check, link_check_allow=link_check_allow or [], spamd=spamd, sink_listing=sink_listing,
        sink_public=sink_public,
    )
    os.environ[CONFIG_ENV] = config.to_env()  # the worker processes build their app from it
    sock = listening_socket(host, port)
    sock.set_inheritable(True)
    bound = sock.getsockname()[1]
    scheme = "https" if tls_cert else "http"
    os.environ[SERVES_ENV] = f"{scheme} {host}:{bound}"  # the heartbeat's `serves` (mailroom status)
    log.info("listening on %s:%d (%s, %d worker(s), pool %d each%s)", host, bound, scheme, workers, pool_size,
             f", SES topics {len(ses_topics)}" if ses_topics else "")
    # uvicorn's own access log would carry each path (an inbox's address): off; ours names the route
    logging.getLogger("uvicorn.access").disabled = True
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then raises the signal again for the handler it
    # found: with Python's defaults that kills the process (-15) or raises KeyboardInterrupt. Ours
    # ignore it, so a stopped server exits 0 like every other worker (`mailroom run`, systemd).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _signum, _frame: None)
    if workers > 1:  # the worker processes do not inherit the ready pipe: the bound socket is the signal
        from mailroom.core.ready import notify_ready

        notify_ready()
    uvicorn.run(
        "mailroom.http.app:create_app", factory=True, fd=sock.fileno(), workers=workers if workers > 1 else None,
        ssl_certfile=tls_cert, ssl_keyfile=tls_key, proxy_headers=bool(proxy), forwarded_allow_ips=proxy or "",
        access_log=False, log_level="warning", timeout_graceful_shutdown=5, server_header=False,
        lifespan="on",
    )
