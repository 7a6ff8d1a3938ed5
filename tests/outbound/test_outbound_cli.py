"""`mailroom outbound …`: status, list, show, retry, purge, reap, sender — and their errors."""

from __future__ import annotations

from outbound_support import KEY, KEY_HEX, add_sender, enqueue, row, sender_key, sender_key_env


def fail(conn, mid: int, reply: str = "550 5.1.1 <bob@example.com> unknown") -> None:
    claimed_id, token = conn.execute("SELECT id, claim_token FROM mailroom.claim_messages(1, 't')").fetchone()
    assert claimed_id == mid
    conn.execute(
        "SELECT mailroom.finalize_messages(ARRAY[%s::bigint], ARRAY[%s::bigint], ARRAY['reply'], ARRAY[550],"
        " ARRAY['5.1.1'], ARRAY[%s])",
        (mid, token, reply),
    )


def test_status_list_show(conn, cli):
    add_sender(conn, 2525)
    a, b = enqueue(conn, 2, to=["bob@example.com"], subject="Secret subject")
    fail(conn, a)
    result = cli("outbound", "status")
    assert result.returncode == 0, result.stderr
    lines = dict(line.rsplit(None, 1) for line in result.stdout.splitlines())
    assert lines["queued"] == "1" and lines["failed"] == "1" and lines["due now"] == "1"

    listed = cli("outbound", "list", "--status", "failed")
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[0].split()[:3] == ["ID", "SENDER", "STATUS"]
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [str(a)]

    shown = cli("outbound", "show", str(a))
    assert shown.returncode == 0
    assert "status" in shown.stdout and "failed" in shown.stdout and "<redacted:" in shown.stdout
    for output in (result.stdout, listed.stdout, shown.stdout):
        assert "@example.com" not in output and "Secret subject" not in output


def test_retry_one_and_all(conn, cli):
    add_sender(conn, 2525)
    a, b, c = enqueue(conn, 3)
    fail(conn, a)  # 550 to its only recipient: the address is suppressed now (a hard bounce)
    fail(conn, b)
    refused = cli("outbound", "retry", str(a))
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"mailroom: error: message {a}: to[1] is on the suppression list now (SQLSTATE MR318)")
    assert "@" not in refused.stderr  # the position, never the address
    assert row(conn, a)["status"] == "failed"
    result = cli("outbound", "retry", str(a), "--include-suppressed")
    assert result.returncode == 0 and result.stdout.strip() == f"1 message(s) queued again (ids {a})"
    assert "suppression list now and were queued anyway" in result.stderr
    assert (row(conn, a)["status"], row(conn, a)["attempts"]) == ("queued", 0)
    again = cli("outbound", "retry", str(a))
    assert again.returncode == 1
    assert again.stderr.strip() == (f"mailroom: error: message {a} is queued; retry applies to failed, cancelled, held "
                                    "messages (SQLSTATE MR341)")
    warned = cli("outbound", "retry", "--all-failed")
    assert warned.returncode == 0 and warned.stdout.strip() == "0 message(s) queued again"
    assert f"were not retried (ids {b}); --include-suppressed sends them anyway" in warned.stderr
    conn.execute("SELECT mailroom.unsuppress('rcpt1@example.com')")  # b's recipient, off the list again
    result = cli("outbound", "retry", "--all-failed")
    assert result.returncode == 0 and result.stdout.strip() == f"1 message(s) queued again (ids {b})"
    assert row(conn, b)["status"] == "queued"
    assert cli("outbound", "retry").returncode == 2
    assert cli("outbound", "retry", "5", "--all-failed").returncode == 2


