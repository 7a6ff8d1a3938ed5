"""The address of an SMTP MAIL FROM or RCPT TO argument, read in time linear in its length.

aiosmtpd reads it with email's header parser (get_angle_addr / get_addr_spec), whose cost grows
faster than the argument on quotes, dots and backslashes (a 1,000-byte command line costs tens
of milliseconds of the event loop that every session shares). parse_path reads the RFC 5321
forms instead, with regular expressions that consume each character once:

    Path  = "<" [ A-d-l ":" ] Mailbox ">"  |  "<>"  |  Mailbox (bare, as aiosmtpd accepts it)
    Mailbox = Local-part "@" ( Domain | "[" address literal "]" )
    Local-part = dot-string (atext and dots, as aiosmtpd accepts `a..b`) | quoted-string

and gives what aiosmtpd's `SMTP._getaddr` gives for each of them (tests/inboxes/
test_inbox_fastpaths.py compares both); RFC 5322 forms that RFC 5321 does not allow in a path
(comments or spaces inside the angle brackets, encoded words, control characters) are refused
(None, None): the client gets aiosmtpd's 553 syntax reply.
"""

from __future__ import annotations

import re

# atext of RFC 5322 plus any non-ASCII character (RFC 6531, SMTPUTF8); no control character
_ATEXT = r"[^\x00-\x20\x7f()<>@,;:\\\".\[\]]"
_LOCAL_DOT = re.compile(rf"(?:{_ATEXT}|\.)+")
_LOCAL_QUOTED = re.compile(r'"((?:[^"\\\x00-\x08\x0a-\x1f\x7f]|\\[^\x00\x0a\x0d])*)"')
_DOMAIN = re.compile(rf"{_ATEXT}+(?:\.{_ATEXT}+)*|\[[^\[\]\\\x00-\x20\x7f]*\]")
_ROUTE = re.compile(rf"@(?:{_DOMAIN.pattern})(?:,@(?:{_DOMAIN.pattern}))*:")
_UNQUOTE = re.compile(r"\\(.)")
# characters that make email's AddrSpec quote a local part again (DOT_ATOM_ENDS)
_NEEDS_QUOTES = re.compile(r'[\s()<>@,:;\\"\[\]]')
MAX_PATH = 4096  # longer arguments are refused without reading them (RFC 5321 allows 256)


def _local_part(arg: str, i: int) -> tuple[str | None, int]:
    dot = _LOCAL_DOT.match(arg, i)
    if dot is not None:
        return dot.group(0), dot.end()
    quoted = _LOCAL_QUOTED.match(arg, i)
    if quoted is None:
        return None, i
    text = _UNQUOTE.sub(r"\1", quoted.group(1))
    if text == "":
        return None, i
    if _NEEDS_QUOTES.search(text):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text, quoted.end()


def _skip_comments(arg: str, i: int) -> int | None:
    """Past white space and (nested) comments after a path; None when a comment is not closed."""
    n = len(arg)
    while i < n:
        if arg[i] in " \t":
            i += 1
            continue
        if arg[i] != "(":
            return i
        depth = 0
        while i < n:
            c = arg[i]
            if c == "\\":
                i += 2
                continue
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    i += 1
                    break
            i += 1
        if depth:
            return None
    return i


def parse_path(arg: str, local_part_limit: int = 0) -> tuple[str | None, str | None]:
    """(address, the rest of the argument) as aiosmtpd's SMTP._getaddr returns it for an RFC 5321
    path, `('<>', rest)` for the null path, `('', '')` for an empty argument; (None, None) when
    the argument is not a path or its local part is longer than `local_part_limit` (0: no limit)."""
    if not arg:
        return "", ""
    if len(arg) > MAX_PATH:
        return None, None
    i = len(arg) - len(arg.lstrip(" \t"))
    angle = arg.startswith("<", i)
    if angle:
        i += 1
        if arg.startswith(">", i):
            return "<>", arg[i + 1:]
        route = _ROUTE.match(arg, i)
        if route is not None:
            i = route.end()
    local, i = _local_part(arg, i)
    if local is None or not arg.startswith("@", i):
        return None, None
    domain = _DOMAIN.match(arg, i + 1)
    if domain is None:
        return None, None
    i = domain.end()
    if angle:
        if not arg.startswith(">", i):
            return None, None
        i += 1
    elif i < len(arg) and arg[i] not in " \t":  # a bare address ends at white space
        return None, None
    if local_part_limit and len(local) > local_part_limit:
        return None, None
    rest_start = _skip_comments(arg, i)
    if rest_start is None:
        return None, None
    return f"{local}@{domain.group(0)}", arg[rest_start:]
