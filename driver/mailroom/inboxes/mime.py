"""MIME reading of untrusted inbound mail in time linear in its size, with fixed bounds.

parse_message() never raises: malformed MIME, 8-bit or non-UTF-8 bodies, unknown charsets and
broken headers give partial fields (None where nothing sensible can be read). The raw bytes are
stored unchanged next to these fields, so a message can always be parsed again later. Every field
it returns is storable as PostgreSQL text and jsonb (clean_text: no NUL, no invalid UTF-8, a
length cap per field).

Why not the standard library's parser: email.feedparser checks every line against the boundary
of every enclosing multipart (time x nesting depth), the modern policy's header parser is
quadratic on some values (a From of quotes, dots or backslashes: 1.3 s for 8 KB), and email.header's
encoded-word regex rescans on unclosed `=?` (docs/security.md, tests/inboxes/test_parser_complexity.py).
This reader walks the structure iteratively over one buffer, with:

- at most MAX_DEPTH nested multiparts and MAX_ENTITIES parts (more is a defect, not a cost);
- at most MAX_HEADER_BYTES of one part's header block and MAX_HEADER_VALUE characters of one
  header value interpreted;
- each multipart's delimiter lines found with bytes.find over that part's span, so a byte is
  scanned once per enclosing multipart (at most MAX_DEPTH times);
- encoded words (RFC 2047) and parameters (RFC 2045, RFC 2231) read by regular expressions
  without ambiguous repetition (each character is consumed once).

mailroom.inboxes.bounce reads bounce reports with the same walker (read_entities).
"""

from __future__ import annotations

import binascii
import codecs
import contextlib
import hashlib
import re
from dataclasses import dataclass, field, fields
from email import policy
from typing import Any
from urllib.parse import unquote_to_bytes

MAX_DEPTH = 32  # nested multiparts followed; a deeper one is a defect and is not read
MAX_ENTITIES = 2000  # parts (multiparts included) read from one message
MAX_HEADER_BYTES = 64 * 1024  # of one part's header block; the rest of the block is skipped
MAX_HEADER_VALUE = 8 * 1024  # characters of one header value that are interpreted

# Length caps of the stored fields (characters). Bodies are not capped: the message size is.
FIELD_LIMITS = {
    "subject": 2000,
    "from": 2000,
    "reply_to": 2000,
    "filename": 1000,
    "content_type": 255,
    "disposition": 100,
    "content_id": 1000,
}

# A From value this long or shorter that is not simple goes through the standard library's modern
# header parser (decoded display names, re-quoted as the policy does); its cost grows faster than
# the value (about 2 ms at 128 characters at worst, 1.3 s at 8 KB), so a longer value is only
# unfolded and its encoded words decoded.
MODERN_FROM_CHARS = 128

# codecs that are no mail charset and whose decoders are not linear (punycode) or not meant for data
_REFUSED_CODECS = frozenset({"punycode", "idna"})


@dataclass
class ParsedMessage:
    """Fields extracted from a raw message; any of them may be None when unreadable.

    They reach the database as ONE document (document(): every field by name), which
    deliver_message, deliver_messages and deliver_ses_message read by name (sql/21_delivery.sql):
    a field stored with the message is a field here, its column and its line in deliver_message."""

    subject: str | None = None
    from_header: str | None = None
    reply_to: str | None = None  # the Reply-To header, read as From is
    text_body: str | None = None
    html_body: str | None = None
    attachments: list[dict[str, Any]] = field(default_factory=list)
    defects: int = 0  # not stored: how many parts or headers could not be read

    def document(self) -> dict[str, Any]:
        """Every field by name: the `p_parsed` JSON object of the delivering calls."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def clean_text(value: str | None, limit: int | None = None) -> str | None:
    """Make a string storable as PostgreSQL text and jsonb: no NUL, no lone surrogates (invalid
    UTF-8 read with surrogateescape), at most `limit` characters."""
    if value is None:
        return None
    value = value.replace("\x00", "\ufffd")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    if limit is not None and len(value) > limit:
        value = value[:limit]
    return value


# A From value that is just an address (`a@b.example`, `<a@b.example>`) or plain words and one
# (`Bench Two <a@b.example>`): its value is known without any parsing. tests/inboxes/
# test_inbox_fastpaths.py checks it agrees with the modern policy's.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_ADDR = rf"{_ATOM}(?:\.{_ATOM})*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
_BARE_FROM = re.compile(rf"({_ADDR})|<({_ADDR})>")
_NAMED_FROM = re.compile(rf"[A-Za-z0-9]+(?: [A-Za-z0-9]+)* <{_ADDR}>")


def plain_from(value: str) -> str | None:
    """The modern policy's str() of a simple From value without parsing it; None when not simple."""
    if len(value) > FIELD_LIMITS["from"]:
        return None
    match = _BARE_FROM.fullmatch(value)
    if match is not None:
        return match.group(1) or match.group(2)
    if _NAMED_FROM.fullmatch(value):
        return value
    return None


