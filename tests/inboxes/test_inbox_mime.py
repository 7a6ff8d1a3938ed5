"""mailroom.mime: best-effort parsing that never raises."""

from __future__ import annotations

import hashlib
from email.message import EmailMessage

import pytest

from mailroom.inboxes.mime import clean_text, parse_message


def test_alternative_with_attachments():
    msg = EmailMessage()
    msg["Subject"] = "Héllo wörld"
    msg["From"] = "Ann <ann@example.com>"
    msg.set_content("plain ✓")
    msg.add_alternative("<p>html ✓</p>", subtype="html")
    msg.add_attachment(b"\x00\x01data", maintype="application", subtype="octet-stream", filename="d.bin")
    inner = EmailMessage()
    inner["Subject"] = "forwarded"
    inner.set_content("inner body")
    msg.add_attachment(inner)
    parsed = parse_message(msg.as_bytes())
    assert parsed.subject == "Héllo wörld"
    assert parsed.from_header == "Ann <ann@example.com>"
    assert parsed.text_body == "plain ✓\n"
    assert parsed.html_body == "<p>html ✓</p>\n"
    assert [a["content_type"] for a in parsed.attachments] == ["application/octet-stream", "message/rfc822"]
    first = parsed.attachments[0]
    assert first["filename"] == "d.bin"
    assert first["size"] == 6 and first["sha256"] == hashlib.sha256(b"\x00\x01data").hexdigest()
    assert parsed.attachments[1]["size"] > 0  # the forwarded message is one attachment, not parsed into


def test_inline_image_with_content_id():
    msg = EmailMessage()
    msg.set_content("x")
    msg.add_related(b"imgbytes", maintype="image", subtype="png", cid="<pic@x>")
    parsed = parse_message(msg.as_bytes())
    (att,) = parsed.attachments
    assert att["content_id"] == "pic@x"
    assert att["filename"] is None
    assert att["content_type"] == "image/png"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xff\xfe\x00garbage",
        b"Subject: =?utf-8?b?!!!?=\r\n\r\nbody",
        b"Content-Type: multipart/mixed\r\n\r\nno boundary at all",
        b"Content-Type: text/plain; charset=no-such-charset\r\n\r\ncaf\xe9",
        b"Content-Type: text/plain\r\nContent-Transfer-Encoding: base64\r\n\r\n%%%%",
        b"Subject: a\x00b\r\n\r\nnul \x00 in body",
        b"Content-Type: multipart/alternative; boundary=b\r\n\r\n--b\r\nContent-Type: text/html\r\n\r\n<p>x",
    ],
)
def test_never_raises_and_fields_are_storable(raw):
    parsed = parse_message(raw)
    for value in (parsed.subject, parsed.from_header, parsed.text_body, parsed.html_body):
        if value is not None:
            assert "\x00" not in value
            value.encode("utf-8")  # no lone surrogates


def test_unknown_charset_falls_back():
    parsed = parse_message(b"Content-Type: text/plain; charset=no-such-charset\r\n\r\ncaf\xe9")
    assert parsed.text_body == "café"


def test_unterminated_multipart_keeps_html():
    parsed = parse_message(
        b"Content-Type: multipart/alternative; boundary=b\r\n\r\n--b\r\nContent-Type: text/html\r\n\r\n<p>x"
    )
    assert parsed.html_body is not None and "<p>x" in parsed.html_body
    assert parsed.defects >= 1


def test_clean_text():
    assert clean_text(None) is None
    assert clean_text("a\x00b") == "a\ufffdb"
    assert clean_text("x\udcffy") == "x?y"
