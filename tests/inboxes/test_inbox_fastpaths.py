"""The inbound fast paths give exactly what the slow paths they skip give.

- mime.plain_from: a simple From value without the modern header parser;
- InboundSMTP._getaddr (addresses.parse_path): every RFC 5321 path read linearly, as aiosmtpd's
  own parse (email's header parser) reads it, or refused where that one stretches RFC 5322 syntax.
"""

from __future__ import annotations

from email import policy
from email.parser import BytesParser

import pytest
from aiosmtpd.smtp import SMTP
from hypothesis import given, settings
from hypothesis import strategies as st

from mailroom.inboxes.addresses import parse_path
from mailroom.inboxes.mime import parse_message, plain_from
from mailroom.inboxes.smtp import InboundSMTP

FROM_VALUES = [
    "a@example.com", "<a@example.com>", "Bench <bench@example.com>", "A B C <x.y@z.org>", "x <a@b>", "<a.b@c>",
    "Bench Two <b@e.com>", "x!#$%&'*+/=?^_`{|}~-y@d.e",
    # not simple: the parser decides (plain_from must say None or agree)
    "Bench  <b@e.com>", "a@example.com ", "<a@example.com", "a..b@c", '"Quoted" <q@e.com>', "=?utf-8?q?J=C3=BC?= <j@e.com>",
    "a@example.com, b@example.com", "Name <a@b.c> (comment)", "group: a@b.c;", "<a@b.c>>", "Dr. X <x@e.com>",
]
SIMPLE = FROM_VALUES[:8]


@pytest.mark.parametrize("value", FROM_VALUES)
def test_plain_from_agrees_with_the_modern_parser(value):
    msg = BytesParser(policy=policy.default).parsebytes(f"From: {value}\r\n\r\nbody\r\n".encode())
    expected = str(msg.get("from"))
    fast = plain_from(value)
    if value in SIMPLE:
        assert fast == expected
    else:
        assert fast is None or fast == expected
    assert parse_message(f"From: {value}\r\nSubject: s\r\n\r\nbody\r\n".encode()).from_header == expected


ADDR_ARGS = [
    "<a@example.com>", "<a@example.com> SIZE=100", "<A.B+c@Ex-ample.COM>  BODY=8BITMIME", "<a@example.com>SIZE=1",
    "<x!#$%&'*+/=?^_`{|}~-y@d.e>", "<a@b>", "<a-b@c-d.e-f>", "<a@example.com>\tSIZE=5",
    # the slow path's cases
    "<>", "a@example.com", "<a@example.com> (comment) SIZE=1", '<"q q"@e.com>', "<a..b@e.com>", "<@relay:a@e.com>",
    "<" + "l" * 80 + "@e.com>", "<a@[127.0.0.1]>", " <a@e.com>",
]


@pytest.mark.parametrize("arg", ADDR_ARGS)
def test_getaddr_fast_path_agrees_with_aiosmtpd(arg):
    class Plain(SMTP):
        pass

    fast = InboundSMTP.__new__(InboundSMTP)
    slow = Plain.__new__(Plain)
    for server in (fast, slow):
        server.local_part_limit = 64
    assert fast._getaddr(arg) == slow._getaddr(arg)


PATH_ALPHABET = st.sampled_from(list('ab.@<>"\\ (),:[]1-é\t;') + ["x.y", "@e.com", "<a@b>", '"q q"'])


@settings(max_examples=2000, deadline=None)
@given(st.lists(PATH_ALPHABET, max_size=12).map("".join))
def test_parse_path_never_disagrees_with_aiosmtpd_on_an_angle_path(text):
    """mailroom.inboxes.addresses.parse_path reads RFC 5321 paths linearly: for any argument that
    starts with '<' it gives aiosmtpd's answer, or refuses what aiosmtpd's RFC 5322 reading would
    have stretched to accept (comments or spaces inside the brackets, a missing '>')."""

    class Plain(SMTP):
        pass

    slow = Plain.__new__(Plain)
    slow.local_part_limit = 64
    arg = "<" + text
    got = parse_path(arg, local_part_limit=64)  # never raises
    try:
        expected = slow._getaddr(arg)
    except Exception:  # noqa: BLE001 - aiosmtpd's own parse crashes on some ('<', '<a@['): parse_path answers
        return
    assert got in ((None, None), expected), (arg, got, expected)


@pytest.mark.parametrize("arg", ADDR_ARGS)
def test_parse_path_agrees_with_aiosmtpd_on_the_usual_paths(arg):
    class Plain(SMTP):
        pass

    slow = Plain.__new__(Plain)
    slow.local_part_limit = 64
    assert parse_path(arg, local_part_limit=64) == slow._getaddr(arg)