# ---------------------------------------------------------------------------------------------
# charsets and encoded words (RFC 2047)


def _codec(charset: str | None) -> str | None:
    """The Python codec of a MIME charset name, or None when unknown or refused."""
    if not charset:
        return None
    try:
        info = codecs.lookup(charset.strip().strip('"').lower())
    except (LookupError, ValueError):
        return None
    if info.name in _REFUSED_CODECS or not getattr(info, "_is_text_encoding", True):
        return None
    return info.name


def _decode_bytes(data: bytes, charset: str | None) -> str:
    """`data` as text in its declared charset (undecodable bytes as U+FFFD); undeclared or unknown
    charsets are read as UTF-8, else Latin-1 (which never fails)."""
    codec = _codec(charset)
    if codec is not None:
        try:
            return data.decode(codec, "replace")
        except Exception:  # noqa: BLE001, S110 - a codec may still fail on odd input: fall back
            pass
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


# =?charset[*lang]?B|Q?text?=: each class excludes the character that ends it, so nothing backtracks
_ENCODED_WORD = re.compile(r"=\?([^?\s*]{1,64})(?:\*[^?\s]{0,64})?\?([bBqQ])\?([^?\s]*)\?=")
_ONLY_SPACE = re.compile(r"[ \t\r\n]*")


def _word_bytes(encoding: str, text: str) -> bytes | None:
    raw = text.encode("ascii", "replace")
    try:
        if encoding in "bB":
            raw = raw.rstrip(b"=")
            return binascii.a2b_base64(raw + b"=" * (-len(raw) % 4))
        return binascii.a2b_qp(raw, header=True)
    except (binascii.Error, ValueError):
        return None


def decode_words(value: str) -> str:
    """Decode the RFC 2047 encoded words of a header value (adjacent words of one charset are
    decoded together; the white space between two encoded words is dropped). A word in an unknown
    charset, or that does not decode, stays as it is."""
    if "=?" not in value:
        return value
    out: list[str] = []
    pending: bytearray | None = None  # bytes of adjacent encoded words in pending_codec
    pending_codec = ""
    position = 0
    for match in _ENCODED_WORD.finditer(value):
        between = value[position:match.start()]
        codec = _codec(match.group(1))
        data = _word_bytes(match.group(2), match.group(3)) if codec else None
        if data is None:  # not decodable: literal text
            if pending is not None:
                out.append(_decode_bytes(bytes(pending), pending_codec))
                pending = None
            out.append(between + match.group(0))
            position = match.end()
            continue
        adjacent = pending is not None and _ONLY_SPACE.fullmatch(between) is not None
        if adjacent and codec == pending_codec:
            pending += data
        else:
            if pending is not None:
                out.append(_decode_bytes(bytes(pending), pending_codec))
            if not adjacent:
                out.append(between)
            pending, pending_codec = bytearray(data), codec
        position = match.end()
    if pending is not None:
        out.append(_decode_bytes(bytes(pending), pending_codec))
    out.append(value[position:])
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# header blocks


_NAME = re.compile(rb"[!-9;-~]+")  # printable ASCII but ':'


