"""The core flows on a Citus coordinator with two workers, through the same CLI and SQL API."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.citus


def test_schema_is_distributed(cconn):
    kinds = dict(cconn.execute(
        "SELECT logicalrelid::regclass::text, partmethod FROM pg_dist_partition"
        " WHERE logicalrelid::regclass::text LIKE 'mailroom.%'"
    ).fetchall())
    assert kinds["mailroom.messages"] == "h"
    assert kinds["mailroom.outbound_messages"] == "h"
    assert kinds["mailroom.plans"] == "n"  # reference
    workers = cconn.execute("SELECT count(*) FROM pg_dist_node WHERE groupid <> 0").fetchone()[0]
    assert workers == 2


def test_demo_story_on_citus(ccli):
    """The activation story end to end: account -> token -> collect -> send -> inbox serve -> consume."""
    proc = ccli("demo", "--pace", "0", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "status is now active" in out
    assert re.search(r"expire_mailboxes\(\) expired 1 inbox", out)
    assert "refused at RCPT: 550" in out
    assert "every process the demo started has stopped" in out
