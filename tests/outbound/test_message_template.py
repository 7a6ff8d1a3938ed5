"""The sender's message template (message.render) gives the builder's bytes, byte for byte.

`message_bytes()` renders a message without attachments straight to bytes; it must be exactly
`build_message(row, list_unsubscribe).as_bytes()` for the same row. Both choose the multipart
boundary with the module's `random`, so each comparison seeds it the same way before each side.
What the template does not cover (attachments, an extra Content-* or MIME-Version header, a row
the builder cannot build) goes to the builder: render() says so with None, and the guard is tested.
"""

from __future__ import annotations

import datetime
import random
import string

import pytest

from mailroom.core import fastpaths
from mailroom.outbound import message, smtp

WORDS = ["hello", "café", "Grüße", "—", "日本語のテキスト", "naïve", "x" * 90, "=?utf-8?q?x?=", "a,b", "<tag>", "\"q\"",
         "tab\there", "semi;colon", "emoji 🎉", "", " ", "From me", ".dot", "ÄÖÜ" * 30, "=3D", "trailing "]


NAMES = ["Jörg Müller", "Ann Lee", '"O\'Brien, Pat"', "山田 太郎", "A" * 80]


def _words(rnd: random.Random, most: int) -> str:
    return " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(0, most)))


def _address(rnd: random.Random) -> str:
    local = "".join(rnd.choice(string.ascii_lowercase + string.digits + ".+_-") for _ in range(rnd.randint(1, 40)))
    address = f"{local or 'a'}@{rnd.choice(['example.com', 'mailroom.test', 'sub.domain.example.org'])}"
    if rnd.random() < 0.15:
        return rnd.choice(NAMES) + f" <{address}>"
    return address


def _body(rnd: random.Random) -> str | None:
    roll = rnd.random()
    if roll < 0.15:
        return None
    if roll < 0.2:
        return ""
    lines = []
    for _ in range(rnd.randint(1, 30)):
        kind = rnd.random()
        if kind < 0.1:
            lines.append("x" * rnd.randint(70, 300))  # longer than the policy's 78: qp or base64
        elif kind < 0.2:
            lines.append("日本語" * rnd.randint(1, 40))  # mostly non-ASCII: base64 wins the sniff
        elif kind < 0.3:
            lines.append(rnd.choice([".", "..", ".leading dot", "From the start", "=", "-- ", "--boundary"]))
        else:
            lines.append(_words(rnd, 12))
    sep = rnd.choice(["\n", "\r\n", "\r", "\n\n"])
    return sep.join(lines) + rnd.choice(["", "\n", "\r\n", "\n\n"])


def _headers(rnd: random.Random) -> dict[str, str] | None:
    roll = rnd.random()
    if roll < 0.3:
        return None
    if roll < 0.4:
        return {}
    names = ["Reply-To", "X-Campaign", "X-A-Rather-Long-Header-Name-For-Folding", "List-Unsubscribe",
             "List-Unsubscribe-Post", "In-Reply-To", "References", "X-Priority"]
    headers = {}
    for name in rnd.sample(names, rnd.randint(1, len(names))):
        headers[name] = rnd.choice([_words(rnd, 20), _address(rnd), "<https://u.example/x>, <mailto:u@x>",
                                    " ".join(f"<m{i}@mailroom.test>" for i in range(rnd.randint(1, 12)))])
    return headers


def random_row(rnd: random.Random) -> dict:
    tz = datetime.timezone(datetime.timedelta(minutes=rnd.choice([0, 60, -300, 330, 765])))
    return {
        "subject": rnd.choice([_words(rnd, 25), "plain subject", "", "x" * rnd.randint(60, 200),
                               "caf\u00e9 " * rnd.randint(1, 30), "new\r\nline", "bench 1"]),
        "from_address": _address(rnd),
        "to_addrs": [_address(rnd) for _ in range(rnd.choice([0, 1, 1, 2, 5, 12]))],
        "cc_addrs": [_address(rnd) for _ in range(rnd.choice([0, 0, 1, 3]))],
        "bcc_addrs": [_address(rnd) for _ in range(rnd.choice([0, 0, 2]))],
        "created_at": datetime.datetime(2026, rnd.randint(1, 12), rnd.randint(1, 28), rnd.randint(0, 23),
                                        rnd.randint(0, 59), rnd.randint(0, 59), rnd.randint(0, 999999), tzinfo=tz),
        "message_id": f"<{rnd.getrandbits(128):032x}@mailroom.test>",
        "headers": _headers(rnd),
        "text_body": _body(rnd),
        "html_body": _body(rnd),
    }


def _unsubscribe(rnd: random.Random) -> str | None:
    return rnd.choice([None, None, "<mailto:unsub+abc@mailroom.test>",
                       "<https://mailroom.test/u/" + "t" * rnd.randint(10, 120) + ">, <mailto:u@mailroom.test>"])


def builder_bytes(row: dict, list_unsubscribe: str | None, seed: int) -> bytes:
    random.seed(seed)
    return message.build_message(row, list_unsubscribe).as_bytes()


def rendered_bytes(row: dict, list_unsubscribe: str | None, seed: int) -> bytes | None:
    random.seed(seed)
    return message.render(row, list_unsubscribe)


def test_render_is_byte_identical_to_the_builder_on_random_rows():
    rnd = random.Random(25)
    rendered = multipart = 0
    for i in range(3000):
        row = random_row(rnd)
        if row["text_body"] is None and row["html_body"] is None:
            row["text_body"] = "only text"
        lu = _unsubscribe(rnd)
        data = rendered_bytes(row, lu, i)
        assert data is not None, row  # no Content-* extras, no attachments: the template covers it
        assert data == builder_bytes(row, lu, i), (row, lu)
        rendered += 1
        multipart += row["text_body"] is not None and row["html_body"] is not None
    assert rendered == 3000 and multipart > 1000


