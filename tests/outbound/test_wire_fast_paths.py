"""The sender's shortcuts on the SMTP wire give aiosmtplib's bytes (issue 37, the default drain):
an address put on MAIL/RCPT without parseaddr, DATA content without its regular expressions."""

from __future__ import annotations

import random

import pytest
from aiosmtplib.email import quote_address
from aiosmtplib.protocol import PERIOD_REGEX, normalize_message_line_endings

from mailroom.outbound.message import _NLCRE, _crlf
from mailroom.outbound.smtp import _content, _quoted, _quoted_parsed

ADDRESS_CHARS = "aZ09.-_+@\"<> ,;:()[]\\!#$%&'*/=?^`{|}~é\t"


def _theirs(address: str) -> bytes | type[ValueError]:
    try:
        return quote_address(address).encode("ascii")
    except (ValueError, UnicodeEncodeError) as exc:
        return type(exc)


def _ours(address: str) -> bytes | type[ValueError]:
    try:
        return _quoted(address)
    except (ValueError, UnicodeEncodeError) as exc:
        return type(exc)


@pytest.mark.parametrize("address", [
    "a@example.com", "first.last+tag@sub.example.co.uk", "o'brien@x.org", "a..b@x.org", ".a@x.org", "a.@x.org",
    "a@x..org", "a@-x.org", "a@x.org.", "a@[127.0.0.1]", '"quoted local"@x.org', "Name <a@x.org>", "a@x", "a",
    "", "a@b@c", "bounce+12-abcDEF_x@bounce.example.com", "ümlaut@x.org", "a@x.org ", " a@x.org",
])
def test_an_address_is_quoted_as_aiosmtplib_quotes_it(address):
    assert _ours(address) == _theirs(address)


def test_random_addresses_are_quoted_as_aiosmtplib_quotes_them():
    rng = random.Random(37)
    for _ in range(5000):
        local = "".join(rng.choice(ADDRESS_CHARS) for _ in range(rng.randint(0, 8)))
        domain = "".join(rng.choice(ADDRESS_CHARS) for _ in range(rng.randint(0, 8)))
        address = f"{local}@{domain}" if rng.random() < 0.8 else local + domain
        assert _ours(address) == _theirs(address), address
    _quoted_parsed.cache_clear()


def test_data_content_is_aiosmtplibs():
    rng = random.Random(37)
    samples = [b"", b".", b"\r\n", b"a\r\n.b\r\n", b"a\nb", b"a\rb\r\n", b"a\r\n", b"a", b"..\r\n", b"x\r\n.\r\n",
               b"Subject: x\r\n\r\n" + b"Lorem ipsum.\r\n" * 100]
    samples += [bytes(rng.choice(b"ab.\r\n") for _ in range(rng.randint(0, 12))) for _ in range(5000)]
    for payload in samples:
        assert _content(payload) == PERIOD_REGEX.sub(b"..", normalize_message_line_endings(payload)) + b".\r\n", payload


def test_line_ends_of_a_rendered_part_are_the_generators():
    rng = random.Random(37)
    samples = ["", "\r", "\n", "\r\n", "\n\r", "\r\r\n", "a\rb\nc\r\nd", "ü\r\n"]
    samples += ["".join(rng.choice("ab\r\n") for _ in range(rng.randint(0, 12))) for _ in range(5000)]
    for text in samples:
        assert _crlf(text) == _NLCRE.sub("\r\n", text), repr(text)