def test_verbs_hold_release_cancel_delete_run_now(conn, cli):
    add_sender(conn, 2525)
    ids = enqueue(conn, 3, to=["x@hold.example"]) + enqueue(conn, 1, to=["y@other.example"])
    held = cli("outbound", "hold", "--domain", "HOLD.example")
    assert held.returncode == 0 and held.stdout.strip() == f"3 message(s) held (ids {', '.join(map(str, ids[:3]))})"
    assert [row(conn, i)["status"] for i in ids] == ["held", "held", "held", "queued"]
    queue = cli("outbound", "queue")
    assert queue.returncode == 0, queue.stderr
    assert "queued 1 (due now 1," in queue.stdout and "held 3" in queue.stdout
    assert any(line.split()[:7] == ["hold.example", "0", "0", "0", "0", "0", "3"] for line in queue.stdout.splitlines())
    released = cli("outbound", "release", str(ids[0]))
    assert released.returncode == 0 and row(conn, ids[0])["status"] == "queued"
    # a destructive verb on more than one message wants --yes; --dry-run says what it would do
    unconfirmed = cli("outbound", "cancel", "--all")
    assert unconfirmed.returncode == 2
    assert unconfirmed.stderr == "mailroom: error: this would cancel 4 messages: add --yes to do it (--dry-run lists them)\n"
    assert [row(conn, i)["status"] for i in ids] == ["queued", "held", "held", "queued"]
    dry = cli("outbound", "cancel", "--all", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.startswith("dry run: would leave 4 message(s) cancelled")
    one = cli("outbound", "cancel", str(ids[3]))  # one message needs no --yes
    assert one.returncode == 0 and row(conn, ids[3])["status"] == "cancelled"
    done = cli("outbound", "cancel", "--all", "--yes")
    assert done.returncode == 0 and done.stdout.startswith("3 message(s) cancelled")
    # run now: a message whose retry is to come becomes due
    (later,) = enqueue(conn, 1, to=["z@later.example"])
    conn.execute("UPDATE mailroom.outbound_messages SET next_retry_at = now() + interval '1 hour' WHERE id = %s",
                 (later,))
    assert cli("outbound", "run-now", "--domain", "later.example").stdout.strip() == f"1 message(s) made due now (ids {later})"
    assert row(conn, later)["next_retry_at"] <= conn.execute("SELECT now()").fetchone()[0]
    assert cli("outbound", "delete", "--domain", "hold.example").returncode == 2  # three: --yes wanted
    deleted = cli("outbound", "delete", "--domain", "hold.example", "--yes")
    assert deleted.returncode == 0 and deleted.stdout.startswith("3 message(s) deleted")
    assert conn.execute("SELECT count(*) FROM mailroom.outbound_messages WHERE rcpt_domain = 'hold.example'").fetchone()[0] == 0
    bad = cli("outbound", "hold", str(ids[3]), "--domain", "x.example")
    assert bad.returncode == 2 and "name the messages one way" in bad.stderr


def test_senders_lists_without_the_password(conn, cli):
    conn.execute("SELECT mailroom.set_sender_public_key(%s)", (sender_key()[0],))  # the password is sealed for it
    result = cli("outbound", "sender", "relay9", "--from", "robot@mailroom.test", "--host", "127.0.0.1", "--port", "2525",
                 "--security", "starttls", "--username", "u", env={"MAILROOM_SMTP_PASSWORD": "pw-secret"})
    assert result.returncode == 0, result.stderr
    listed = cli("outbound", "senders")
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.startswith("relay9 "))
    assert line.split()[1:8] == ["robot@mailroom.test", "127.0.0.1", "2525", "starttls", "u", "yes", "-"]
    assert "pw-secret" not in listed.stdout


def test_show_unknown_id(cli):
    result = cli("outbound", "show", "424242")
    assert result.returncode == 1
    assert result.stderr.strip() == "mailroom: error: no outbound message with id 424242 (SQLSTATE MR340)"


