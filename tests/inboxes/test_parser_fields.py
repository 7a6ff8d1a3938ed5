"""Every field the parsers return is storable, whatever the bytes (issue 21, item 5).

PostgreSQL text and jsonb refuse NUL (22P05 for jsonb's \\u0000, 22021 for text) and invalid
UTF-8; a field taken from untrusted mail must come out clean and bounded (mime.FIELD_LIMITS),
while the raw bytes are stored as they came. Hypothesis feeds MIME-shaped bytes built from the
characters that break things (NUL, 0xff, quotes, semicolons, line breaks, encoded-word markers).
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from mailroom.inboxes.bounce import parse_bounce
from mailroom.inboxes.mime import FIELD_LIMITS, parse_message

NASTY = st.sampled_from([b"\x00", b"\xff", b"\xc3", b'"', b";", b"=?", b"?=", b"\r\n", b"\n", b" ", b"a", b"/",
                         b"=", b"*", b"'", b"%00", b"%ff", b"\\", b"<", b">", b"@", b"--b", b"utf-8", b"x"])
FRAGMENT = st.lists(NASTY, max_size=40).map(b"".join)


@st.composite
def messages(draw) -> bytes:
    """A multipart message whose header values and bodies are made of nasty fragments."""
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        parts.append(
            b"--b\r\nContent-Type: " + draw(FRAGMENT) + b"; name=" + draw(FRAGMENT)
            + b"\r\nContent-Disposition: attachment; filename*0*=" + draw(FRAGMENT) + b"; filename*1=" + draw(FRAGMENT)
            + b"\r\nContent-ID: <" + draw(FRAGMENT) + b">\r\nContent-Transfer-Encoding: " + draw(FRAGMENT)
            + b"\r\n\r\n" + draw(FRAGMENT) + b"\r\n"
        )
    return (b"Subject: " + draw(FRAGMENT) + b"\r\nFrom: " + draw(FRAGMENT) + b"\r\nReply-To: " + draw(FRAGMENT)
            + b'\r\nContent-Type: multipart/mixed; boundary="b"\r\n\r\n' + b"".join(parts) + b"--b--\r\n")


def _storable(value: object, limit: int | None = None) -> None:
    if value is None:
        return
    assert isinstance(value, str)
    assert "\x00" not in value
    value.encode("utf-8")  # strict: no lone surrogate from undecodable bytes
    if limit is not None:
        assert len(value) <= limit


@settings(max_examples=300, deadline=None)
@given(messages())
def test_every_parsed_field_is_storable(raw):
    parsed = parse_message(raw)
    _storable(parsed.subject, FIELD_LIMITS["subject"])
    _storable(parsed.from_header, FIELD_LIMITS["from"])
    _storable(parsed.reply_to, FIELD_LIMITS["reply_to"])
    _storable(parsed.text_body)
    _storable(parsed.html_body)
    for attachment in parsed.attachments:
        for name in ("filename", "content_type", "disposition", "content_id"):
            _storable(attachment[name], FIELD_LIMITS[name])
    assert "\\u0000" not in json.dumps(parsed.attachments)


@settings(max_examples=200, deadline=None)
@given(FRAGMENT, FRAGMENT)
def test_every_bounce_report_is_storable(address, diagnostic):
    raw = (b'Content-Type: multipart/report; report-type=delivery-status; boundary="b"\r\n\r\n'
           b"--b\r\nContent-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; x\r\n\r\n"
           b"Final-Recipient: rfc822; " + address + b"@example.com\r\nAction: failed\r\nStatus: 5.1.1\r\n"
           b"Diagnostic-Code: smtp; 550 " + diagnostic + b"\r\n--b--\r\n")
    for report in parse_bounce(raw):
        for value in report.values():
            _storable(value)
    assert "\\u0000" not in json.dumps(parse_bounce(raw))


def test_a_nul_in_a_content_type_and_invalid_utf8_come_out_clean():
    raw = (b'From: a@x.test\r\nSubject: caf\xe9 \x00 =?utf-8?q?=00?=\r\nContent-Type: multipart/mixed; boundary="b"\r\n\r\n'
           b"--b\r\nContent-Type: text/plain\r\n\r\nhello\r\n"
           b"--b\r\nContent-Type: application/x\x00y\r\n"
           b"Content-Disposition: attachment; filename=\"r\xe9\x00sum\xff.pdf\"\r\n\r\n"
           b"%PDF\r\n--b--\r\n")
    parsed = parse_message(raw)
    assert parsed.text_body == "hello"
    (attachment,) = parsed.attachments
    assert attachment["content_type"] == "text/plain"  # RFC 2045 5.2: an invalid type reads as text/plain
    assert attachment["filename"] == "r\ufffd\ufffdsum\ufffd.pdf"
    assert parsed.subject == "caf\ufffd \ufffd \ufffd"


def test_reply_to_is_read_as_from_is_bounded_and_clean():
    assert parse_message(b"From: a@x.test\r\nSubject: s\r\n\r\nbody").reply_to is None
    parsed = parse_message(b"Reply-To: Help Desk <help@x.test>\r\n\r\nbody")
    assert parsed.reply_to == "Help Desk <help@x.test>"
    encoded = parse_message(b"Reply-To: =?utf-8?q?Caf=C3=A9?= <c@x.test>,\r\n b@x.test\r\n\r\nbody")
    assert encoded.reply_to == "Café <c@x.test>, b@x.test"  # decoded and unfolded
    long = parse_message(b"Reply-To: " + b"\xff\x00" * 3000 + b"\r\n\r\nbody").reply_to
    assert len(long) == FIELD_LIMITS["reply_to"] and "\x00" not in long
    long.encode("utf-8")
