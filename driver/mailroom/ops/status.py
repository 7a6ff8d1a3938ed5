"""`mailroom status`: the whole installation on one screen, read now (nothing cached).

Queues (outbound: mailroom.outbound_stats; tokens and inbox expiry: mailroom.queue_health), workers
(mailroom.worker_health: running, lost, stopped), inboxes (mailroom.inbox_stats), partitions
(mailroom.partition_status) and the last maintenance (mailroom.job_runs). Every number is one of
these SQL functions' answers (mailroom_monitor may call them all); a section the login may not read
says so in one line and names the role it needs, and the others still show.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import typer

from mailroom.core.durations import format_age
from mailroom.core.errors import describe_db_error
from mailroom.core.table import table
from mailroom.db import sqlapi as db
from mailroom.db.connect import connect
from mailroom.db.contract import SqlFunction
from mailroom.inboxes import sqlapi as inboxes
from mailroom.outbound import sqlapi as outbound

STOPPED_SHOWN = 5  # stopped workers listed (the most recent); the rest are counted


def _rows(conn: psycopg.Connection, fn: SqlFunction) -> list[dict[str, Any]] | str:
    """The rows of one call as dicts, or the one-line reason it could not be read."""
    try:
        return [r._asdict() for r in fn.rows(conn)]
    except psycopg.Error as exc:
        return describe_db_error(exc)


def _section(title: str, rows: list[dict[str, Any]] | str, show: Callable[[list[dict[str, Any]]], None]) -> None:
    if isinstance(rows, str):
        typer.echo(f"{title:<12}unavailable: {rows}")
        return
    show(rows)


def show(url: str) -> None:
    """Print the screen (see the module docstring)."""
    with connect(url, application_name="mailroom-status") as conn:
        now = db.clock.value(conn)
        typer.echo(f"mailroom status of {conn.info.dbname} as {conn.info.user}, {now:%Y-%m-%d %H:%M:%S}Z")
        health = _rows(conn, db.queue_health)
        by_queue = {r["queue"]: r for r in health} if isinstance(health, list) else {}

        def out(rows: list[dict[str, Any]]) -> None:
            s = rows[0]
            typer.echo(
                f"{'outbound':<12}queued {s['queued']} (due now {s['due_now']}, held back by limits {s['held_back']}, "
                f"deferred {s['retries_waiting']}, scheduled {s['scheduled']}), held {s['held']}, "
                f"processing {s['processing']}, failed {s['failed']}, cancelled {s['cancelled']}; "
                f"oldest queued {format_age(s['oldest_queued_age_seconds']) if s['queued'] else '-'}"
            )
            expired = by_queue.get("outbound", {}).get("expired_leases")
            if expired:
                typer.echo(f"{'':<12}{expired} claim(s) past their lease: a sender died (its reaper takes them back)")

        _section("outbound", _rows(conn, outbound.outbound_stats), out)
        if isinstance(health, str):
            typer.echo(f"{'tokens':<12}unavailable: {health}")
        else:
            t = by_queue.get("tokens", {})
            typer.echo(f"{'tokens':<12}waiting for the collector {t.get('due', 0)}"
                       + (f", the oldest for {format_age(t['oldest_due_age_seconds'])}" if t.get("due") else ""))

        def boxes(rows: list[dict[str, Any]]) -> None:
            b = rows[0]
            due = by_queue.get("inbox_expiry", {})
            typer.echo(
                f"{'inboxes':<12}open {b['open']}, past expiry not yet swept {b['expired_unswept']}"
                + (f" (for {format_age(due.get('oldest_due_age_seconds'))})" if b["expired_unswept"] else "")
                + f", closed awaiting purge {b['closed_unpurged']} (deleted {b['deleted']}), messages {b['messages']}"
                + (f"; next expiry in {format_age(b['next_expiry_seconds'])}" if b["next_expiry_seconds"] is not None
                   else "")
            )

        _section("inboxes", _rows(conn, inboxes.inbox_stats), boxes)
        _workers(_rows(conn, db.worker_health))

        def parts(rows: list[dict[str, Any]]) -> None:
            text = ", ".join(f"{r['table_name']} {r['partitions']} (ahead {format_age(r['ahead_seconds'])})"
                             for r in rows)
            default = [r["table_name"] for r in rows if r["default_rows_estimate"]]
            typer.echo(f"{'partitions':<12}{text}; "
                       + (f"rows in the DEFAULT partition of {', '.join(default)}: run `mailroom maintain`"
                          if default else "DEFAULT partitions empty"))

        _section("partitions", _rows(conn, db.partition_status), parts)

        def jobs(rows: list[dict[str, Any]]) -> None:
            run = next((r for r in rows if r["job"] == "maintain_partitions"), None)
            if run is None:
                typer.echo(f"{'maintenance':<12}never run: `mailroom maintain --every 10m` (mailroom run starts it), "
                           "or pg_cron (docs/retention.md)")
                return
            typer.echo(f"{'maintenance':<12}last run {format_age(run['age_seconds'])} ago: {run['last_summary']} "
                       f"({run['runs']} runs)")

        _section("maintenance", _rows(conn, db.job_runs), jobs)


def _workers(rows: list[dict[str, Any]] | str) -> None:
    if isinstance(rows, str):
        typer.echo(f"{'workers':<12}unavailable: {rows}")
        return
    counts = {state: sum(1 for r in rows if r["state"] == state) for state in ("running", "lost", "stopped")}
    typer.echo(f"{'workers':<12}{counts['running']} running, {counts['lost']} lost (no heartbeat), "
               f"{counts['stopped']} stopped recently")
    shown = [r for r in rows if r["state"] != "stopped"]
    stopped = [r for r in rows if r["state"] == "stopped"]
    stopped.sort(key=lambda r: r["heartbeat_age_seconds"] or 0)
    shown += stopped[:STOPPED_SHOWN]
    if not shown:
        typer.echo(f"{'':<12}none reported in: start them with `mailroom run` (or each command)")
        return
    table([{
        "kind": r["kind"], "worker": r["worker"], "state": r["state"],
        "heartbeat": f"{format_age(r['heartbeat_age_seconds'])} ago",
        "listening": ("yes" if r["listening"] else "no") if r["state"] == "running" else "-",
        "claimed": str(r["claimed"]), "serves": r["serves"] or "-", "metrics": r["metrics_address"] or "-",
    } for r in shown], ["kind", "worker", "state", "heartbeat", "listening", "claimed", "serves", "metrics"],
        indent="  ")
