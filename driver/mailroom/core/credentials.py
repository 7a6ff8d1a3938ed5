"""The digest of an API key: what a face sends to SQL in its place (docs/architecture.md, Layering).

One function for every face that takes a key (`http`, `mcp`; SMTP AUTH's credential too): the key is
stripped of surrounding blanks and hashed with sha256; only the digest travels to SQL, which decides.
"""

from __future__ import annotations

import hashlib


def key_digest(value: str | None) -> bytes | None:
    """The sha256 of an API key (what SQL compares); None without one (absent or blank). Any other value
    is only a digest too: SQL refuses it as an unknown key."""
    if not value or not value.strip():
        return None
    return hashlib.sha256(value.strip().encode()).digest()
