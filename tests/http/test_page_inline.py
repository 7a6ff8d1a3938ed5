"""page.inline_images: the frame's HTML with the cid: references SQL chose rewritten to data: URIs (issue 44
item 3); every other reference left as it is, in one linear pass."""
from __future__ import annotations

import base64
import hashlib

from mailroom.http.page import inline_images


def part(cid: str, data: bytes, content_type: str = "image/png") -> dict:
    return {"cid": cid, "content_type": content_type, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def test_only_the_chosen_references_become_data_uris():
    logo = b"\x89PNG logo"
    uri = "data:image/png;base64," + base64.b64encode(logo).decode()
    html = "<img src='cid:logo@x'><img src=\"cid:gone@x\"><p style='background:url(CID:logo@x)'>cid:logo@x.</p>"
    out = inline_images(html, [part("logo@x", logo)], {hashlib.sha256(logo).hexdigest(): logo})
    assert out == f"<img src='{uri}'><img src=\"cid:gone@x\"><p style='background:url({uri})'>cid:logo@x.</p>"


def test_a_part_not_found_or_of_another_size_is_left_as_it_is():
    logo = b"\x89PNG logo"
    html = "<img src='cid:logo@x'>"
    assert inline_images(html, [part("logo@x", logo)], {}) == html
    chosen = part("logo@x", logo) | {"size": len(logo) + 1}
    assert inline_images(html, [chosen], {chosen["sha256"]: logo}) == html
    assert inline_images(None, [part("logo@x", logo)], {hashlib.sha256(logo).hexdigest(): logo}) is None


def test_many_references_in_one_pass():
    logo = b"\x89PNG logo"
    html = "cid:" * 200_000 + "<img src='cid:logo@x'>" + "cid:logo@x " * 50_000
    out = inline_images(html, [part("logo@x", logo)], {hashlib.sha256(logo).hexdigest(): logo})
    assert out.count("data:image/png;base64,") == 50_001


def test_a_reference_repeated_cannot_blow_the_frame_up():
    """The attacker review (issue 45, item 5): SQL caps the distinct images (8 MiB), but one 100 KiB image
    and 150 KB of `<img src=cid:a>` made 1.3 GB of data: URIs, built on the HTTP server's event loop. What
    the rewrite emits is bounded: past INLINE_EMITTED_MAX, a reference is left as it is (it shows nothing)."""
    from mailroom.http.page import INLINE_EMITTED_MAX

    image = bytes(range(256)) * 400  # 100 KiB
    html = "<img src=cid:a>" * 10_000
    out = inline_images(html, [part("a", image)], {hashlib.sha256(image).hexdigest(): image})
    assert len(out) <= len(html) + INLINE_EMITTED_MAX
    uri_len = len(base64.b64encode(image)) + len("data:image/png;base64,")
    assert out.count("data:image/png;base64,") == INLINE_EMITTED_MAX // uri_len
    assert out.count("cid:a") == 10_000 - INLINE_EMITTED_MAX // uri_len