def test_purge_sent_before(conn, cli):
    add_sender(conn, 2525)
    ids = enqueue(conn, 5)
    conn.execute(
        "UPDATE mailroom.outbound_messages SET status = 'sent', sent_at = now() - interval '8 days' WHERE id = ANY(%s)",
        (ids[:3],),
    )
    conn.execute("UPDATE mailroom.outbound_messages SET status = 'sent', sent_at = now() WHERE id = %s", (ids[3],))
    unconfirmed = cli("outbound", "purge", "--sent-before", "7d", "--batch", "2")
    assert unconfirmed.returncode == 2 and "this would purge 3 messages: add --yes" in unconfirmed.stderr
    dry = cli("outbound", "purge", "--sent-before", "7d", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.startswith("dry run: would purge 3 sent message(s)")
    assert conn.execute("SELECT count(*) FROM mailroom.outbound_messages").fetchone()[0] == 5
    result = cli("outbound", "purge", "--sent-before", "7d", "--batch", "2", "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("purged 3 sent message(s)")
    assert result.stderr == ""  # no progress line when stderr is not a terminal
    left = {r[0] for r in conn.execute("SELECT id FROM mailroom.outbound_messages")}
    assert left == {ids[3], ids[4]}
    bad = cli("outbound", "purge", "--sent-before", "a week")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_reap_command(conn, cli):
    add_sender(conn, 2525)
    (mid,) = enqueue(conn, 1)
    conn.execute("SELECT * FROM mailroom.claim_messages(10, 'dead-worker', '1 second')")
    conn.execute("SELECT pg_sleep(0)")
    result = cli("outbound", "reap", env={"PGOPTIONS": "-c mailroom.clock=2099-01-01Z"})
    assert result.returncode == 0 and result.stdout.strip() == "reaped 1 message(s)"
    r = row(conn, mid)
    assert (r["status"], r["attempts"], r["possibly_sent"]) == ("queued", 1, True)
    assert cli("outbound", "reap", "--older-than", "-5").returncode == 2


def test_sender_command(conn, cli):
    from mailroom.outbound.sealing import Unsealer

    no_key = cli(
        "outbound", "sender", "relay2", "--from", "robot@mailroom.test", "--host", "relay.example.net", "--port", "587",
        "--security", "starttls", "--username", "u", env={"MAILROOM_SMTP_PASSWORD": "pw"},
    )
    assert no_key.returncode == 2 and "outbound sender-key init" in no_key.stderr
    conn.execute("SELECT mailroom.set_sender_public_key(%s)", (sender_key()[0],))
    result = cli(
        "outbound", "sender", "relay1", "--from", "robot@mailroom.test", "--host", "relay.example.net", "--port", "587",
        "--security", "starttls", "--username", "u", env={"MAILROOM_SMTP_PASSWORD": "pw-7d1f"},
    )
    assert result.returncode == 0, result.stderr
    sealed = conn.execute("SELECT smtp_password_sealed FROM mailroom.senders WHERE name = 'relay1'").fetchone()[0]
    assert sealed is not None and b"pw-7d1f" not in bytes(sealed)
    assert Unsealer([sender_key()[1].read_bytes()]).open(sealed) == "pw-7d1f"
    # a login over security none: refused (issue 21.8) unless opted in, for a relay on this machine only
    clear = cli("outbound", "sender", "relay3", "--from", "robot@mailroom.test", "--host", "relay.example.net",
                "--port", "25", "--username", "u", env={"MAILROOM_SMTP_PASSWORD": "pw"})
    assert clear.returncode == 2 and "MR319" in clear.stderr and "pw" not in clear.stderr.split("(SQLSTATE")[0][-5:]
    elsewhere = cli("outbound", "sender", "relay3", "--from", "robot@mailroom.test", "--host", "relay.example.net",
                    "--port", "25", "--username", "u", "--allow-cleartext-login")
    assert elsewhere.returncode == 2 and "only to a relay on this machine" in elsewhere.stderr
    local = cli("outbound", "sender", "relay3", "--from", "robot@mailroom.test", "--host", "127.0.0.1",
                "--port", "2525", "--username", "u", "--allow-cleartext-login", env={"MAILROOM_SMTP_PASSWORD": "pw"})
    assert local.returncode == 0, local.stderr
    bad = cli("outbound", "sender", "relay4", "--from", "not-an-address", "--host", "127.0.0.1", "--port", "25")
    assert bad.returncode == 2 and "MR303" in bad.stderr and "not-an-address" not in bad.stderr


def test_sender_key_init_writes_the_private_half_only_locally(conn, cli, tmp_path):
    out = tmp_path / "sender.key"
    result = cli("outbound", "sender-key", "init", "--out", str(out), "--bits", "2048", timeout=60)
    assert result.returncode == 0, result.stderr
    assert out.stat().st_mode & 0o777 == 0o600 and "PRIVATE KEY" in out.read_text()
    public, key_id = conn.execute("SELECT public_key, key_id FROM mailroom.sender_public_key()").fetchone()
    assert b"PRIVATE" not in bytes(public) and key_id
    again = cli("outbound", "sender-key", "init", "--out", str(out), "--bits", "2048", timeout=60)
    assert again.returncode == 1 and "never overwritten" in again.stderr


def test_convert_passwords_once_from_the_previous_release(conn, cli, smtp_server):
    """The one-time step: MAILROOM_ENCRYPTION_KEY re-encrypts the old ciphertexts to the sender key."""
    add_sender(conn, 2525, username="u", password="placeholder", security="starttls")
    conn.execute("UPDATE mailroom.senders SET smtp_password_sealed = NULL, smtp_password_encrypted ="
                 " pgp_sym_encrypt('old-pw', %s, 'cipher-algo=aes256, s2k-mode=1')", (KEY.hex(),))
    result = cli("outbound", "convert-passwords", env={"MAILROOM_ENCRYPTION_KEY": KEY_HEX})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("1 relay password(s) now sealed")
    enc, sealed = conn.execute("SELECT smtp_password_encrypted, smtp_password_sealed FROM mailroom.senders").fetchone()
    from mailroom.outbound.sealing import Unsealer

    assert enc is None and Unsealer([sender_key()[1].read_bytes()]).open(sealed) == "old-pw"
    wrong = cli("outbound", "convert-passwords", env={"MAILROOM_ENCRYPTION_KEY": "ff" * 32})
    assert wrong.returncode == 0 and wrong.stdout.startswith("0 relay")  # nothing left to convert
    assert sender_key_env()
