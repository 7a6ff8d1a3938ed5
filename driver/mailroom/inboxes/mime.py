"""Best-effort MIME parsing of inbound mail with the standard library (email, modern policy).

parse_message() never raises: malformed MIME, 8-bit or non-UTF-8 bodies, unknown charsets and
broken headers give partial fields (None where nothing sensible can be read). The raw bytes are
stored unchanged next to these fields, so a message can always be parsed again later.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from dataclasses import dataclass, field
from email import policy
from email.message import EmailMessage, Message
from email.parser import BytesParser
from typing import Any

_PARSER = BytesParser(policy=policy.default)
_LEGACY_PARSER = BytesParser(policy=policy.compat32)


@dataclass
class ParsedMessage:
    """Fields extracted from a raw message; any of them may be None when unreadable."""

    subject: str | None = None
    from_header: str | None = None
    text_body: str | None = None
    html_body: str | None = None
    attachments: list[dict[str, Any]] = field(default_factory=list)
    defects: int = 0


def clean_text(value: str | None) -> str | None:
    """Make a string storable as PostgreSQL text: no NUL, no lone surrogates."""
    if value is None:
        return None
    value = value.replace("\x00", "\ufffd")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


# A From value that is just an address (`a@b.example`, `<a@b.example>`) or plain words and one
# (`Bench Two <a@b.example>`): its modern-policy value is known without the header parser (~100 us,
# the largest part of parsing a small message). tests/inboxes/test_inbox_mime.py checks both agree.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_ADDR = rf"{_ATOM}(?:\.{_ATOM})*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
_BARE_FROM = re.compile(rf"({_ADDR})|<({_ADDR})>")
_NAMED_FROM = re.compile(rf"[A-Za-z0-9]+(?: [A-Za-z0-9]+)* <{_ADDR}>")


def plain_from(value: str) -> str | None:
    """The modern policy's str() of a simple From value without parsing it; None when not simple."""
    match = _BARE_FROM.fullmatch(value)
    if match is not None:
        return match.group(1) or match.group(2)
    if _NAMED_FROM.fullmatch(value):
        return value
    return None


def _raw_header(msg: Message, name: str) -> str | None:
    for key, value in msg.raw_items():
        if key.lower() == name:
            return value if isinstance(value, str) else None
    return None


def _header(msg: Message, raw_message: bytes, name: str) -> str | None:
    if name == "from":
        raw_value = _raw_header(msg, name)
        simple = plain_from(raw_value) if raw_value is not None else None
        if simple is not None:
            return simple
    with contextlib.suppress(Exception):  # a broken header must not lose the message
        value = msg.get(name)
        if value is not None:
            return clean_text(str(value))
        return None
    # The modern policy could not parse it: take the undecoded value (legacy parser, headers only).
    try:
        value = _LEGACY_PARSER.parsebytes(raw_message, headersonly=True).get(name)
        return clean_text(str(value)) if value is not None else None
    except Exception:  # noqa: BLE001
        return None


def _leaves(part: Message, depth: int = 0):
    """Non-multipart parts in order (message/rfc822 parts are leaves: forwarded mail)."""
    if depth > 50:
        return
    if part.is_multipart() and part.get_content_maintype() == "multipart":
        payload = part.get_payload()
        if isinstance(payload, list):
            for sub in payload:
                if isinstance(sub, Message):
                    yield from _leaves(sub, depth + 1)
        return
    yield part


def _payload_bytes(part: Message) -> bytes:
    with contextlib.suppress(Exception):
        if part.get_content_type() == "message/rfc822":
            payload = part.get_payload()
            if isinstance(payload, list) and payload:
                return payload[0].as_bytes()
        data = part.get_payload(decode=True)
        if isinstance(data, bytes):
            return data
        payload = part.get_payload()
        if isinstance(payload, str):
            return payload.encode("utf-8", "surrogateescape")
    return b""


def _text_of(part: Message) -> str | None:
    with contextlib.suppress(Exception):  # unknown charset, bad transfer encoding: fall back
        if isinstance(part, EmailMessage):
            content = part.get_content()
            if isinstance(content, str):
                return clean_text(content)
    data = _payload_bytes(part)
    charset = None
    try:
        charset = part.get_content_charset()
    except Exception:  # noqa: BLE001
        charset = None
    for candidate in (charset, "utf-8", "latin-1"):
        if not candidate:
            continue
        try:
            return clean_text(data.decode(candidate))
        except (LookupError, UnicodeDecodeError):
            continue
    return clean_text(data.decode("utf-8", "replace"))  # pragma: no cover - latin-1 never fails


def _is_attachment(part: Message) -> bool:
    try:
        disposition = part.get_content_disposition()
        filename = part.get_filename()
    except Exception:  # noqa: BLE001
        disposition, filename = None, None
    if disposition == "attachment" or filename:
        return True
    return part.get_content_maintype() != "text"


def _attachment_meta(part: Message) -> dict[str, Any]:
    data = _payload_bytes(part)
    try:
        filename = part.get_filename()
    except Exception:  # noqa: BLE001
        filename = None
    try:
        content_id = part.get("content-id")
        content_id = str(content_id).strip().strip("<>") if content_id is not None else None
    except Exception:  # noqa: BLE001
        content_id = None
    try:
        disposition = part.get_content_disposition()
    except Exception:  # noqa: BLE001
        disposition = None
    return {
        "filename": clean_text(filename) if filename else None,
        "content_type": part.get_content_type(),
        "disposition": disposition,
        "size": len(data),
        "content_id": clean_text(content_id) if content_id else None,
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def parse_message(raw: bytes) -> ParsedMessage:
    """Parse raw RFC 5322 bytes into bodies and attachment metadata (never raises)."""
    result = ParsedMessage()
    try:
        msg = _PARSER.parsebytes(raw)
    except Exception:  # noqa: BLE001 - nothing readable: keep the raw bytes only
        return result
    result.subject = _header(msg, raw, "subject")
    result.from_header = _header(msg, raw, "from")

    text_part = html_part = None
    try:
        text_part = msg.get_body(preferencelist=("plain",))
        html_part = msg.get_body(preferencelist=("html",))
    except Exception:  # noqa: BLE001 - fall back to the first text parts found below
        text_part = html_part = None

    try:
        leaves = list(_leaves(msg))
    except Exception:  # noqa: BLE001
        leaves = [msg]
    for part in leaves:
        try:
            ctype = part.get_content_type()
            if part is text_part or part is html_part:
                continue
            if _is_attachment(part):
                result.attachments.append(_attachment_meta(part))
            elif ctype == "text/plain" and text_part is None:
                text_part = part
            elif ctype == "text/html" and html_part is None:
                html_part = part
        except Exception:  # noqa: BLE001
            result.defects += 1

    if text_part is not None:
        result.text_body = _text_of(text_part)
    if html_part is not None:
        result.html_body = _text_of(html_part)
    with contextlib.suppress(Exception):
        result.defects += len(msg.defects) + sum(len(p.defects) for p in leaves if p is not msg)
    return result


def find_part(raw: bytes, sha256_hex: str) -> bytes | None:
    """The decoded payload of the part whose sha256 parse_message recorded (an attachment's
    metadata names it), or None: how an attachment is served from the raw bytes kept."""
    try:
        msg = _PARSER.parsebytes(raw)
        for part in _leaves(msg):
            data = _payload_bytes(part)
            if hashlib.sha256(data).hexdigest() == sha256_hex:
                return data
    except Exception:  # noqa: BLE001 - unreadable now: nothing to serve
        return None
    return None
