"""A full inbox over real SMTP (issue 44 item 4): the plan chooses (plans.when_full). The free plan's seed
lets the oldest message go, as Mailpit does: its 101st message is 250 and the oldest is gone, in the same
transaction as the new one is stored; a plan that refuses still answers 552 5.2.2 at RCPT."""

from __future__ import annotations

import smtplib

RAW = b"From: ann@example.com\r\nSubject: the newest\r\n\r\nhello\r\n"


def _fill(conn, address: str, n: int) -> None:
    conn.execute(
        "SELECT count(mailroom.deliver_message(%s, convert_to('Subject: m' || i || E'\\r\\n\\r\\nx', 'UTF8'),"
        " 'a@example.com', jsonb_build_object('subject', 'm' || i))) FROM generate_series(1, %s) AS i",
        (address, n),
    )


def _subjects(conn, mailbox_id: int) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT subject FROM mailroom.messages WHERE mailbox_id = %s ORDER BY id", (mailbox_id,))]


def test_a_full_free_inbox_lets_the_oldest_go_and_a_refusing_plan_answers_552(server, conn, make_mailbox):
    free = make_mailbox()  # the free plan as seeded: 100 messages, when_full drop_oldest
    _fill(conn, free.address, 100)
    conn.execute("UPDATE mailroom.plans SET max_messages = 3 WHERE name = 'pro'")  # pro as seeded: refuse
    pro = make_mailbox(plan="pro")
    _fill(conn, pro.address, 3)
    with smtplib.SMTP(server.host, server.port, timeout=30) as client:
        assert client.sendmail("ann@example.com", [free.address], RAW) == {}  # 250 (it raises otherwise)
        client.ehlo()
        client.mail("ann@example.com")
        code, text = client.rcpt(pro.address)
    assert (code, text[:5]) == (552, b"5.2.2")
    subjects = _subjects(conn, free.id)
    assert len(subjects) == 100
    assert subjects[0] == "m2" and subjects[-1] == "the newest"  # m1, the oldest, went
    assert conn.execute("SELECT message_count FROM mailroom.mailboxes WHERE id = %s", (free.id,)).fetchone()[0] == 100
    assert _subjects(conn, pro.id) == ["m1", "m2", "m3"]
