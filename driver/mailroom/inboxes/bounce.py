"""Bounce reports: what a bounce mail says about each recipient, for mailroom.record_bounce.

Python only reads the facts; SQL (sql/36_outbound_bounces.sql) decides what they mean (hard bounce,
delayed, a recipient that was not the message's). Two forms are understood:

- RFC 3464 delivery status notifications: `multipart/report; report-type=delivery-status` with a
  `message/delivery-status` part (or `message/global-delivery-status`, RFC 6533): one report per
  per-recipient block, from Final-Recipient (else Original-Recipient), Action, Status and
  Diagnostic-Code (its SMTP reply code too).
- Best effort, when there is no such part: the plain-text bounces of Postfix, qmail, Exim and
  Sendmail-style servers. In the readable text (never inside an attached original message) each
  paragraph that names an address and an SMTP reply code 4yz/5yz (with its enhanced status code
  if any) is one report with Action `failed`, e.g. `550 5.1.1 <bob@example.com>... User unknown`
  or `<bob@example.com>: host mx[192.0.2.1] said: 550 5.1.1 unknown user`.

Anything else (an auto-reply, a mail that is no bounce, a DSN without recipients) is `[]`,
which record_bounce notes as unparsed. Parsing never raises.
"""

from __future__ import annotations

import re
from email import message_from_bytes
from email.message import Message
from email.parser import HeaderParser
from email.policy import compat32
from typing import Any

MAX_REPORTS = 100  # record_bounce reads at most this many
_DIAGNOSTIC_CHARS = 500

_STATUS = re.compile(r"^\s*([245]\.\d{1,3}\.\d{1,3})\b")
_CODE = re.compile(r"(?<![\d.])([45]\d\d)(?:[ -]+([45]\.\d{1,3}\.\d{1,3}))?(?![\d.])")
_ADDRESS = re.compile(r"<([^<>\s@]+@[^<>\s@]+)>|(?<![\w.+-])([\w.+'-]+@[\w-]+(?:\.[\w-]+)+)")
# where the copy of the original message starts in a plain-text bounce
_ORIGINAL = re.compile(
    r"^\s*-{2,}.*(original message|copy of the message|message headers|returned message|undelivered message)"
    r"|^\s*-{3,}\s*below this line|^\s*content-type:\s*message/rfc822",
    re.IGNORECASE | re.MULTILINE,
)
_DSN_TYPES = ("message/delivery-status", "message/global-delivery-status", "text/delivery-status")


def parse_bounce(raw: bytes) -> list[dict[str, Any]]:
    """The reports of a bounce mail (see the module doc); [] when nothing could be read."""
    try:
        msg = message_from_bytes(raw, policy=compat32)
        reports = _dsn_reports(msg)
        if not reports:
            reports = _text_reports(msg)
    except Exception:  # noqa: BLE001 - a broken bounce is "unparsed", never a failed delivery
        return []
    return reports[:MAX_REPORTS]


# ---------------------------------------------------------------------------------------------
# RFC 3464


def _dsn_reports(msg: Message) -> list[dict[str, Any]]:
    reports: list[dict[str, Any]] = []
    for part in msg.walk():
        if part.get_content_type() in _DSN_TYPES:
            for fields in _status_blocks(part):
                report = _recipient_report(fields)
                if report is not None:
                    reports.append(report)
    return reports


def _status_blocks(part: Message) -> list[Message]:
    """The header blocks of a delivery-status part: per-message first, then one per recipient."""
    payload = part.get_payload()
    if isinstance(payload, list) and part.get_content_type() == "message/delivery-status":
        return [p for p in payload if isinstance(p, Message)]
    if isinstance(payload, list):  # another message/* type: parsed as one message, headers + body
        text = "".join(p.as_string() for p in payload if isinstance(p, Message))
    else:
        data = part.get_payload(decode=True)
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(payload or "")
    text = text.replace("\r\n", "\n")
    return [HeaderParser(policy=compat32).parsestr(block.strip() + "\n") for block in re.split(r"\n\s*\n", text)
            if block.strip()]


