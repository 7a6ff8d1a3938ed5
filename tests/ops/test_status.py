"""`mailroom status` (issue 23, item 2): the installation on one screen, as the monitor's login; what a
login may not read is said in one line naming the role."""

from __future__ import annotations

from mailroom import testing


def _beat(conn, worker: str, kind: str, at: object = None, claimed: int = 0) -> None:
    with conn.transaction():
        if at is not None:
            conn.execute("SELECT mailroom.pin_clock(%s, true)", (at,))
        conn.execute("SELECT mailroom.worker_heartbeat(%s, %s, true, %s, '127.0.0.1:9100', NULL)",
                     (worker, kind, claimed))


def test_status_shows_queues_workers_inboxes_partitions_maintenance(cli, conn):
    conn.execute("SELECT mailroom.upsert_sender('st', 'robot@mailroom.test', '127.0.0.1', 2525)")
    conn.execute("SELECT mailroom.enqueue_message('st', ARRAY['a@example.com'], 's', 't')")
    conn.execute("SELECT * FROM mailroom.create_mailbox(30, 'free')")
    conn.execute("SELECT * FROM mailroom.maintain_partitions()")
    _beat(conn, "host-a:1", "sender", claimed=7)
    five_minutes_ago = conn.execute("SELECT now() - interval '5 minutes'").fetchone()[0]
    _beat(conn, "host-b:2", "collector", at=five_minutes_ago)  # silent since: lost
    _beat(conn, "host-c:3", "expiry")
    conn.execute("SELECT mailroom.worker_stopped('host-c:3')")
    result = cli("status")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "outbound    queued 1 (due now 1, held back by limits 0, deferred 0, scheduled 0), held 0" in out
    assert "inboxes     open 1, " in out
    assert "workers     1 running, 1 lost (no heartbeat), 1 stopped recently" in out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith("  ") and ":" in line}
    assert rows["host-a:1"][:3] == ["sender", "host-a:1", "running"] and "7" in rows["host-a:1"]
    assert rows["host-b:2"][2] == "lost" and rows["host-c:3"][2] == "stopped"
    assert "partitions  " in out and "DEFAULT partitions empty" in out
    assert "maintenance last run " in out


def test_status_as_a_login_that_may_not_read_it_names_the_role(cli, db_url):
    result = cli("status", "--database-url", testing.as_login(db_url, "mr_app"))
    assert result.returncode == 0, result.stderr
    assert ("outbound    unavailable: permission denied for function outbound_stats (SQLSTATE 42501); "
            "mailroom.outbound_stats needs the group role mailroom_monitor or mailroom_sender: GRANT mailroom_monitor "
            "TO mr_app") in result.stdout, result.stdout
    assert ("workers     unavailable: permission denied for function worker_health (SQLSTATE 42501); "
            "mailroom.worker_health needs the group role mailroom_monitor or mailroom_admin: GRANT mailroom_monitor "
            "TO mr_app") in result.stdout, result.stdout


def test_a_refused_call_names_the_group_role(cli, db_url):
    result = cli("settings", "set", "outbound.max_attempts", "12", "--database-url", testing.as_login(db_url, "mr_monitor"))
    assert result.returncode == 1
    assert result.stderr == ("mailroom: error: permission denied for function set_setting (SQLSTATE 42501); "
                             "mailroom.set_setting needs the group role mailroom_admin: GRANT mailroom_admin TO "
                             "mr_monitor\n")
    listed = cli("settings", "list")  # as the monitor: every role that may read a setting may list them
    assert listed.returncode == 0 and "outbound.max_attempts" in listed.stdout
    assert cli("settings", "set", "outbound.max_attempts", "12").returncode == 0  # as the admin
    assert cli("settings", "get", "outbound.max_attempts").stdout.strip() == "12"
