"""Bounce reports: what a bounce mail says about each recipient, for mailroom.record_bounce.

Python only reads the facts; SQL (sql/36_outbound_bounces.sql) decides what they mean (hard bounce,
delayed, a complaint, a recipient that was not the message's). Three forms are understood:

- RFC 3464 delivery status notifications: `multipart/report; report-type=delivery-status` with a
  `message/delivery-status` part (or `message/global-delivery-status`, RFC 6533): one report per
  per-recipient block, from Final-Recipient (else Original-Recipient), Action, Status and
  Diagnostic-Code (its SMTP reply code too).
- Best effort, when there is no such part: the plain-text bounces of Postfix, qmail, Exim and
  Sendmail-style servers. In the readable text (never inside an attached original message) each
  paragraph that names an address and an SMTP reply code 4yz/5yz (with its enhanced status code
  if any) is one report with Action `failed`, e.g. `550 5.1.1 <bob@example.com>... User unknown`
  or `<bob@example.com>: host mx[192.0.2.1] said: 550 5.1.1 unknown user`.
- RFC 5965 ARF complaint reports (`report-type=feedback-report`): one report with the
  Feedback-Type and the signed addresses the complaint quotes (Original-Mail-From, the original's
  Return-Path and List-Unsubscribe); SQL decides what it means and which recipient it names.

Anything else (an auto-reply, a mail that is no bounce, a DSN without recipients) is `[]`,
which record_bounce notes as unparsed. Parsing never raises.

Untrusted input, read in time linear in its size (tests/inboxes/test_parser_complexity.py): only
the first MAX_BOUNCE_BYTES are read (a report comes before the copy of the original message it
returns), the structure with mailroom.inboxes.mime's bounded walker, the text line by line, and
each regular expression below consumes a character at most once per starting point, with
starting points that do not overlap (no `\\s*` across lines, no run that a look-behind lets
restart inside itself).
"""

from __future__ import annotations

import re
from typing import Any

from mailroom.inboxes.mime import Entity, clean_text, header_fields, header_text, leaves, read_entities

MAX_REPORTS = 100  # record_bounce reads at most this many
MAX_BOUNCE_BYTES = 1024 * 1024  # of a bounce mail that is read; the rest is the returned original
_DIAGNOSTIC_CHARS = 500
_FIELD_CHARS = 1000  # of a recipient, action or status field kept before it is read

_STATUS = re.compile(r"[ \t]*([245]\.\d{1,3}\.\d{1,3})\b")
_CODE = re.compile(r"(?<![\d.])([45]\d\d)(?:[ -]+([45]\.\d{1,3}\.\d{1,3}))?(?![\d.])")
# `'` is in the local part's class and so in the look-behind too: a run of them is one start, not n
_ADDRESS = re.compile(r"<([^<>\s@]+@[^<>\s@]+)>|(?<![\w.+'-])([\w.+'-]+@[\w-]+(?:\.[\w-]+)+)")
_WHITE = re.compile(r"\s+")
# one or more blank lines (neither `[ \t]*` nor the repetition can cross or share a line break)
_BLANK_LINES = re.compile(r"\n(?:[ \t]*\n)+")
# where the copy of the original message starts in a plain-text bounce: a line of two or more dashes
# naming it (`----- Original message -----`), `--- Below this line ...` (qmail) or a
# `Content-Type: message/rfc822` line. Possessive runs (Python 3.11) give nothing back, and `^` and
# `[^\n]` keep every attempt inside its line: linear (the expression this replaces backtracked
# over each run of dashes, O(n^2) a line, and its `\s*` crossed lines).
_ORIGINAL = re.compile(
    r"^[ \t]*+(?:-{2,}+[^\n]*?(?:original message|copy of the message|message headers|returned message"
    r"|undelivered message)|-{3,}+[ \t]*+below this line|content-type:[ \t]*+message/rfc822)",
    re.IGNORECASE | re.MULTILINE,
)
_DSN_TYPES = ("message/delivery-status", "message/global-delivery-status", "text/delivery-status")