def _field(fields: Message, name: str) -> str | None:
    value = fields.get(name)
    if value is None:
        return None
    return re.sub(r"\s+", " ", str(value)).strip() or None


def _recipient_report(fields: Message) -> dict[str, Any] | None:
    recipient = _typed_address(_field(fields, "Final-Recipient")) or _typed_address(
        _field(fields, "Original-Recipient")
    )
    action = _field(fields, "Action")
    if recipient is None or action is None:
        return None  # the per-message block, or a block without what a report needs
    status_match = _STATUS.match(_field(fields, "Status") or "")
    diagnostic = _field(fields, "Diagnostic-Code")
    code = None
    if diagnostic:
        code_match = _CODE.search(diagnostic.partition(";")[2] or diagnostic)
        code = code_match.group(1) if code_match else None
    return {
        "recipient": recipient,
        "action": action.split()[0].lower(),
        "status": status_match.group(1) if status_match else None,
        "smtp_code": code,
        "diagnostic": diagnostic[:_DIAGNOSTIC_CHARS] if diagnostic else None,
        "source": "rfc3464",
    }


def _typed_address(value: str | None) -> str | None:
    """`rfc822; bob@example.com` -> bob@example.com (an address of another type: None)."""
    if not value:
        return None
    kind, sep, address = value.partition(";")
    if not sep:
        kind, address = "rfc822", value
    if kind.strip().lower() not in ("rfc822", "utf-8"):
        return None
    address = address.strip().strip("<>").strip()
    return address if "@" in address else None


# ---------------------------------------------------------------------------------------------
# Plain-text bounces, best effort


def _text_reports(msg: Message) -> list[dict[str, Any]]:
    reports: list[dict[str, Any]] = []
    seen: set[str] = set()
    for text in _readable_text(msg):
        original = _ORIGINAL.search(text)
        for paragraph in _paragraphs(text[: original.start()] if original else text):
            report = _paragraph_report(paragraph)
            if report is not None and report["recipient"].lower() not in seen:
                seen.add(report["recipient"].lower())
                reports.append(report)
    return reports


def _readable_text(msg: Message) -> list[str]:
    """The text/plain parts, not those of an attached original message (message/rfc822)."""
    texts: list[str] = []

    def visit(part: Message) -> None:
        if part.get_content_type() in ("message/rfc822", "text/rfc822-headers") or part.get_content_type() in _DSN_TYPES:
            return
        if part.is_multipart():
            for sub in part.get_payload():
                if isinstance(sub, Message):
                    visit(sub)
            return
        if part.get_content_type() == "text/plain":
            data = part.get_payload(decode=True)
            if isinstance(data, bytes):
                texts.append(data.decode(part.get_content_charset() or "utf-8", "replace"))

    visit(msg)
    return texts


def _paragraphs(text: str) -> list[str]:
    """Blocks separated by blank lines; a qmail block (`<addr>:` then its lines) stays one."""
    return [p for p in re.split(r"\n[ \t]*\n", text.replace("\r\n", "\n")) if p.strip()]


def _paragraph_report(paragraph: str) -> dict[str, Any] | None:
    code_match = _CODE.search(paragraph)
    address_match = _ADDRESS.search(paragraph)
    if code_match is None or address_match is None:
        return None
    line_start = paragraph.rfind("\n", 0, code_match.start()) + 1
    line_end = paragraph.find("\n", code_match.end())
    line = paragraph[line_start:line_end if line_end >= 0 else len(paragraph)]
    return {
        "recipient": address_match.group(1) or address_match.group(2),
        "action": "failed",
        "status": code_match.group(2),
        "smtp_code": code_match.group(1),
        "diagnostic": re.sub(r"\s+", " ", line).strip()[:_DIAGNOSTIC_CHARS],
        "source": "text",
    }
