"""The psql session in docs/accounts.md works when pasted: run it through the real psql."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "accounts.md"


def _session() -> str:
    text = DOC.read_text()
    start = text.index("## A psql session")
    match = re.search(r"```sql\n(.*?)```", text[start:], re.S)
    assert match, "docs/accounts.md has a psql session"
    return match.group(1)


def test_docs_psql_session_runs(db_url: str) -> None:
    psql = shutil.which("psql") or "/usr/lib/postgresql/15/bin/psql"
    if not Path(psql).exists():
        pytest.skip("psql not installed")
    out = subprocess.run([psql, "-X", db_url], input=_session(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    errors = [line for line in out.stderr.splitlines() if "ERROR" in line]
    # the one error the session demonstrates; a wrong code is a row, not an error
    assert any("token already used" in e for e in errors), out.stderr
    assert all("token already used" in e for e in errors), errors
    assert "| wrong_code |             4" in out.stdout, out.stdout  # (fails 1 time in 10^5: 00000 drawn)
    assert 'Asynchronous notification "token_insert" with payload "1"' in out.stdout
    assert "active | 2030-01-01 12:00:00+00" in out.stdout
    assert out.stdout.count("account_id") == 2