@pytest.mark.parametrize("row_changes", [
    {"subject": "Grüße — ünïcode " * 8},  # RFC 2047, folded over several lines
    {"subject": "a" * 200},  # one word longer than a line
    {"subject": "word " * 40},  # plain, folded at spaces
    {"to_addrs": []},  # undisclosed-recipients:;
    {"to_addrs": [f"r{i}@example.com" for i in range(30)], "cc_addrs": [f"c{i}@example.com" for i in range(30)]},
    {"from_address": "Jörg Müller <j@example.com>"},
    {"text_body": "", "html_body": None},
    {"text_body": None, "html_body": ""},
    {"text_body": "", "html_body": ""},
    {"text_body": "é" * 500, "html_body": "<p>" + "x" * 2000 + "</p>"},
    {"text_body": "line\n" * 11 + "é", "html_body": None},  # more than the 10 lines qp sniffs
    {"text_body": "--===============", "html_body": "=" * 100},
    {"headers": {"Reply-To": "help@mailroom.test", "X-Long": "v " * 100, "X-Unicode": "Grüße " * 20}},
    {"headers": {"List-Unsubscribe": "<mailto:app@x>", "list-unsubscribe-post": "app"}},
])
@pytest.mark.parametrize("lu", [None, "<mailto:u@mailroom.test>", "<https://mailroom.test/u/1>, <mailto:u@x>"])
def test_render_is_byte_identical_on_edge_rows(row_changes, lu):
    row = random_row(random.Random(0)) | {"headers": None, "text_body": "t", "html_body": "<p>h</p>"} | row_changes
    data = rendered_bytes(row, lu, 7)
    assert data is not None
    assert data == builder_bytes(row, lu, 7)


def test_per_recipient_transactions_carry_the_builder_bytes():
    """VERP return paths and per-recipient List-Unsubscribe: one message per recipient, each the builder's."""
    rnd = random.Random(3)
    row = random_row(rnd) | {"text_body": "t", "html_body": "<p>h</p>", "headers": {"X-A": "b"}}
    rcpts = ["a@example.com", "b@example.com", "c@example.com"]
    row |= {"recipients": rcpts, "return_paths": [f"b+{i}@bounce.test" for i in range(3)],
            "list_unsubscribe": ["<https://u/1>", "<mailto:u2@x>", "<https://u/3>, <mailto:u3@x>"]}
    random.seed(11)
    got = smtp._transactions(row, None)
    random.seed(11)
    want = [message.build_message(row, lu).as_bytes() for lu in row["list_unsubscribe"]]
    assert [(m, r) for m, r, _ in got] == [(f"b+{i}@bounce.test", [rcpt]) for i, rcpt in enumerate(rcpts)]
    assert [data for _, _, data in got] == want
    assert all(b"List-Unsubscribe: " + lu.encode() in data for lu, data in zip(row["list_unsubscribe"], want, strict=True))


GUARDED = [
    {"attachments": [{"name": "a.txt", "content_type": "text/plain", "content_base64": "aGk="}]},
    {"headers": {"Content-Type": "text/plain"}},
    {"headers": {"content-language": "de"}},
    {"headers": {"MIME-Version": "1.0"}},
    {"headers": {"X-Ok": "1", "Content-Disposition": "inline"}},
]


@pytest.mark.parametrize("row_changes", GUARDED)
def test_guard_sends_what_the_template_does_not_cover_to_the_builder(row_changes):
    row = random_row(random.Random(1)) | {"text_body": "t", "html_body": "<p>h</p>"} | row_changes
    assert not message.renders(row)
    assert rendered_bytes(row, None, 5) is None
    random.seed(5)
    assert message.message_bytes(row) == builder_bytes(row, None, 5)


def test_a_row_the_builder_cannot_build_fails_the_same_way():
    """A Content-Type extra header of a multipart kind makes set_content raise: the template leaves
    it to the builder, so the sender reports the same 'cannot build' (its exception's name)."""
    row = random_row(random.Random(2)) | {"headers": {"Content-Type": "multipart/mixed"}, "text_body": "t"}
    with pytest.raises(TypeError):
        message.build_message(row).as_bytes()
    with pytest.raises(TypeError):
        message.message_bytes(row)
    bad = random_row(random.Random(2)) | {"subject": None, "text_body": "t"}
    assert message.render(bad) is None
    with pytest.raises(AttributeError):
        message.message_bytes(bad)


def test_the_per_sender_template_is_per_from_address():
    rnd = random.Random(4)
    rows = [random_row(rnd) | {"text_body": "t", "from_address": a} for a in ("a@x.test", "Ä <b@x.test>", "a@x.test")]
    for i, row in enumerate(rows):
        assert rendered_bytes(row, None, i) == builder_bytes(row, None, i)
    assert message._TEMPLATES["a@x.test"].from_line == b"From: a@x.test\r\n"


def test_the_stdlib_internals_the_fast_paths_use_are_there():
    """outbound/message.py overrides compat32's private _fold and calls contentmanager._encode_text: on a
    Python where either moved, the fast paths would go quiet (the same bytes, slower); this fails then."""
    import inspect
    from email import contentmanager
    from email.policy import compat32

    assert message._encode_text is contentmanager._encode_text
    assert "self._fold(" in inspect.getsource(type(compat32).fold_binary)
    assert "self._fold(" in inspect.getsource(type(compat32).fold)
    assert message._FAST is fastpaths.enabled()
