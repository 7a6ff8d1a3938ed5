"""The sender's message construction fast paths give the bytes the standard library gives.

- message._POLICY folds short plain header values itself: the same bytes as compat32's Header folding;
- build_message chooses the multipart boundary itself (the generator compiles a regex per message
  to choose one): it never occurs in a body, and the message parses back to both bodies.
"""

from __future__ import annotations

import datetime
import random
import string
from email import message_from_bytes, policy

from mailroom.outbound import message

SLOW = policy.compat32.clone(linesep="\r\n", max_line_length=78)


def test_fast_header_folding_is_byte_identical_to_compat32():
    rnd = random.Random(16)
    values = ["hello", "a  b", " lead", "trail ", "=?utf-8?q?x?=", "x" * 70, "x" * 76, "y " * 40, "<a@d>",
              "A, B <c@d>", "tab\there", "new\r\nline", "caf\u00e9", ""]
    values += ["".join(rnd.choice(string.printable[:95]) for _ in range(rnd.randint(1, 90))) for _ in range(500)]
    for value in values:
        for name in ("Subject", "To", "X-A-Rather-Long-Header-Name"):
            assert message._POLICY.fold_binary(name, value) == SLOW.fold_binary(name, value), (name, value)


def _row(text: str | None, html: str | None) -> dict:
    return {
        "subject": "Hello there", "from_address": "a@example.com", "to_addrs": ["b@example.com"], "cc_addrs": [],
        "bcc_addrs": [], "created_at": datetime.datetime(2026, 11, 23, tzinfo=datetime.UTC),
        "message_id": "<m1@mailroom.test>", "headers": {}, "text_body": text, "html_body": html,
    }


def test_multipart_boundary_never_in_a_body_and_parses_back():
    text = "plain\n--===============\nend\n"
    html = "<p>html =3D ===============0000000000000000000==</p>"
    for _ in range(50):
        msg = message.build_message(_row(text, html))
        boundary = msg.get_boundary()
        assert boundary is not None and boundary.startswith("=" * 15)
        raw = msg.as_bytes()
        assert raw.count(f"--{boundary}".encode()) == 3  # two parts and the closing delimiter
        back = message_from_bytes(raw, policy=policy.default)
        assert back.get_body(("plain",)).get_content().replace("\r\n", "\n") == text
        assert back.get_body(("html",)).get_content().replace("\r\n", "\n").rstrip("\n") == html
