"""`mailroom inbox serve --workers N`: N processes on one port, and 250 still means stored.

The supervisor is SIGKILLed while concurrent aiosmtplib clients are sending (with several messages
per commit from the group commit path); its workers, each in a process group of its own, must stop
with it (the kernel sends them SIGTERM: mailroom.core.supervisor.die_with), and every message that
got a 250 must be in the database, exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from email.message import EmailMessage

import aiosmtplib
from inbox_support import wait_for_log

CLIENTS = 8
KILL_AFTER = 60  # messages answered 250 before the kill: the server is under load then


def _message(address: str, subject: str) -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = "load@example.org"
    msg["To"] = address
    msg["Subject"] = subject
    msg.set_content("x" * 1500)
    return msg


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()  # noqa: SIM115 - one read
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]  # noqa: SIM115 - one read
    except OSError:
        return False
    return state != "Z"


def test_sigkill_of_all_workers_mid_load_loses_no_250(cli_popen, conn, make_mailbox, tmp_path):
    boxes = [make_mailbox(plan="pro") for _ in range(3)]
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log_file:
        proc = cli_popen("inbox", "serve", "--host", "127.0.0.1", "--port", "0", "--workers", "2",
                         "--pool-size", "2", stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True)
    try:
        wait_for_log(log_path, r"with 2 worker processes", proc, timeout=30)
        port = int(wait_for_log(log_path, r"listening on 127\.0\.0\.1:(\d+)", proc).group(1))
        workers = _children(proc.pid)
        assert len(workers) == 2, workers
        accepted: list[str] = []
        failed: list[str] = []
        killed = asyncio.Event()

        async def client(n: int) -> None:
            smtp = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=10)
            try:
                await smtp.connect()
                for i in range(10_000):
                    box = boxes[(n + i) % len(boxes)]
                    subject = f"kill-test {n}-{i}"
                    try:
                        errors, reply = await smtp.send_message(_message(box.address, subject))
                    except (aiosmtplib.SMTPException, OSError):
                        failed.append(subject)
                        return
                    assert errors == {} and reply.startswith("2.0.0 OK: stored"), reply
                    accepted.append(subject)
                    if len(accepted) >= KILL_AFTER and not killed.is_set():
                        killed.set()
                        os.killpg(proc.pid, signal.SIGKILL)  # the supervisor: its workers must follow
            finally:
                with contextlib.suppress(Exception):
                    smtp.close()

        async def main() -> None:
            await asyncio.wait_for(asyncio.gather(*(client(n) for n in range(CLIENTS))), timeout=120)

        asyncio.run(main())
        assert killed.is_set() and proc.wait(timeout=10) == -signal.SIGKILL
        # each worker is in a process group of its own: it must not outlive its supervisor's SIGKILL
        # (it would serve on alone, on a port the next server shares)
        deadline = time.monotonic() + 10
        while (left := [pid for pid in workers if _alive(pid)]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"workers {left} outlived their supervisor"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert len(accepted) >= KILL_AFTER
    assert failed, "the kill did not interrupt any client"
    rows = conn.execute(
        "SELECT subject, count(*) FROM mailroom.messages WHERE mailbox_id = ANY(%s) GROUP BY subject",
        ([b.id for b in boxes],),
    ).fetchall()
    stored = dict(rows)
    missing = [s for s in accepted if s not in stored]
    assert not missing, f"{len(missing)} of {len(accepted)} messages answered 250 are not stored: {missing[:5]}"
    assert all(count == 1 for count in stored.values())
    # a message stored without its 250 (killed between COMMIT and the reply) is allowed: the
    # client retries it; a 250 without a row is not
    assert set(stored) <= set(accepted) | set(failed)


def test_group_commit_with_a_filling_inbox_stores_exactly_its_limit(start_server, conn, make_mailbox):
    """One pooled connection: messages of concurrent sessions are stored in shared statements. A free
    inbox (100 messages) fills up mid-group: the group is refused as a whole, its messages go one by
    one, and every 250 is a stored row, the free inbox never holds more than its limit."""
    # a plan that refuses when full (the free plan's seed lets its oldest go since issue 44: pinned here)
    conn.execute("UPDATE mailroom.plans SET when_full = 'refuse' WHERE name = 'free'")
    server = start_server("--pool-size", "1", "--log-messages")  # the group commit's own line
    free, pro = make_mailbox(plan="free"), make_mailbox(plan="pro")
    accepted: list[str] = []
    refused: list[int] = []

    async def client(n: int) -> None:
        smtp = aiosmtplib.SMTP(hostname=server.host, port=server.port, timeout=30)
        await smtp.connect()
        try:
            for i in range(30):
                box = free if i % 2 == 0 else pro
                subject = f"group {n}-{i}"
                try:
                    errors, reply = await smtp.send_message(_message(box.address, subject))
                except aiosmtplib.SMTPRecipientsRefused as exc:  # full, seen at RCPT
                    codes = [r.code for r in exc.recipients]
                    assert codes == [552] and box is free, codes
                    refused.append(552)
                    await smtp.rset()
                    continue
                except aiosmtplib.SMTPResponseException as exc:  # full, found at DATA
                    assert exc.code == 552 and box is free, (exc.code, exc.message)
                    refused.append(exc.code)
                    await smtp.rset()
                    continue
                assert errors == {} and reply.startswith("2.0.0 OK: stored"), reply
                accepted.append(subject)
        finally:
            await smtp.quit()

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(client(n) for n in range(8))), timeout=120)

    asyncio.run(main())
    rows = dict(conn.execute(
        "SELECT subject, count(*) FROM mailroom.messages WHERE mailbox_id = ANY(%s) GROUP BY subject",
        ([free.id, pro.id],),
    ).fetchall())
    assert sorted(rows) == sorted(accepted) and set(rows.values()) == {1}  # every 250 stored, once
    assert conn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id = %s", (free.id,)).fetchone()[0] == 100
    assert len(refused) == 8 * 15 - 100
    assert "group commit:" in server.log()
