"""Prometheus metrics of the inbound SMTP server (`mailroom inbox serve --metrics-port`) and of the
expiry worker (`mailroom expire --metrics-port`), with the standard gauges of every worker
(mailroom.core.metrics). Labels are closed sets: never an address, a subject or a reply text."""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge

from mailroom.core.metrics import WorkerMetrics

# check_bounce_recipient's verdicts, and what the server answers without asking (the metric label)
RCPT_VERDICTS = ("ok", "bounce", "unknown", "deleted", "expired", "too_large", "full", "fault")
RCPT_LABELS = (*RCPT_VERDICTS, "captured", "too_many", "tempfail", "other")  # captured: a logged-in session's
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
        self.faults_skipped = Counter(
            "mailroom_inbound_faults_skipped",
            "Injected DATA-stage faults not applied: a recipient of the message belongs to another owner.",
            registry=r,
        )
        for verdict in RCPT_LABELS:
            self.recipients.labels(verdict=verdict)
        for result in MESSAGE_RESULTS:
            self.messages.labels(result=result)


class InboundTally:
    """What the inbound server did since its last summary line (`inbox serve --log-every`): one line
    for many messages instead of one line each, and none when nothing happened. Counts and verdicts
    only, never an address."""

    def __init__(self) -> None:
        self._reset(time.monotonic())

    def _reset(self, now: float) -> None:
        self.since = now
        self.sessions = 0  # SMTP sessions accepted (connections refused at the door are logged apart)
        self.stored = 0  # messages stored (one per DATA answered 250 for inboxes, whatever its recipients)
        self.statements = 0  # delivering statements (and commits) that stored them: fewer with group commit
        self.bounces = 0  # bounce reports recorded (DATA for VERP return paths answered 250)
        self.tempfail = 0  # RCPT and DATA answered 4xx because the database could not be asked or said retry
        self.refused_recipients: dict[str, int] = {}  # by verdict (unknown, expired, full, fault, ...)
        self.refused_messages: dict[str, int] = {}  # by verdict (too_large, fault, MR code, line too long, ...)
        self.faults_skipped = 0  # injected DATA-stage faults not applied: a recipient was another owner's

    def refused_recipient(self, verdict: str) -> None:
        self.refused_recipients[verdict] = self.refused_recipients.get(verdict, 0) + 1

    def refused_message(self, verdict: str) -> None:
        self.refused_messages[verdict] = self.refused_messages.get(verdict, 0) + 1

    def answered(self, reply: str, *, bounce: bool = False) -> None:
        """A DATA reply: stored (or a bounce recorded), 4xx, or refused (by its status and enhanced code)."""
        if reply[:1] == "2":
            if bounce:
                self.bounces += 1
            else:
                self.stored += 1
        elif reply[:1] == "4":
            self.tempfail += 1
        else:
            code = reply.split()[:2]  # "552 5.3.4": the status and, when given, the enhanced code
            self.refused_message(" ".join(code if len(code) == 2 and code[1][:1].isdigit() else code[:1]))

    def line(self, now: float | None = None) -> str | None:
        """The summary since the last one (and start a new period), or None when nothing happened."""
        now = time.monotonic() if now is None else now
        seconds = now - self.since
        rcpts, msgs = sum(self.refused_recipients.values()), sum(self.refused_messages.values())
        if not (self.sessions or self.stored or self.bounces or self.tempfail or rcpts or msgs
                or self.faults_skipped):
            self.since = now
            return None
        parts = [f"stored {self.stored} message(s) in {self.sessions} session(s)"
                 + (f" ({self.statements} statement(s))" if self.statements else "")]
        refused = []
        if rcpts:
            refused.append(f"{rcpts} recipient(s) ({_breakdown(self.refused_recipients)})")
        if msgs:
            refused.append(f"{msgs} message(s) ({_breakdown(self.refused_messages)})")
        if refused:
            parts.append("refused " + " and ".join(refused))
        if self.tempfail:
            parts.append(f"answered 4xx {self.tempfail} time(s)")
        if self.bounces:
            parts.append(f"recorded {self.bounces} bounce(s)")
        if self.faults_skipped:
            parts.append(f"skipped {self.faults_skipped} injected fault(s) of another owner")
        self._reset(now)
        return f"in {seconds:.0f}s: " + ", ".join(parts)


def _breakdown(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} {n}" for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


class ExpiryMetrics(WorkerMetrics):
    def __init__(self) -> None:
        super().__init__("expiry")
        r = self.registry
        self.expired = Counter("mailroom_expiry_expired_mailboxes", "Inboxes expired.", registry=r)
        self.purged = Counter("mailroom_expiry_purged_mailboxes", "Inboxes purged.", registry=r)
        self.cycles = Counter("mailroom_expiry_cycles", "Expiry cycles run.", registry=r)
        self.failed_cycles = Counter("mailroom_expiry_failed_cycles", "Expiry cycles that failed.", registry=r)