def _block_end(raw: bytes, start: int, end: int) -> tuple[int, int]:
    """(end of the header block, start of the body) of the entity at raw[start:end]."""
    if raw.startswith(b"\r\n", start, end) or raw.startswith(b"\n", start, end):
        return start, start + (2 if raw.startswith(b"\r\n", start, end) else 1)
    # the first empty line: "\n\n" or "\n\r\n" (bytes.find: far faster than a regular expression)
    lf = raw.find(b"\n\n", start, end)
    crlf = raw.find(b"\n\r\n", start, end if lf < 0 else lf)
    if crlf >= 0:
        return (crlf - 1 if raw[crlf - 1] == 0x0D else crlf), crlf + 3
    if lf >= 0:
        return (lf - 1 if lf > start and raw[lf - 1] == 0x0D else lf), lf + 2
    return end, end


def header_fields(block: bytes) -> tuple[list[tuple[str, str]], int]:
    """The (lower-case name, unfolded value) pairs of a header block, values as Latin-1 text (one
    character per byte), each cut at MAX_HEADER_VALUE; and the number of defects (lines that are
    no header, a block over MAX_HEADER_BYTES)."""
    defects = 0
    if len(block) > MAX_HEADER_BYTES:
        block = block[:MAX_HEADER_BYTES]
        defects += 1
    fields: list[tuple[str, list[str], int]] = []
    for raw_line in block.split(b"\n"):
        line = raw_line[:-1] if raw_line.endswith(b"\r") else raw_line
        if line[:1] in (b" ", b"\t"):
            if fields:
                name, parts, size = fields[-1]
                if size < MAX_HEADER_VALUE:
                    parts.append(line.decode("latin-1"))
                    fields[-1] = (name, parts, size + len(line))
            else:
                defects += 1
            continue
        colon = line.find(b":")
        if colon <= 0 or _NAME.fullmatch(line, 0, colon) is None:
            if line:
                defects += 1
            continue
        value = line[colon + 1:].lstrip(b" \t")
        fields.append((line[:colon].decode("ascii").lower(), [value.decode("latin-1")], len(value)))
    return [(name, "".join(parts)[:MAX_HEADER_VALUE]) for name, parts, _ in fields], defects


def header_text(value: str) -> str:
    """A Latin-1 header value as text: its bytes read as UTF-8 (RFC 6532), encoded words decoded."""
    raw = value.encode("latin-1")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", "replace")
    return decode_words(text)


# ---------------------------------------------------------------------------------------------
# parameters (RFC 2045, RFC 2231)


_PARAM_NAME = re.compile(r"[ \t;]*([^\s=;\"]+)[ \t]*(=?)[ \t]*")
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_TOKEN = re.compile(r'[^;\s"]*')
_UNQUOTE = re.compile(r"\\(.)", re.DOTALL)
_SEGMENT = re.compile(r"(.+?)\*(?:(\d{1,3})(\*?))?$|(.+)")


def _param_text(value: str) -> str:
    raw = value.encode("latin-1", "replace")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace")


def split_parameters(value: str) -> tuple[str, dict[str, str]]:
    """The lower-case main value of a Content-Type or Content-Disposition (a Latin-1 header value)
    and its parameters as text (lower-case names; RFC 2231 continuations joined and decoded; the
    first of a repeated name wins). Encoded words are left to the caller (filename_text)."""
    end = len(value)
    head = _TOKEN.match(value)  # type/subtype has no space, quote or ';'
    main = value[: head.end()].strip().lower() if head else ""
    position = value.find(";", head.end() if head else 0)
    segments: dict[str, dict[int, tuple[str, bool]]] = {}
    plain: dict[str, str] = {}
    while 0 <= position < end:
        match = _PARAM_NAME.match(value, position)
        if match is None or not match.group(1):
            break
        position = match.end()
        name = match.group(1).lower()
        if not match.group(2):  # no '=': skip to the next ';'
            position = value.find(";", position)
            continue
        quoted = _QUOTED.match(value, position)
        if quoted is not None:
            text = _UNQUOTE.sub(r"\1", quoted.group(1))
            position = quoted.end()
        else:
            token = _TOKEN.match(value, position)
            text = token.group(0) if token else ""
            position = token.end() if token else position
        position = value.find(";", position)
        parts = _SEGMENT.match(name)
        if parts is not None and parts.group(1) is not None:
            base, index, extended = parts.group(1), parts.group(2), parts.group(3)
            number = int(index) if index is not None else 0
            is_extended = bool(extended) if index is not None else True
            segments.setdefault(base, {}).setdefault(number, (text, is_extended))
        else:
            plain.setdefault(name, text)
    params = {name: _param_text(text) for name, text in plain.items()}
    for base, pieces in segments.items():
        if base not in params:
            params[base] = _join_segments(pieces)
    return main, params


