"""The HTML check (docs/checks.md): a crafted message's HTML and CSS mapped to caniemail's features,
counted against the shipped data; the refusals of the three checks on a server that runs none."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from checks_support import assert_shape

from mailroom.checks import html as html_check
from mailroom.checks.links import LinkPolicy
from mailroom.checks.spam import Spamd
from mailroom.http import models

CRAFTED = """<!DOCTYPE html>
<html lang="en"><head>
<meta name="color-scheme" content="light dark">
<style>
  /* dark mode */
  @media (prefers-color-scheme: dark) { .card > p:hover { color: rgb(250, 250, 250) !important; } }
  .row { display: flex; gap: 8px; }
</style></head>
<body>
  <div class="row" style="display: grid; background-image: linear-gradient(red, blue); width: 50%">
    <img src="https://example.org/logo.webp" width="20" alt="">
    <svg width="10" height="10"></svg>
    <form action="https://example.org/f"><input type="checkbox" name="c"></form>
    <a href="#top">top</a>
  </div>
</body></html>"""


def _shipped() -> dict:
    return json.loads(resources.files("mailroom.checks").joinpath("data/caniemail.json").read_text())


def _expected(slug: str) -> tuple[int, int, int]:
    feature = next(f for f in _shipped()["features"] if f["slug"] == slug)
    levels = [v[:1] for v in feature["support"].values()]
    return levels.count("y"), levels.count("a"), levels.count("n")


def test_the_crafted_messages_features_are_found_and_counted() -> None:
    result = html_check.check(CRAFTED)
    found = {f["name"]: f for f in result["features"]}
    for slug in ("css-display-flex", "css-display-grid", "css-gap", "css-linear-gradient", "css-at-media-prefers-color-scheme",
                 "css-pseudo-class-hover", "css-selector-child", "css-important", "css-rgb", "css-comments", "css-unit-percent",
                 "html-svg", "html-form", "html-input-checkbox", "html-anchor-links", "html-meta-color-scheme", "html-doctype",
                 "html-lang", "html-width", "image-webp", "html-style"):
        assert slug in found, f"{slug} not found in {sorted(found)}"
        assert (found[slug]["supported"], found[slug]["partial"], found[slug]["unsupported"]) == _expected(slug), slug
    for absent in ("html-video", "css-position", "html-table", "css-at-font-face"):
        assert absent not in found, f"{absent} is not in the message"
    # known unsupported features are counted: Outlook on Windows lacks flex, forms and SVG
    for slug in ("css-display-flex", "html-svg", "html-form"):
        assert found[slug]["unsupported"] > 0, slug
    assert found["css-display-flex"]["kind"] == "css" and found["html-svg"]["kind"] == "html"
    assert any("#" not in note and note for f in result["features"] for note in f["notes"])
    assert result["clients"] == len({c for f in _shipped()["features"] for c in f["support"]}) > 30
    assert result["source"] == "caniemail 2.0.2"
    y = sum(f["supported"] for f in result["features"])
    a = sum(f["partial"] for f in result["features"])
    n = sum(f["unsupported"] for f in result["features"])
    assert result["score"] == round(100 * (y + a / 2) / (y + a + n), 1)
    assert 0 < result["score"] < 100
    assert result["truncated"] is False


def test_plain_html_scores_what_its_features_score_and_big_input_is_cut() -> None:
    assert html_check.check("<p>hello</p>")["features"][0]["name"] == "html-p"
    assert html_check.check("just text")["score"] == 100.0  # nothing found: nothing unsupported
    # the CSS read is bounded (MAX_CSS): the rest is not parsed, and the answer says so
    big = html_check.check("<style>" + "a{color:red}" * (html_check.MAX_CSS // 12 + 10) + "</style><p>x</p>")
    assert big["truncated"] is True and {f["name"] for f in big["features"]} >= {"html-style", "html-p"}


def test_the_html_check_over_http(serve, inbox, deliver) -> None:
    server = serve()
    address, token = inbox(server)
    crafted = deliver(address, "crafted", text="hello", html=CRAFTED)
    plain = deliver(address, "plain", text="no html here")
    answer = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{crafted}/checks/html", token=token)
    assert answer.status == 200, answer.body
    doc = answer.json()
    assert_shape(doc, models.HtmlCheck)
    assert doc == json.loads(json.dumps(html_check.check(CRAFTED)))
    for feature in doc["features"]:
        assert_shape(feature, models.HtmlFeature)
    # no HTML part: MR282, 404
    none = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{plain}/checks/html", token=token)
    assert (none.status, none.error_code) == (404, "MR282"), none.body
    # another inbox's credential: refused as every read is
    other, other_token = inbox(server)
    refused = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{crafted}/checks/html", token=other_token)
    assert refused.status == 403, refused.body
    # a check does not mark the message read
    listed = server.request("GET", f"/api/v1/mailboxes/{address}/messages", token=token).json()
    assert [m["is_read"] for m in listed] == [False, False]
    # this server runs neither the link check nor the spam check: 503 with their codes, no Retry-After
    for check, code, flag in (("links", "MR280", "--link-check"), ("spam", "MR281", "--spamd")):
        off = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{crafted}/checks/{check}", token=token)
        assert (off.status, off.error_code) == (503, code), off.body
        assert flag in off.json()["detail"]
        assert "retry-after" not in off.headers
    # without credentials, 401 before anything
    anonymous = server.request("GET", f"/api/v1/mailboxes/{address}/messages/{crafted}/checks/links")
    assert anonymous.status == 401


def test_bad_check_flags_are_one_line_and_exit_2(cli) -> None:
    done = cli("http", "serve", "--port", "0", "--link-check", "--link-check-allow", "127.0.0.1/32,not-a-net")
    assert done.returncode == 2, done.stderr
    assert "not an IP network: 'not-a-net'" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(ValueError, match="host:port"):
        Spamd.parse("localhost")
    assert Spamd.parse("[::1]:783") == Spamd("::1", 783)
    with pytest.raises(ValueError, match="not an IP network"):
        LinkPolicy.parse(["10.0.0.0/8", "ten"])
