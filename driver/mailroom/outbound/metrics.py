"""Prometheus metrics of the outbound sender.

Labels are closed sets only (result, SMTP class, status): never an address, subject,
Message-ID or error text (CONTRIBUTING.md: error_log is sensitive).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from mailroom.core.metrics import WorkerMetrics

# The reply classes mailroom.finalize_messages reports (mailroom_internal._reply_class): the `smtp_class` label.
SMTP_CLASSES = ("2xx", "4xx", "5xx", "dropped", "timeout", "connect", "uncertain", "local", "other")
RESULTS = ("sent", "retry", "failed", "stale")
STATUSES = ("queued", "held", "processing", "sent", "failed", "cancelled")
QUEUES = ("outbound", "tokens", "inbox_expiry")  # the `queue` label: mailroom.queue_health() rows


class SenderMetrics(WorkerMetrics):
    """All sender metrics in a private registry (so tests can run several senders), with the standard
    gauges of every worker (mailroom.core.metrics)."""

    def __init__(self) -> None:
        super().__init__("sender")
        r = self.registry
        self.messages = Counter(
            "mailroom_outbound_messages",
            "Delivery outcomes recorded by finalize_messages, by result and SMTP class.",
            ["result", "smtp_class"],
            registry=r,
        )
        self.send_seconds = Histogram(
            "mailroom_outbound_send_seconds",
            "Time of one SMTP delivery attempt (connection reuse included).",
            ["smtp_class"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.claimed = Counter(
            "mailroom_outbound_claimed_messages", "Messages claimed by this sender.", registry=r
        )
        self.released = Counter(
            "mailroom_outbound_released_messages",
            "Claimed messages given back unattempted (shutdown, lease budget).",
            registry=r,
        )
        self.reaped = Counter(
            "mailroom_outbound_reaped_messages", "Stuck messages taken back by this sender's reaper.", registry=r
        )
        self.smtp_connections = Counter(
            "mailroom_outbound_smtp_connections", "SMTP connections opened.", registry=r
        )
        self.queue = Gauge(
            "mailroom_outbound_queue_messages", "Messages in the queue by status (stats view).", ["status"], registry=r
        )
        self.due_now = Gauge("mailroom_outbound_due_messages", "Queued messages due now (held back by limits excluded).",
                             registry=r)
        self.held_back = Gauge(
            "mailroom_outbound_held_back_messages", "Queued messages due but held back by a domain limit or backoff.",
            registry=r,
        )
        self.retries_waiting = Gauge(
            "mailroom_outbound_retries_waiting_messages", "Queued messages waiting for a retry.", registry=r
        )
        self.possibly_sent = Gauge(
            "mailroom_outbound_possibly_sent_messages", "Messages flagged possibly sent by the reaper.", registry=r
        )
        self.oldest_queued = Gauge(
            "mailroom_outbound_oldest_queued_age_seconds", "Age of the oldest eligible queued message.", registry=r
        )
        self.stale_outcomes = Gauge(
            "mailroom_outbound_stale_outcomes",
            "Outcomes ignored by fencing since the database was created (stats view).",
            registry=r,
        )
        self.webhook_possible_duplicates = Gauge(
            "mailroom_outbound_webhook_possible_duplicates",
            "Webhook deliveries made again after a lost answer (the receiver may have them twice; stats view).",
            registry=r,
        )
        self.queue_due = Gauge(
            "mailroom_queue_due", "Rows due now, by queue (mailroom.queue_health).", ["queue"], registry=r
        )
        self.queue_oldest_due_age = Gauge(
            "mailroom_queue_oldest_due_age_seconds",
            "Seconds since the oldest due row of the queue became due (mailroom.queue_health).",
            ["queue"],
            registry=r,
        )
        self.queue_expired_leases = Gauge(
            "mailroom_queue_expired_leases",
            "Rows processing under an expired lease: a dead worker's claims (mailroom.queue_health).",
            ["queue"],
            registry=r,
        )
        # the children of each label set, looked up once (labels() takes a lock and builds a key each call)
        self._messages = {(result, cls): self.messages.labels(result=result, smtp_class=cls)
                          for result in RESULTS for cls in SMTP_CLASSES}
        self._seconds = {cls: self.send_seconds.labels(smtp_class=cls) for cls in SMTP_CLASSES}

    def record(self, result: str, cls: str, seconds: float | None) -> None:
        counter = self._messages.get((result, cls))
        (counter or self.messages.labels(result=result, smtp_class=cls)).inc()
        if seconds is not None:
            (self._seconds.get(cls) or self.send_seconds.labels(smtp_class=cls)).observe(seconds)

    def update_stats(self, stats: dict) -> None:
        """Copy one row of mailroom.outbound_stats into the gauges."""
        for status in STATUSES:
            self.queue.labels(status=status).set(float(stats[status]))
        self.due_now.set(float(stats["due_now"]))
        self.held_back.set(float(stats["held_back"]))
        self.retries_waiting.set(float(stats["retries_waiting"]))
        self.possibly_sent.set(float(stats["possibly_sent"]))
        self.oldest_queued.set(float(stats["oldest_queued_age_seconds"]))
        self.stale_outcomes.set(float(stats["stale_outcomes"] or 0))
        self.webhook_possible_duplicates.set(float(stats.get("webhook_possible_duplicates") or 0))

    def update_health(self, rows: list[dict]) -> None:
        """Copy the rows of mailroom.queue_health() into the queue gauges (known queue names only)."""
        for row in rows:
            queue = row["queue"]
            if queue not in QUEUES:
                continue
            self.queue_due.labels(queue=queue).set(float(row["due"]))
            self.queue_oldest_due_age.labels(queue=queue).set(float(row["oldest_due_age_seconds"]))
            if row["expired_leases"] is not None:
                self.queue_expired_leases.labels(queue=queue).set(float(row["expired_leases"]))