def _join_segments(pieces: dict[int, tuple[str, bool]]) -> str:
    charset = None
    chunks: list[bytes] = []
    for index in range(len(pieces)):
        if index not in pieces:
            break
        text, extended = pieces[index]
        if extended:
            if index == 0:
                charset, _, rest = text.partition("'")
                _, _, text = rest.partition("'")
            chunks.append(unquote_to_bytes(text))
        else:
            chunks.append(text.encode("latin-1", "replace"))
    return _decode_bytes(b"".join(chunks), charset or "utf-8")


# ---------------------------------------------------------------------------------------------
# the structure


@dataclass
class Entity:
    """One part of a message: its headers and the span of its body in the raw buffer."""

    fields: list[tuple[str, str]]
    start: int  # body span in the raw bytes
    end: int
    depth: int
    content_type: str = "text/plain"
    params: dict[str, str] = field(default_factory=dict)
    children: list[Entity] | None = None  # a multipart that was read: its parts

    def header(self, name: str) -> str | None:
        """The first value of a header (Latin-1 text), or None."""
        for key, value in self.fields:
            if key == name:
                return value
        return None

    @property
    def maintype(self) -> str:
        return self.content_type.partition("/")[0]

    def disposition(self) -> tuple[str | None, dict[str, str]]:
        value = self.header("content-disposition")
        if value is None:
            return None, {}
        main, params = split_parameters(value)
        return (main or None), params

    def filename(self) -> str | None:
        """Content-Disposition's filename, else Content-Type's name (encoded words decoded)."""
        _, params = self.disposition()
        name = params.get("filename") or self.params.get("name")
        if not name:
            return None
        return decode_words(name) if "=?" in name else name

    def payload(self, raw: bytes) -> bytes:
        """The body with its Content-Transfer-Encoding undone (base64, quoted-printable)."""
        data = raw[self.start:self.end]
        encoding = (self.header("content-transfer-encoding") or "").strip().lower()
        try:
            if encoding == "base64":
                data = _NOT_BASE64.sub(b"", data)
                if len(data) % 4 == 1:  # one character cannot encode anything
                    data = data[:-1]
                return binascii.a2b_base64(data + b"=" * (-len(data) % 4))
            if encoding == "quoted-printable":
                return binascii.a2b_qp(data)
        except (binascii.Error, ValueError):
            return data
        return data

    def text(self, raw: bytes) -> str:
        """The body as text in its charset (undecodable bytes as U+FFFD)."""
        return _decode_bytes(self.payload(raw), self.params.get("charset"))


_NOT_BASE64 = re.compile(rb"[^A-Za-z0-9+/]+")
_CONTENT_TYPE = re.compile(r"[a-z0-9!#$&^_.+-]+/[a-z0-9!#$&^_.+-]+")


def _entity(raw: bytes, start: int, end: int, depth: int, default_type: str) -> tuple[Entity, int]:
    block_end, body_start = _block_end(raw, start, end)
    fields, defects = header_fields(raw[start:min(block_end, start + MAX_HEADER_BYTES + 1)])
    entity = Entity(fields, body_start, end, depth, default_type)
    value = entity.header("content-type")
    if value is not None:
        main, entity.params = split_parameters(value)
        if _CONTENT_TYPE.fullmatch(main):
            entity.content_type = main
        else:  # RFC 2045 5.2: an invalid Content-Type is text/plain
            entity.content_type = "text/plain"
            defects += 1
    return entity, defects


