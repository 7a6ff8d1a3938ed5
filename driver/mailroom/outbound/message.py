"""The RFC 5322 message of a claimed outbound row (what the sender hands to SMTP).

The compat32 header policy with a fast path for short plain header values, a boundary chosen
without the generator's per-message regex, RFC 2047 for non-ASCII header values; never Bcc.

`message_bytes()` is what the sender sends: a message without attachments is rendered straight to
bytes (`render()`: the sender's template, the headers folded by the same policy, the bodies encoded
by the same stdlib function), byte for byte what `build_message(...).as_bytes()` gives (about 10x
cheaper: no EmailMessage, no generator); anything the rendering does not cover goes to the builder.
"""

from __future__ import annotations

import base64
import email.utils
import random
import re
import sys
from email import contentmanager
from email.contentmanager import raw_data_manager
from email.header import Header
from email.message import EmailMessage
from email.policy import compat32
from typing import Any

from mailroom.core import fastpaths

# Printable ASCII words separated by single spaces: a header value the compat32 folding (an
# email.header.Header per header, ~60 us each, a dozen a message) leaves as it is when it fits.
_PLAIN_HEADER = re.compile(r"[\x21-\x7e]+(?: [\x21-\x7e]+)*")
# the stdlib's private _fold (overridden below) and contentmanager._encode_text (render()): with
# MAILROOM_FAST_PATHS=off every header is folded by compat32 and every message built by the builder
_FAST = fastpaths.enabled()


class _Policy(type(compat32)):  # type: ignore[misc]
    """compat32 with a fast path for short plain header values (same bytes; tests/outbound checks)."""

    def _fold(self, name: str, value: Any, sanitize: bool) -> str:
        if (_FAST and isinstance(value, str) and len(name) + 2 + len(value) <= self.max_line_length
                and _PLAIN_HEADER.fullmatch(value)):
            return f"{name}: {value}{self.linesep}"
        return super()._fold(name, value, sanitize)


_POLICY = _Policy(linesep="\r\n", max_line_length=78)


def _boundary(*bodies: str) -> str:
    """A multipart boundary in the generator's own form, chosen here: the generator's check
    compiles a new regex for every message (~0.3 ms). The boundary must not start a line of a
    body: a plain substring test is stricter (encoded bodies cannot contain it: '=' is escaped)."""
    while True:
        boundary = f"{'=' * 15}{random.randrange(sys.maxsize):019d}=="
        if not any("--" + boundary in body for body in bodies):
            return boundary


def _header_value(value: str) -> str | Header:
    """ASCII values go in as they are; anything else is RFC 2047 encoded (UTF-8)."""
    return value if value.isascii() else Header(value, "utf-8")


# set by mailroom for bulk mail (RFC 8058): an application's extra header of the same name is left out
_LIST_UNSUBSCRIBE = ("list-unsubscribe", "list-unsubscribe-post")