def parse_bounce(raw: bytes) -> list[dict[str, Any]]:
    """The reports of a bounce mail (see the module doc); [] when nothing could be read."""
    try:
        raw = raw[:MAX_BOUNCE_BYTES]
        root, _ = read_entities(raw)
        reports = _arf_reports(raw, root) or _dsn_reports(raw, root)
        if not reports:
            reports = _text_reports(raw, root)
    except Exception:  # noqa: BLE001 - a broken bounce is "unparsed", never a failed delivery
        return []
    return reports[:MAX_REPORTS]


def _blocks(text: str) -> list[str]:
    """Blocks of lines separated by lines of white space only (`[ \t]*` cannot cross a line, so a
    character is read at most twice)."""
    return [b for b in _BLANK_LINES.split(text.replace("\r\n", "\n")) if b.strip()]


# ---------------------------------------------------------------------------------------------
# RFC 5965: ARF complaint reports (multipart/report; report-type=feedback-report)

_ARF_TYPES = ("message/feedback-report",)
_ORIGINAL_TYPES = ("message/rfc822", "text/rfc822-headers", "message/rfc822-headers", "message/global",
                   "message/global-headers")
_ARF_VALUE_CHARS = 2000  # of a field read for signed addresses
# what mailroom signed, as it appears in a quoted original: the return path (bounce+…), the
# unsubscribe mailto (unsubscribe+…) and the one-click link's token. Each starts at a literal and
# reads one bounded class: linear.
_SIGNED_ADDRESS = re.compile(r"(?:bounce|unsubscribe)\+[0-9a-zA-Z-]{1,60}@[0-9a-zA-Z.-]{1,253}")
_SIGNED_TOKEN = re.compile(r"/unsubscribe/([0-9]{1,18}-[0-9]{1,4}-[0-9a-fA-F]{16})\b")


def _header_block(data: bytes) -> bytes:
    """The header block at the start of a part (up to the first empty line), bounded."""
    data = data[:65536]
    ends = [i for i in (data.find(b"\r\n\r\n"), data.find(b"\n\n")) if i >= 0]
    return data[:min(ends)] if ends else data


def _arf_reports(raw: bytes, root: Entity) -> list[dict[str, Any]]:
    """An ARF report: its Feedback-Type and the signed addresses it quotes (Original-Mail-From, and
    the original's Return-Path and List-Unsubscribe), which SQL checks; [] when it is no ARF."""
    feedback: dict[str, str] | None = None
    quoted: list[str] = []
    for part in leaves(root):
        if feedback is None and part.content_type in _ARF_TYPES:
            fields, _ = header_fields(_header_block(part.payload(raw)))
            feedback = dict(reversed(fields))
        elif part.content_type in _ORIGINAL_TYPES:
            fields, _ = header_fields(_header_block(part.payload(raw)))
            quoted += [v[:_ARF_VALUE_CHARS] for name, v in fields if name in ("return-path", "list-unsubscribe")]
    if feedback is None:
        return []
    kind = _field(feedback, "feedback-type")
    if not kind:
        return []
    signed: list[str] = []
    for value in [feedback.get("original-mail-from", "")[:_ARF_VALUE_CHARS], *quoted]:
        signed += _SIGNED_ADDRESS.findall(value)
        signed += _SIGNED_TOKEN.findall(value)
    return [{
        "feedback_type": clean_text(kind.split()[0].lower(), 40),
        "signed": [clean_text(x, 400) for x in dict.fromkeys(signed)][:10],
        "source": "arf",
    }]


# ---------------------------------------------------------------------------------------------
# RFC 3464


