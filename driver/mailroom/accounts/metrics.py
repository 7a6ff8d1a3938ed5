"""Prometheus metrics of the token collector (`mailroom collect --metrics-port`), with the standard
gauges of every worker (mailroom.core.metrics). Labels are closed sets: never a login or an address."""

from __future__ import annotations

from prometheus_client import Counter

from mailroom.core.metrics import WorkerMetrics


class CollectorMetrics(WorkerMetrics):
    def __init__(self) -> None:
        super().__init__("collector")
        r = self.registry
        self.tokens = Counter("mailroom_collector_tokens", "Tokens collected (written or enqueued).", registry=r)
        self.batches = Counter("mailroom_collector_batches", "Batches that held at least one token.", registry=r)
        self.reconnects = Counter(
            "mailroom_collector_reconnects", "Work connections opened again after one was lost.", registry=r
        )