def build_message(row: dict[str, Any], list_unsubscribe: str | None = None) -> EmailMessage:
    """The RFC 5322 message of a claimed row: multipart/alternative when both bodies exist, in a
    multipart/mixed with the attachments when there are any.

    Headers: Subject, From, To (or an empty group when there are only Cc/Bcc recipients), Cc,
    Date (enqueue time), Message-ID (generated once at enqueue), the extra headers, and for bulk
    mail one recipient's List-Unsubscribe (claim_messages' value) with List-Unsubscribe-Post when
    it has the https link (RFC 8058). Never Bcc.
    The compat32 header policy (with the modern raw_data_manager for bodies) is used because the
    modern policy's header parsing costs ~2 ms per message, the sender's main CPU cost.
    """
    msg = EmailMessage(policy=_POLICY)
    msg["Subject"] = _header_value(row["subject"])
    msg["From"] = row["from_address"]
    msg["To"] = ", ".join(row["to_addrs"]) if row["to_addrs"] else "undisclosed-recipients:;"
    if row["cc_addrs"]:
        msg["Cc"] = ", ".join(row["cc_addrs"])
    msg["Date"] = email.utils.format_datetime(row["created_at"])
    msg["Message-ID"] = row["message_id"]
    for name, value in (row["headers"] or {}).items():
        if list_unsubscribe is None or name.lower() not in _LIST_UNSUBSCRIBE:
            msg[name] = _header_value(value)
    if list_unsubscribe is not None:
        msg["List-Unsubscribe"] = list_unsubscribe
        if "<https://" in list_unsubscribe:
            msg["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    text, html = row["text_body"], row["html_body"]
    if text is not None and html is not None:
        msg.set_content(text, content_manager=raw_data_manager)
        msg.add_alternative(html, subtype="html", content_manager=raw_data_manager)
        msg.set_boundary(_boundary(text, html))
    elif html is not None:
        msg.set_content(html, subtype="html", content_manager=raw_data_manager)
    else:
        msg.set_content(text or "", content_manager=raw_data_manager)
    for attachment in row.get("attachments") or ():
        _attach(msg, attachment)
    return msg


def _attach(msg: EmailMessage, attachment: dict[str, str]) -> None:
    """One attachment of the claim (sql/32: name, content_type, content_base64): the body becomes
    multipart/mixed around it (the stdlib's add_attachment), base64, a non-ASCII file name in
    RFC 2231 form (filename*=utf-8'')."""
    maintype, _, subtype = attachment["content_type"].partition("/")
    name = attachment["name"]
    msg.add_attachment(
        base64.b64decode(attachment["content_base64"]), maintype, subtype,
        filename=name if name.isascii() else ("utf-8", "", name), content_manager=raw_data_manager,
    )


def envelope_recipients(row: dict[str, Any]) -> list[str]:
    """RCPT TO list: claim_messages' envelope (to + cc + bcc, each once, in order: the order of
    its return paths), else computed the same way."""
    if row.get("recipients") is not None:
        return list(row["recipients"])
    return list(dict.fromkeys([*row["to_addrs"], *row["cc_addrs"], *row["bcc_addrs"]]))


# ---------------------------------------------------------------------------------------------
# The message as bytes without the email package's objects (same bytes: tests/outbound checks)

# what raw_data_manager's set_text_content encodes a str body with (None: this Python's stdlib has
# another layout, so every message goes to the builder)
_encode_text = getattr(contentmanager, "_encode_text", None)
# how the generator writes a payload's lines (email.generator.NLCRE)
_NLCRE = re.compile(r"\r\n|\r|\n")
_MIME_VERSION = b"MIME-Version: 1.0\r\n"


class _Template:
    """What every message of one sender (From address) shares: its From line, folded once."""

    def __init__(self, from_address: str):
        self.from_line = _POLICY.fold_binary("From", from_address)


_TEMPLATES: dict[str, _Template] = {}


def _template(from_address: str) -> _Template:
    template = _TEMPLATES.get(from_address)
    if template is None:
        if len(_TEMPLATES) >= 1024:
            _TEMPLATES.clear()
        template = _TEMPLATES[from_address] = _Template(from_address)
    return template


def _crlf(text: str) -> str:
    """_NLCRE.sub("\\r\\n", text) by str.replace: CRLF, a lone CR and a lone LF each become CRLF."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.replace("\n", "\r\n")


def _text_part(text: str, subtype: str, mime_version: bool) -> bytes:
    """A text part as set_text_content makes it and the generator writes it: Content-Type,
    Content-Transfer-Encoding (the stdlib's choice), MIME-Version when EmailMessage adds one, the body."""
    cte, payload = _encode_text(text, "utf-8", None, _POLICY)  # type: ignore[misc]
    return b"".join((
        b'Content-Type: text/', subtype.encode(), b'; charset="utf-8"\r\n',
        b"Content-Transfer-Encoding: ", cte.encode(), b"\r\n",
        _MIME_VERSION if mime_version else b"",
        b"\r\n",
        _crlf(payload).encode("ascii", "surrogateescape"),
    ))


_DATE_LINES: dict[tuple[Any, Any], bytes] = {}


def _date_line(created_at: Any) -> bytes:
    """The folded Date line of an enqueue time (a burst enqueued in one transaction shares one)."""
    key = (created_at, created_at.utcoffset())  # equal instants in other zones are written otherwise
    line = _DATE_LINES.get(key)
    if line is None:
        if len(_DATE_LINES) >= 256:
            _DATE_LINES.clear()
        line = _DATE_LINES[key] = _POLICY.fold_binary("Date", email.utils.format_datetime(created_at))
    return line


def renders(row: dict[str, Any]) -> bool:
    """Whether render() covers the row: no attachments, and no extra header the builder's
    set_content would move, drop or keep instead of its own (Content-*, MIME-Version)."""
    if _encode_text is None or row.get("attachments"):
        return False
    return not any(name.lower().startswith("content-") or name.lower() == "mime-version"
                   for name in (row["headers"] or {}))


def render(row: dict[str, Any], list_unsubscribe: str | None = None) -> bytes | None:
    """build_message(row, list_unsubscribe).as_bytes() without building it, or None when the row
    is not one renders() covers (or cannot be rendered): the caller uses the builder then."""
    if not renders(row):
        return None
    try:
        fold = _POLICY.fold_binary
        out = [
            fold("Subject", _header_value(row["subject"])),
            _template(row["from_address"]).from_line,
            fold("To", ", ".join(row["to_addrs"]) if row["to_addrs"] else "undisclosed-recipients:;"),
        ]
        if row["cc_addrs"]:
            out.append(fold("Cc", ", ".join(row["cc_addrs"])))
        out.append(_date_line(row["created_at"]))
        out.append(fold("Message-ID", row["message_id"]))
        for name, value in (row["headers"] or {}).items():
            if list_unsubscribe is None or name.lower() not in _LIST_UNSUBSCRIBE:
                out.append(fold(name, _header_value(value)))
        if list_unsubscribe is not None:
            out.append(fold("List-Unsubscribe", list_unsubscribe))
            if "<https://" in list_unsubscribe:
                out.append(b"List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n")
        text, html = row["text_body"], row["html_body"]
        if text is not None and html is not None:
            # set_content + add_alternative: the text part's headers move into the first part,
            # the second part is an EmailMessage of its own (so it has a MIME-Version)
            first, second = _text_part(text, "plain", False), _text_part(html, "html", True)
            delimiter = b"--" + _boundary(text, html).encode()
            out += [
                _MIME_VERSION,
                b'Content-Type: multipart/alternative;\r\n boundary="', delimiter[2:], b'"\r\n\r\n',
                delimiter, b"\r\n", first, b"\r\n", delimiter, b"\r\n", second, b"\r\n", delimiter, b"--\r\n",
            ]
        elif html is not None:
            out.append(_text_part(html, "html", True))
        else:
            out.append(_text_part(text or "", "plain", True))
        return b"".join(out)
    except Exception:  # noqa: BLE001 - the builder says what is wrong with the row (the same way as before)
        return None


def message_bytes(row: dict[str, Any], list_unsubscribe: str | None = None) -> bytes:
    """The bytes of the message the sender sends (before DKIM): a released message's own bytes
    (release_message: the Resent- block and the message as received, sent as they are), else
    render(), else the builder."""
    if row.get("raw_message") is not None:
        return bytes(row["raw_message"])
    data = render(row, list_unsubscribe) if _FAST else None
    return data if data is not None else build_message(row, list_unsubscribe).as_bytes()
