"""`mailroom db import-seed`: bring a database of the original mailroom (the seed's schema in `public`:
accounts, tokens, jobs; epoch integers) over into mailroom.

This module only reads: plain SELECTs on the source (one read-only REPEATABLE READ transaction, so
every batch sees the same seed), in batches of accounts by id with their tokens. Each batch goes to
mailroom.import_seed_accounts (sql/16_import.sql), where every rule lives: statuses, timestamps,
which tokens come over, which are already dispatched (jobs.last_seq), collisions. The one thing done
here is hashing: a token's secret and code become their digests (sha256(secret),
sha256(secret || code), as sql/11_tokens.sql keeps them), so no secret or code leaves this process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from mailroom.core.errors import UserError, db_user_error
from mailroom.db.connect import _failed, connect, with_defaults

BATCH = 500

_TABLES = """
SELECT array(
    SELECT c.relname::text FROM pg_catalog.pg_class AS c
    JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relname IN ('accounts', 'tokens', 'jobs') AND c.relkind IN ('r', 'p')
)
"""
_LAST_SEQ = "SELECT last_seq FROM public.jobs WHERE job_type::text = 'mailroom'"
_ACCOUNTS = """
SELECT id, email::text, login::text, status::text, created_at, status_changed_at, activated_at, suspended_at,
    unsuspended_at
FROM public.accounts
WHERE id > %s
ORDER BY id
LIMIT %s
"""
_TOKENS = """
SELECT id, action::text, secret, code::text, account, expires_at, consumed_at, created_at
FROM public.tokens
WHERE account = ANY(%s)
ORDER BY id
"""


@dataclass
class ImportSummary:
    """What the import did, summed over batches: (item, count) in the order SQL returns them."""

    counts: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    dispatched_up_to: int = 0

    def add(self, rows: list[Any]) -> None:
        for row in rows:
            self.counts[row.item] = self.counts.get(row.item, 0) + int(row.affected)
        self.batches += 1


def _digests(secret: bytes | None, code: str | None) -> tuple[str | None, str | None]:
    if secret is None:
        return None, None
    secret = bytes(secret)
    code_digest = hashlib.sha256(secret + code.encode()).hexdigest() if code is not None else None
    return hashlib.sha256(secret).hexdigest(), code_digest


def _token(row: tuple) -> dict[str, Any]:
    tid, action, secret, code, account, expires_at, consumed_at, created_at = row
    secret_digest, code_digest = _digests(secret, code)
    return {"id": tid, "action": action, "account": account, "expires_at": expires_at, "consumed_at": consumed_at,
            "created_at": created_at, "secret_digest": secret_digest, "code_digest": code_digest}


def read_seed(source: psycopg.Connection, batch: int = BATCH) -> tuple[int, Iterator[tuple[list, list]]]:
    """(jobs.last_seq, batches of (accounts, tokens) as JSON-ready dicts, tokens digested)."""
    tables = set(source.execute(_TABLES).fetchone()[0])
    missing = {"accounts", "tokens", "jobs"} - tables
    if missing:
        raise UserError(f"the source database has no seed schema: public.{', public.'.join(sorted(missing))} "
                        "missing (expected the original mailroom's accounts, tokens and jobs)", exit_code=2)
    row = source.execute(_LAST_SEQ).fetchone()
    last_seq = int(row[0]) if row and row[0] is not None else 0

    def batches() -> Iterator[tuple[list, list]]:
        after = 0
        while True:
            rows = source.execute(_ACCOUNTS, (after, batch)).fetchall()
            if not rows:
                return
            accounts = [dict(zip(("id", "email", "login", "status", "created_at", "status_changed_at",
                                  "activated_at", "suspended_at", "unsuspended_at"), r, strict=True)) for r in rows]
            ids = [a["id"] for a in accounts]
            tokens = [_token(t) for t in source.execute(_TOKENS, (ids,)).fetchall()]
            yield accounts, tokens
            after = ids[-1]

    return last_seq, batches()


def import_seed(target_url: str, source_url: str, *, batch: int = BATCH,
                progress: Callable[[ImportSummary], None] | None = None) -> ImportSummary:
    """Read the seed at `source_url` and import it into mailroom at `target_url`, one transaction a batch
    (a run cut short is finished by running it again: what came over is skipped as already imported)."""
    from mailroom.db import sqlapi

    summary = ImportSummary()
    try:
        source = psycopg.connect(with_defaults(source_url), autocommit=False, application_name="mailroom import-seed",
                                 prepare_threshold=None)
    except psycopg.Error as exc:
        failed = _failed(exc)
        raise UserError(f"source: {failed}", exit_code=failed.exit_code) from None
    with source, connect(target_url, application_name="mailroom import-seed") as target:
        try:
            source.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            source.read_only = True
            last_seq, batches = read_seed(source, batch)
            summary.dispatched_up_to = last_seq
            for accounts, tokens in batches:
                try:
                    with target.transaction():
                        summary.add(sqlapi.import_seed_accounts.rows(
                            target, accounts=Jsonb(accounts), tokens=Jsonb(tokens), dispatched_up_to=last_seq))
                except psycopg.Error as exc:
                    raise db_user_error(exc) from None
                if progress:
                    progress(summary)
        except psycopg.Error as exc:
            raise UserError(f"reading the source database: {exc.diag.message_primary or type(exc).__name__}",
                            exit_code=1) from None
    return summary