def _dsn_reports(raw: bytes, root: Entity) -> list[dict[str, Any]]:
    reports: list[dict[str, Any]] = []
    for part in leaves(root):
        if part.content_type in _DSN_TYPES:
            # header blocks: per-message first, then one per recipient
            for block in _blocks(part.payload(raw).decode("latin-1")):
                fields, _ = header_fields(block.encode("latin-1"))
                report = _recipient_report(dict(reversed(fields)))
                if report is not None:
                    reports.append(report)
                    if len(reports) >= MAX_REPORTS:
                        return reports
    return reports


def _field(fields: dict[str, str], name: str) -> str | None:
    value = fields.get(name)
    if value is None:
        return None
    return _WHITE.sub(" ", header_text(value[:_FIELD_CHARS] if name != "diagnostic-code" else value)).strip() or None


def _recipient_report(fields: dict[str, str]) -> dict[str, Any] | None:
    recipient = _typed_address(_field(fields, "final-recipient")) or _typed_address(
        _field(fields, "original-recipient")
    )
    action = _field(fields, "action")
    if recipient is None or action is None:
        return None  # the per-message block, or a block without what a report needs
    status_match = _STATUS.match(_field(fields, "status") or "")
    diagnostic = _field(fields, "diagnostic-code")
    code = None
    if diagnostic:
        diagnostic = diagnostic[:_DIAGNOSTIC_CHARS * 4]
        code_match = _CODE.search(diagnostic.partition(";")[2] or diagnostic)
        code = code_match.group(1) if code_match else None
    return {
        "recipient": clean_text(recipient, _FIELD_CHARS),
        "action": clean_text(action.split()[0].lower(), 100),
        "status": status_match.group(1) if status_match else None,
        "smtp_code": code,
        "diagnostic": clean_text(diagnostic[:_DIAGNOSTIC_CHARS]) if diagnostic else None,
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


def _text_reports(raw: bytes, root: Entity) -> list[dict[str, Any]]:
    reports: list[dict[str, Any]] = []
    seen: set[str] = set()
    for text in _readable_text(raw, root):
        for paragraph in _paragraphs(_before_original(text)):
            report = _paragraph_report(paragraph)
            if report is not None and report["recipient"].lower() not in seen:
                seen.add(report["recipient"].lower())
                reports.append(report)
                if len(reports) >= MAX_REPORTS:
                    return reports
    return reports


def _readable_text(raw: bytes, root: Entity) -> list[str]:
    """The text/plain parts, not those of an attached original message (message/rfc822 and
    text/rfc822-headers parts are leaves the walker does not enter) nor the status parts."""
    return [part.text(raw) for part in leaves(root) if part.content_type == "text/plain"]


def _before_original(text: str) -> str:
    """The text up to the line where a copy of the original message starts (_ORIGINAL)."""
    match = _ORIGINAL.search(text)
    return text[: match.start()] if match else text


def _paragraphs(text: str) -> list[str]:
    """Blocks separated by blank lines; a qmail block (`<addr>:` then its lines) stays one."""
    return _blocks(text)


def _paragraph_report(paragraph: str) -> dict[str, Any] | None:
    if "@" not in paragraph:  # no address, no report (and no regular expression to run)
        return None
    code_match = _CODE.search(paragraph)
    if code_match is None:
        return None
    address_match = _ADDRESS.search(paragraph)
    if address_match is None:
        return None
    line_start = paragraph.rfind("\n", 0, code_match.start()) + 1
    line_end = paragraph.find("\n", code_match.end())
    line = paragraph[line_start:line_end if line_end >= 0 else len(paragraph)]
    return {
        "recipient": clean_text(address_match.group(1) or address_match.group(2), _FIELD_CHARS),
        "action": "failed",
        "status": code_match.group(2),
        "smtp_code": code_match.group(1),
        "diagnostic": clean_text(_WHITE.sub(" ", line[: _DIAGNOSTIC_CHARS * 4]).strip()[:_DIAGNOSTIC_CHARS]),
        "source": "text",
    }
