"""The HTML compatibility check: which email clients support the HTML and CSS a message uses.

From caniemail.com's data as the npm package `caniemail` ships it (data/caniemail.json, made by
scripts/refresh_caniemail.py; never fetched at run time). The message's HTML part is read with the
standard library's html.parser, its CSS (style attributes and <style> blocks) with the small linear
tokenizer below; what they use is mapped to caniemail's features (slugs such as `html-img`,
`css-display-flex`). For each feature found, each client (a family and platform, e.g.
`gmail.android`) counts by the support of its latest tested version: supported (y), partial (a) or
unsupported (n); unknown (u, or no data) counts in none. The score is the share of supported
(client, feature) pairs among the known ones, a partial one counting half: 100 when nothing found
has a known problem.

Bounded: the first MAX_HTML characters of the HTML and MAX_CSS characters of CSS are read (the
answer says `truncated`), the CSS nesting depth is at most MAX_DEPTH; every step is linear.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from importlib import resources
from typing import Any

MAX_HTML = 1024 * 1024
MAX_CSS = 256 * 1024
MAX_DEPTH = 16

# HTML features found by an element name alone
_ELEMENTS = {
    "abbr": "html-abbr", "acronym": "html-acronym", "address": "html-address", "audio": "html-audio",
    "base": "html-base", "bdi": "html-bdi", "blockquote": "html-blockquote", "body": "html-body", "code": "html-code",
    "del": "html-del", "dfn": "html-dfn", "dialog": "html-dialog", "div": "html-div", "form": "html-form",
    "h1": "html-h1-h6", "h2": "html-h1-h6", "h3": "html-h1-h6", "h4": "html-h1-h6", "h5": "html-h1-h6",
    "h6": "html-h1-h6", "hr": "html-hr", "img": "html-img", "link": "html-link", "ul": "html-lists",
    "ol": "html-lists", "dl": "html-lists", "marquee": "html-marquee", "meter": "html-meter", "object": "html-object",
    "p": "html-p", "picture": "html-picture", "pre": "html-pre", "progress": "html-progress", "rp": "html-rp",
    "rt": "html-rt", "ruby": "html-ruby", "select": "html-select", "small": "html-small", "span": "html-span",
    "strike": "html-strike", "strong": "html-strong", "style": "html-style", "svg": "html-svg", "table": "html-table",
    "textarea": "html-textarea", "video": "html-video", "wbr": "html-wbr", "map": "html-image-maps",
    "article": "html-semantics", "aside": "html-semantics", "details": "html-semantics", "figcaption": "html-semantics",
    "figure": "html-semantics", "footer": "html-semantics", "header": "html-semantics", "main": "html-semantics",
    "mark": "html-semantics", "nav": "html-semantics", "section": "html-semantics", "summary": "html-semantics",
    "time": "html-semantics",
}
# HTML features found by an attribute on any element
_ATTRIBUTES = {
    "align": "html-align", "background": "html-background", "cellpadding": "html-cellpadding",
    "cellspacing": "html-cellspacing", "dir": "html-dir", "height": "html-height", "width": "html-width",
    "hidden": "html-hidden", "lang": "html-lang", "loading": "html-loading-attribute", "required": "html-required",
    "role": "html-role", "srcset": "html-srcset", "target": "html-target", "valign": "html-valign",
    "popover": "html-popover", "aria-describedby": "html-aria-describedby", "aria-hidden": "html-aria-hidden",
    "aria-label": "html-aria-label", "aria-labelledby": "html-aria-labelledby", "aria-live": "html-aria-live",
    "usemap": "html-image-maps",
}
_INPUT_TYPES = {"checkbox": "html-input-checkbox", "hidden": "html-input-hidden", "radio": "html-input-radio",
                "reset": "html-input-reset", "submit": "html-input-submit", "text": "html-input-text"}
_BUTTON_TYPES = {"reset": "html-button-reset", "submit": "html-button-submit"}
_IMAGE_EXTENSIONS = {"png": "image-png", "jpg": "image-jpg", "jpeg": "image-jpg", "gif": "image-gif",
                     "webp": "image-webp", "svg": "image-svg", "avif": "image-avif", "bmp": "image-bmp",
                     "ico": "image-ico", "tif": "image-tiff", "tiff": "image-tiff", "apng": "image-apng",
                     "heif": "image-heif", "heic": "image-heif", "hdr": "image-hdr", "mp4": "image-mp4"}

# CSS properties whose feature is named otherwise than css-<property>
_PROPERTY_ALIASES = {
    "top": "css-left-right-top-bottom", "right": "css-left-right-top-bottom", "bottom": "css-left-right-top-bottom",
    "left": "css-left-right-top-bottom", "inset": "css-inset", "grid-template-columns": "css-grid-template",
    "grid-template-rows": "css-grid-template", "grid-template-areas": "css-grid-template",
    "column-gap": "css-gap", "row-gap": "css-gap", "margin-inline": "css-margin-inline-block",
    "margin-block": "css-margin-inline-block", "margin-inline-start": "css-margin-inline-start-end",
    "margin-inline-end": "css-margin-inline-start-end", "margin-block-start": "css-margin-block-start-end",
    "margin-block-end": "css-margin-block-start-end", "padding-inline": "css-padding-inline-block",
    "padding-block": "css-padding-inline-block", "padding-inline-start": "css-padding-inline-start-end",
    "padding-inline-end": "css-padding-inline-start-end", "padding-block-start": "css-padding-block-start-end",
    "padding-block-end": "css-padding-block-start-end", "border-inline": "css-border-inline-block",
    "border-block": "css-border-inline-block", "inline-size": "css-inline-size", "block-size": "css-block-inline-size",
    "word-wrap": "css-word-wrap", "text-wrap": "css-text-wrap", "white-space-collapse": "css-white-space-collapse",
}
_PREFIX_ALIASES = (
    ("border-inline-", "css-border-inline-block-longhand"), ("border-block-", "css-border-inline-block-longhand"),
    ("border-top-left-radius", "css-border-radius"), ("border-top-right-radius", "css-border-radius"),
    ("border-bottom-left-radius", "css-border-radius"), ("border-bottom-right-radius", "css-border-radius"),
    ("border-start-", "css-border-radius-logical"), ("border-end-", "css-border-radius-logical"),
    ("border-", "css-border"), ("margin-", "css-margin"), ("padding-", "css-padding"),
    ("column-", "css-column-layout-properties"), ("columns", "css-column-layout-properties"),
    ("animation-", "css-animation"), ("transition-", "css-transition"), ("scroll-snap-", "css-scroll-snap"),
    ("mask-", "css-mask-image"), ("font-", "css-font"), ("background-", "css-background"),
)
_VALUE_FEATURES = (
    (re.compile(r"linear-gradient\(", re.I), "css-linear-gradient"),
    (re.compile(r"radial-gradient\(", re.I), "css-radial-gradient"),
    (re.compile(r"conic-gradient\(", re.I), "css-conic-gradient"),
    (re.compile(r"\brgb\(", re.I), "css-rgb"), (re.compile(r"\brgba\(", re.I), "css-rgba"),
    (re.compile(r"\bcalc\(", re.I), "css-unit-calc"), (re.compile(r"\bclamp\(", re.I), "css-function-clamp"),
    (re.compile(r"\bmin\(", re.I), "css-function-min"), (re.compile(r"\bmax\(", re.I), "css-function-max"),
    (re.compile(r"\blight-dark\(", re.I), "css-function-light-dark"), (re.compile(r"\bvar\(", re.I), "css-variables"),
    (re.compile(r"\b(?:hwb|lab|lch|oklab|oklch|color)\(", re.I), "css-modern-color"),
    (re.compile(r"\bsystem-ui\b", re.I), "css-sytem-ui"), (re.compile(r"\binitial\b", re.I), "css-unit-initial"),
)
_UNIT = re.compile(r"(?<![\w#-])[0-9]*\.?[0-9]+(px|em|rem|ex|ch|cm|mm|in|pt|pc|vh|vw|vmin|vmax|%)(?![\w-])", re.I)
_UNIT_FEATURE = {"%": "css-unit-percent"}
_DISPLAY = {"flex": "css-display-flex", "inline-flex": "css-display-flex", "grid": "css-display-grid",
            "inline-grid": "css-display-grid", "none": "css-display-none"}
_AT_RULES = {"font-face": "css-at-font-face", "import": "css-at-import", "keyframes": "css-at-keyframes",
             "media": "css-at-media", "supports": "css-at-supports"}
_MEDIA_FEATURES = (("prefers-color-scheme", "css-at-media-prefers-color-scheme"),
                   ("prefers-reduced-motion", "css-at-media-prefers-reduced-motion"),
                   ("orientation", "css-at-media-orientation"), ("hover", "css-at-media-hover"),
                   ("device-pixel-ratio", "css-at-media-device-pixel-ratio"), ("resolution", "css-at-media-device-pixel-ratio"))
_GROUP_AT_RULES = {"media", "supports", "document", "layer", "container"}
_PSEUDO = re.compile(r"(::?)([a-zA-Z-]+)")
_COMMENT = re.compile(r"/\*.*?\*/", re.S)


@dataclass
class Usage:
    """What a piece of HTML uses: feature slug -> times found; whether the input was cut."""

    found: dict[str, int] = field(default_factory=dict)
    truncated: bool = False

    def add(self, slug: str) -> None:
        self.found[slug] = self.found.get(slug, 0) + 1


def _property_feature(name: str, known: frozenset[str]) -> str | None:
    name = name.strip().lower()
    if name.startswith("--"):
        return "css-variables"
    for prefix in ("-webkit-", "-moz-", "-ms-", "-o-"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if name in _PROPERTY_ALIASES:
        return _PROPERTY_ALIASES[name]
    if f"css-{name}" in known:
        return f"css-{name}"
    for prefix, slug in _PREFIX_ALIASES:
        if name.startswith(prefix):
            return slug
    return None


def declarations(text: str, usage: Usage, known: frozenset[str]) -> None:
    """`prop: value; …` (a style attribute or a rule's block): each property and value feature."""
    for declaration in text.split(";"):
        name, sep, value = declaration.partition(":")
        if not sep or not name.strip():
            continue
        slug = _property_feature(name, known)
        if slug is not None:
            usage.add(slug)
        lowered = value.lower()
        if "!important" in lowered.replace(" ", ""):
            usage.add("css-important")
        if name.strip().lower() == "display":
            display = _DISPLAY.get(lowered.replace("!important", "").strip())
            if display:
                usage.add(display)
        for pattern, feature in _VALUE_FEATURES:
            if pattern.search(value):
                usage.add(feature)
        for unit in {m.group(1).lower() for m in _UNIT.finditer(value)}:
            usage.add(_UNIT_FEATURE.get(unit, f"css-unit-{unit}"))


def _selectors(prelude: str, usage: Usage) -> None:
    if "," in prelude:
        usage.add("css-selector-grouping")
    for part in prelude.split(","):
        selector = part.strip()
        if not selector:
            continue
        for kind, name in _PSEUDO.findall(selector):
            usage.add(("css-pseudo-element-" if kind == "::" or name.lower() in ("before", "after", "first-line",
                                                                                   "first-letter") else
                       "css-pseudo-class-") + name.lower())
        plain = _PSEUDO.sub("", re.sub(r"\[[^\]]*\]", "[]", selector))
        if "[" in plain:
            usage.add("css-selector-attribute")
        if ">" in plain:
            usage.add("css-selector-child")
        if "+" in plain:
            usage.add("css-selector-adjacent-sibling")
        if "~" in plain:
            usage.add("css-selector-general-sibling")
        compounds = re.split(r"\s*[>+~]\s*|\s+", plain.strip())
        if len([c for c in compounds if c]) > 1 and re.search(r"[^\s>+~]\s+[^\s>+~]", plain):
            usage.add("css-selector-descendant")
        for compound in compounds:
            if not compound:
                continue
            if compound.startswith("*"):
                usage.add("css-selector-universal")
            if re.match(r"[a-zA-Z]", compound):
                usage.add("css-selector-type")
            if "." in compound:
                usage.add("css-selector-class")
            if "#" in compound:
                usage.add("css-selector-id")
            if len(re.findall(r"(?:^[a-zA-Z*][\w-]*|[.#][\w-]+|\[\])", compound)) > 1:
                usage.add("css-selector-chaining")


def stylesheet(css: str, usage: Usage, known: frozenset[str]) -> None:
    """A <style> block: one linear pass over `{`, `}` and `;` with a stack of what each block holds
    (rules, declarations, keyframes); deeper than MAX_DEPTH is skipped, not parsed."""
    if _COMMENT.search(css):
        usage.add("css-comments")
        css = _COMMENT.sub(" ", css)
    stack: list[str] = []
    start = 0
    for match in re.finditer(r"[{};]", css):
        chunk, start, char = css[start:match.start()], match.end(), match.group()
        where = stack[-1] if stack else "rules"
        if char == "{":
            if len(stack) >= MAX_DEPTH or where == "skip":
                stack.append("skip")
                continue
            prelude = chunk.strip()
            if where == "decls":
                usage.add("css-nesting")
                _selectors(prelude, usage)
                stack.append("decls")
            elif prelude.startswith("@"):
                name = prelude[1:].split(None, 1)[0].lower() if len(prelude) > 1 else ""
                name = re.sub(r"^-\w+-", "", name)
                if name in _AT_RULES:
                    usage.add(_AT_RULES[name])
                if name == "media":
                    for needle, slug in _MEDIA_FEATURES:
                        if needle in prelude.lower():
                            usage.add(slug)
                stack.append("rules" if name in _GROUP_AT_RULES else "frames" if name == "keyframes" else "decls")
            elif where == "frames":
                stack.append("decls")
            else:
                _selectors(prelude, usage)
                stack.append("decls")
        elif char == ";":
            if where == "decls":
                declarations(chunk, usage, known)
            elif where == "rules" and chunk.strip().lower().startswith("@import"):
                usage.add("css-at-import")
        else:
            if where == "decls":
                declarations(chunk, usage, known)
            if stack:
                stack.pop()


class _Reader(HTMLParser):
    def __init__(self, usage: Usage, known: frozenset[str]) -> None:
        super().__init__(convert_charrefs=True)
        self.usage = usage
        self.known = known
        self.in_style = False
        self.css_budget = MAX_CSS

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        usage = self.usage
        if tag in _ELEMENTS:
            usage.add(_ELEMENTS[tag])
        values = {name: value or "" for name, value in attrs}
        for name in values:
            if name in _ATTRIBUTES:
                usage.add(_ATTRIBUTES[name])
        kind = values.get("type", "text" if tag == "input" else "submit").strip().lower()
        if tag == "input" and kind in _INPUT_TYPES:
            usage.add(_INPUT_TYPES[kind])
        if tag == "button" and kind in _BUTTON_TYPES:
            usage.add(_BUTTON_TYPES[kind])
        if tag == "a":
            href = values.get("href", "").strip().lower()
            if href.startswith("#"):
                usage.add("html-anchor-links")
            elif href.startswith("mailto:"):
                usage.add("html-mailto-links")
        if tag == "meta" and values.get("name", "").strip().lower() in ("color-scheme", "supported-color-schemes"):
            usage.add("html-meta-color-scheme")
        if tag == "img":
            src = values.get("src", "").strip()
            if src[:5].lower() == "data:":
                usage.add("image-base64")
                subtype = src[5:].split(";", 1)[0].split(",", 1)[0].lower().rpartition("/")[2].split("+")[0]
                if subtype in _IMAGE_EXTENSIONS:
                    usage.add(_IMAGE_EXTENSIONS[subtype])
            else:
                extension = src.split("?", 1)[0].split("#", 1)[0].rpartition(".")[2].lower()
                if extension in _IMAGE_EXTENSIONS:
                    usage.add(_IMAGE_EXTENSIONS[extension])
        style = values.get("style")
        if style and self.css_budget > 0:
            declarations(style[:self.css_budget], usage, self.known)
            self.css_budget -= len(style)
        self.in_style = tag == "style"

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        self.in_style = False

    def handle_endtag(self, tag: str) -> None:
        self.in_style = False

    def handle_data(self, data: str) -> None:
        if self.in_style and self.css_budget > 0:
            if len(data) > self.css_budget:
                self.usage.truncated = True
            stylesheet(data[:self.css_budget], self.usage, self.known)
            self.css_budget -= len(data)

    def handle_comment(self, data: str) -> None:
        self.usage.add("html-comments")

    def handle_decl(self, decl: str) -> None:
        if decl.lower().startswith("doctype"):
            self.usage.add("html-doctype")


@functools.cache
def data() -> dict[str, Any]:
    """caniemail's features as shipped (data/caniemail.json), read once a process."""
    text = resources.files("mailroom.checks").joinpath("data/caniemail.json").read_text(encoding="utf-8")
    doc = json.loads(text)
    doc["by_slug"] = {f["slug"]: f for f in doc["features"]}
    doc["clients"] = sorted({client for f in doc["features"] for client in f["support"]})
    return doc


def usage_of(html: str) -> Usage:
    """The caniemail features an HTML document uses (bounded: MAX_HTML characters, MAX_CSS of CSS)."""
    known = frozenset(data()["by_slug"])
    usage = Usage(truncated=len(html) > MAX_HTML)
    reader = _Reader(usage, known)
    reader.feed(html[:MAX_HTML])
    reader.close()
    if reader.css_budget < 0:
        usage.truncated = True
    usage.found = {slug: n for slug, n in usage.found.items() if slug in known}
    return usage


def check(html: str) -> dict[str, Any]:
    """The HtmlCheck answer (docs/checks.md): score, clients, features found with their counts and notes."""
    doc = data()
    usage = usage_of(html)
    clients = doc["clients"]
    features = []
    total = {"y": 0, "a": 0, "n": 0}
    for slug in sorted(usage.found):
        entry = doc["by_slug"][slug]
        counts = {"y": 0, "a": 0, "n": 0}
        notes: list[str] = []
        for client in clients:
            value = entry["support"].get(client, "u")
            level = value[:1]
            if level in counts:
                counts[level] += 1
            for number in re.findall(r"#(\d+)", value):
                note = entry["notes_by_num"].get(number)
                if note and note not in notes:
                    notes.append(note)
        if entry.get("notes") and entry["notes"] not in notes:
            notes.insert(0, entry["notes"])
        for level in total:
            total[level] += counts[level]
        features.append({
            "name": slug, "title": entry["title"], "kind": "css" if slug.startswith("css-") else "html",
            "supported": counts["y"], "partial": counts["a"], "unsupported": counts["n"], "notes": notes,
            "url": entry["url"], "found": usage.found[slug],
        })
    known = sum(total.values())
    score = 100.0 if known == 0 else round(100 * (total["y"] + total["a"] / 2) / known, 1)
    return {"score": score, "clients": len(clients), "features": features, "source": doc["source"],
            "truncated": usage.truncated}
