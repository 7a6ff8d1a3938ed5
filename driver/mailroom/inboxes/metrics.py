"""Prometheus metrics of the inbound SMTP server (`mailroom inbox serve --metrics-port`) and of the
expiry worker (`mailroom expire --metrics-port`), with the standard gauges of every worker
(mailroom.core.metrics). Labels are closed sets: never an address, a subject or a reply text."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from mailroom.core.metrics import WorkerMetrics

# check_bounce_recipient's verdicts, and what the server answers without asking (the metric label)
RCPT_VERDICTS = ("ok", "bounce", "unknown", "deleted", "expired", "too_large", "full", "fault")
RCPT_LABELS = (*RCPT_VERDICTS, "too_many", "tempfail", "other")
MESSAGE_RESULTS = ("stored", "refused", "tempfail")


class InboundMetrics(WorkerMetrics):
    def __init__(self) -> None:
        super().__init__("inbound")
        r = self.registry
        self.sessions = Counter("mailroom_inbound_sessions", "SMTP sessions accepted.", registry=r)
        self.sessions_open = Gauge("mailroom_inbound_sessions_open", "SMTP sessions open now.", registry=r)
        self.sessions_refused = Counter(
            "mailroom_inbound_sessions_refused", "Connections refused over --max-sessions (421).", registry=r
        )
        self.recipients = Counter(
            "mailroom_inbound_recipients", "RCPT TO answered, by verdict.", ["verdict"], registry=r
        )
        self.messages = Counter(
            "mailroom_inbound_messages", "DATA answered: stored (250), refused (5xx), tempfail (4xx).", ["result"],
            registry=r,
        )
        for verdict in RCPT_LABELS:
            self.recipients.labels(verdict=verdict)
        for result in MESSAGE_RESULTS:
            self.messages.labels(result=result)


class ExpiryMetrics(WorkerMetrics):
    def __init__(self) -> None:
        super().__init__("expiry")
        r = self.registry
        self.expired = Counter("mailroom_expiry_expired_mailboxes", "Inboxes expired.", registry=r)
        self.purged = Counter("mailroom_expiry_purged_mailboxes", "Inboxes purged.", registry=r)
        self.cycles = Counter("mailroom_expiry_cycles", "Expiry cycles run.", registry=r)
        self.failed_cycles = Counter("mailroom_expiry_failed_cycles", "Expiry cycles that failed.", registry=r)
