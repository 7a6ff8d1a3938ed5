"""Prometheus metrics of every worker: one private registry each, the same standard gauges, one server.

Each long-running command (collect, send, inbox serve, expire, maintain) makes a WorkerMetrics
(its area adds its own counters to `registry`) and, with --metrics-port, serves GET /metrics on
127.0.0.1 by default. Every worker exports:

- mailroom_worker_info{kind, version} 1
- mailroom_worker_database_up: 1 while its last database call succeeded, 0 while it waits for the database
- mailroom_worker_listening: 1 while its LISTEN connection hears NOTIFY (0 for a worker that never listens)
- mailroom_worker_heartbeats_total: heartbeats it reported (mailroom.worker_heartbeat)
- mailroom_worker_database_waits_total: times it started waiting for an unreachable database

Labels are closed sets only: never an address, a subject, a worker name or error text.
"""

from __future__ import annotations

import logging
from typing import Any

from mailroom.core.errors import UserError


class _Null:
    """A metric that records nothing (a worker without --metrics-port)."""

    def __getattr__(self, _name: str) -> Any:
        return self

    def __call__(self, *_args: Any, **_kwargs: Any) -> _Null:
        return self


class NullMetrics(_Null):
    """What a worker without --metrics-port counts with: nothing, and prometheus_client not even imported."""

    def waiting(self, waiting: bool) -> None:
        pass

    def start(self, port: int | None, host: str, log: logging.Logger) -> None:
        return None

    def shutdown(self) -> None:
        pass


class WorkerMetrics:
    """The registry of one worker process and its standard gauges; see the module docstring."""

    def __init__(self, kind: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        from mailroom import __version__

        self.kind = kind
        self.registry = CollectorRegistry()
        r = self.registry
        Gauge("mailroom_worker_info", "The worker's kind and mailroom's version.", ["kind", "version"],
              registry=r).labels(kind=kind, version=__version__).set(1)
        self.database_up = Gauge(
            "mailroom_worker_database_up", "1 while the worker's last database call succeeded, 0 while it waits.",
            registry=r,
        )
        self.listening = Gauge(
            "mailroom_worker_listening", "1 while the worker's LISTEN connection hears NOTIFY.", registry=r
        )
        self.heartbeats = Counter(
            "mailroom_worker_heartbeats", "Heartbeats reported (mailroom.worker_heartbeat).", registry=r
        )
        self.database_waits = Counter(
            "mailroom_worker_database_waits", "Times the worker started waiting for an unreachable database.",
            registry=r,
        )
        self.database_up.set(1)
        self.server = None

    def waiting(self, waiting: bool) -> None:
        """The worker started (True) or stopped (False) waiting for the database (Outage.on_change)."""
        self.database_up.set(0 if waiting else 1)
        if waiting:
            self.database_waits.inc()

    def serve(self, port: int, host: str = "127.0.0.1") -> str:
        """Expose /metrics on host:port (0: any free port); returns 'host:port' (OSError when it cannot bind)."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self.server = server
        return f"{host}:{server.server_port}"

    def start(self, port: int | None, host: str, log: logging.Logger) -> str | None:
        """serve() when a port is given: the address, logged (UserError, exit 1, when it cannot bind)."""
        if port is None:
            return None
        try:
            address = self.serve(port, host)
        except OSError as exc:
            raise UserError(f"cannot listen for metrics on {host}:{port}: {exc.strerror or exc}") from None
        log.info("metrics on http://%s/metrics", address)
        return address

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