def _delimiters(raw: bytes, start: int, end: int, boundary: bytes) -> tuple[list[tuple[int, int]], bool]:
    """The parts of a multipart body raw[start:end]: their spans between delimiter lines, and
    whether the close delimiter was found (RFC 2046 5.1.1; the line break before a delimiter
    belongs to it; preamble and epilogue are dropped)."""
    dash = b"--" + boundary
    parts: list[tuple[int, int]] = []
    part_start: int | None = None
    position = start
    while True:
        i = raw.find(dash, position, end)
        if i < 0:
            break
        position = i + 1
        if i != start and raw[i - 1] != 0x0A:
            continue
        j = i + len(dash)
        closing = raw.startswith(b"--", j, end)
        k = j + 2 if closing else j
        while k < end and raw[k] in b" \t":
            k += 1
        if k < end and raw[k] == 0x0D:
            k += 1
        if k < end and raw[k] != 0x0A:
            continue  # "--boundaryX": not a delimiter
        line_end = min(k + 1, end)
        if part_start is not None:
            stop = i - 1 if i > start else i
            if stop > part_start and raw[stop - 1] == 0x0D:
                stop -= 1
            parts.append((part_start, max(part_start, stop)))
        part_start = line_end
        if closing:
            return parts, True
        position = line_end
    if part_start is not None:
        parts.append((part_start, end))
    return parts, False


def read_entities(raw: bytes) -> tuple[Entity, int]:
    """The entity tree of a message (parts of multiparts in `children`, message/* parts are leaves,
    as a forwarded message is one attachment), and the number of defects found. Iterative: no
    recursion, whatever the nesting."""
    root, defects = _entity(raw, 0, len(raw), 0, "text/plain")
    count = 1
    stack = [root]
    while stack:
        entity = stack.pop()
        if entity.maintype != "multipart":
            continue
        boundary = (entity.params.get("boundary") or "").rstrip()
        if not boundary or len(boundary) > 200:
            defects += 1
            continue
        if entity.depth >= MAX_DEPTH:
            defects += 1
            entity.children = []
            continue
        spans, closed = _delimiters(raw, entity.start, entity.end, boundary.encode("utf-8", "surrogateescape"))
        if not closed:
            defects += 1
        default = "message/rfc822" if entity.content_type == "multipart/digest" else "text/plain"
        entity.children = []
        for start, end in spans:
            if count >= MAX_ENTITIES:
                defects += 1
                break
            child, child_defects = _entity(raw, start, end, entity.depth + 1, default)
            defects += child_defects
            count += 1
            entity.children.append(child)
        stack.extend(reversed(entity.children))
    return root, defects


def leaves(entity: Entity):
    """The parts that are not multiparts, in document order (iterative)."""
    stack = [entity]
    while stack:
        part = stack.pop()
        if part.children is not None:
            stack.extend(reversed(part.children))
        elif part.maintype != "multipart":
            yield part


def _is_attachment_disposition(part: Entity) -> bool:
    disposition, _ = part.disposition()
    return disposition == "attachment"


def _find_body(root: Entity, subtype: str) -> Entity | None:
    """EmailMessage.get_body(preferencelist=(subtype,)): the first text/<subtype> part in document
    order that is not an attachment, following only the start part of a multipart/related."""
    stack = [root]
    while stack:
        part = stack.pop()
        if _is_attachment_disposition(part):
            continue
        if part.maintype == "text":
            if part.content_type == f"text/{subtype}":
                return part
            continue
        if part.children is None:
            continue
        if part.content_type != "multipart/related":
            stack.extend(reversed(part.children))
            continue
        start = part.params.get("start")
        candidate = None
        if start:
            candidate = next((c for c in part.children if (c.header("content-id") or "").strip() == start), None)
        if candidate is None and part.children:
            candidate = part.children[0]
        if candidate is not None:
            stack.append(candidate)
    return None


def _is_attachment(part: Entity) -> bool:
    disposition, _ = part.disposition()
    if disposition == "attachment" or part.filename():
        return True
    return part.maintype != "text"


def _attachment_meta(raw: bytes, part: Entity) -> dict[str, Any]:
    data = part.payload(raw)
    disposition, _ = part.disposition()
    filename = part.filename()
    content_id = part.header("content-id")
    content_id = header_text(content_id).strip().strip("<>") if content_id is not None else None
    return {
        "filename": clean_text(filename, FIELD_LIMITS["filename"]) if filename else None,
        "content_type": clean_text(part.content_type, FIELD_LIMITS["content_type"]),
        "disposition": clean_text(disposition, FIELD_LIMITS["disposition"]),
        "size": len(data),
        "content_id": clean_text(content_id, FIELD_LIMITS["content_id"]) if content_id else None,
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def _unfold(value: str) -> str:
    return value.replace("\r", "").replace("\n", "")


def _from_text(value: str) -> str:
    """The From header as text: the simple forms as they are, short ones as the modern policy reads
    them, longer ones unfolded with their encoded words decoded (all in bounded time)."""
    simple = plain_from(value)
    if simple is not None:
        return simple
    if len(value) <= MODERN_FROM_CHARS:
        with contextlib.suppress(Exception):
            text = value.encode("latin-1").decode("utf-8", "surrogateescape")
            return str(policy.default.header_fetch_parse("from", text))
    return header_text(value).strip()


def parse_message(raw: bytes) -> ParsedMessage:
    """Parse raw RFC 5322 bytes into bodies and attachment metadata (never raises)."""
    result = ParsedMessage()
    try:
        root, result.defects = read_entities(raw)
    except Exception:  # noqa: BLE001 - nothing readable: keep the raw bytes only
        result.defects += 1
        return result
    try:
        subject = root.header("subject")
        if subject is not None:
            result.subject = clean_text(header_text(_unfold(subject)), FIELD_LIMITS["subject"])
        sender = root.header("from")
        if sender is not None:
            result.from_header = clean_text(_from_text(_unfold(sender)), FIELD_LIMITS["from"])
        reply_to = root.header("reply-to")
        if reply_to is not None:
            result.reply_to = clean_text(_from_text(_unfold(reply_to)), FIELD_LIMITS["reply_to"])
    except Exception:  # noqa: BLE001 - a broken header must not lose the message
        result.defects += 1

    text_part = _find_body(root, "plain")
    html_part = _find_body(root, "html")
    for part in leaves(root):
        try:
            if part is text_part or part is html_part:
                continue
            if _is_attachment(part):
                result.attachments.append(_attachment_meta(raw, part))
            elif part.content_type == "text/plain" and text_part is None:
                text_part = part
            elif part.content_type == "text/html" and html_part is None:
                html_part = part
        except Exception:  # noqa: BLE001
            result.defects += 1
    for name, part in (("text_body", text_part), ("html_body", html_part)):
        if part is not None:
            try:
                setattr(result, name, clean_text(part.text(raw)))
            except Exception:  # noqa: BLE001
                result.defects += 1
    return result


def find_part(raw: bytes, sha256_hex: str) -> bytes | None:
    """The decoded payload of the part whose sha256 parse_message recorded (an attachment's
    metadata names it), or None: how an attachment is served from the raw bytes kept. The same
    bounded walk as parse_message."""
    try:
        root, _ = read_entities(raw)
        for part in leaves(root):
            data = part.payload(raw)
            if hashlib.sha256(data).hexdigest() == sha256_hex:
                return data
    except Exception:  # noqa: BLE001 - unreadable now: nothing to serve
        return None
    return None


def find_parts(raw: bytes, sha256_hexes: frozenset[str] | set[str]) -> dict[str, bytes]:
    """find_part for several parts in one walk: {sha256: decoded payload} of those found (the inline
    images of an HTML part, sql/22_reading.sql _inline_images)."""
    found: dict[str, bytes] = {}
    if not sha256_hexes:
        return found
    try:
        root, _ = read_entities(raw)
        for part in leaves(root):
            data = part.payload(raw)
            digest = hashlib.sha256(data).hexdigest()
            if digest in sha256_hexes and digest not in found:
                found[digest] = data
                if len(found) == len(sha256_hexes):
                    break
    except Exception:  # noqa: BLE001 - unreadable now: what was found so far
        return found
    return found
