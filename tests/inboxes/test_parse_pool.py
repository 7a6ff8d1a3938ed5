"""The inbox server's parsing processes (mailroom.inboxes.parsing): large messages and bounces are
parsed in another process, the event loop keeps running meanwhile, a parse over its time limit
ends with the worker replaced and the message unparsed, and a small message stays inline."""

from __future__ import annotations

import asyncio
import os
import time

from mailroom.inboxes.parsing import ParsePool

HEAD = b"From: MAILER-DAEMON@relay.example.net\r\nSubject: Undelivered\r\nContent-Type: text/plain\r\n\r\n"


def _dsn(n: int) -> bytes:
    return HEAD + b"<gone@example.com>: host mx said: 550 5.1.1 unknown\r\n" + b"\r\n" * n


def test_parses_in_other_processes_while_the_loop_runs():
    async def main():
        pool = ParsePool(workers=2, timeout=30)
        await pool.start()
        try:
            ticks = 0
            stop = asyncio.Event()

            async def tick():
                nonlocal ticks
                while not stop.is_set():
                    ticks += 1
                    await asyncio.sleep(0.01)

            ticker = asyncio.ensure_future(tick())
            big = b"From: a@x.test\r\nSubject: big\r\n\r\n" + b"x" * 64 + b"\r\n" + b"y" * (8 * 1024 * 1024)
            started = time.monotonic()
            parsed, reports = await asyncio.gather(pool.message(big), pool.bounce(_dsn(2_000_000)))
            elapsed = time.monotonic() - started
            stop.set()
            await ticker
            pids = {w.process.pid for w in pool._all}
            return parsed, reports, ticks, elapsed, pids
        finally:
            await pool.close()

    parsed, reports, ticks, elapsed, pids = asyncio.run(main())
    assert parsed.subject == "big" and parsed.text_body.startswith("x" * 64)
    assert [r["recipient"] for r in reports] == ["gone@example.com"]
    assert os.getpid() not in pids
    # the loop ran every 10 ms or so meanwhile (generous: half the ticks of an idle loop)
    assert ticks >= elapsed / 0.01 / 2, (ticks, elapsed)


def test_a_parse_over_its_time_limit_is_unparsed_and_the_worker_replaced():
    async def main():
        pool = ParsePool(workers=1, timeout=0.001)
        await pool.start()
        try:
            first = pool._all[0].process.pid
            big = b"Subject: slow\r\n\r\n" + b"z" * (16 * 1024 * 1024)
            parsed = await pool.message(big)
            second = pool._all[0].process.pid
            pool.timeout = 30
            again = await pool.message(b"Subject: fine\r\n\r\n" + b"w" * (32 * 1024))
            return parsed, first, second, again
        finally:
            await pool.close()

    parsed, first, second, again = asyncio.run(main())
    assert parsed.subject is None and parsed.defects == 1, "kept unparsed (the raw bytes are stored)"
    assert first != second, "the stuck worker was killed and replaced"
    assert again.subject == "fine", "the pool works after a replacement"


def test_small_messages_stay_inline_and_bounces_are_cut():
    async def main():
        pool = ParsePool(workers=1)
        small = await pool.message(b"Subject: hi\r\n\r\nbody")  # no start(): inline needs no worker
        cut = await pool.bounce(b"X" * 10)
        return small, cut

    small, cut = asyncio.run(main())
    assert small.subject == "hi"
    assert cut == []


def test_an_attachment_of_a_large_stored_message_is_found_in_a_worker():
    """What the HTTP server's attachment download asks (mime.find_part, by the recorded sha256)."""
    from email.message import EmailMessage

    msg = EmailMessage()
    msg["Subject"] = "with a file"
    msg.set_content("see attached")
    payload = bytes(range(256)) * 400  # 100 KiB: past the inline limit once encoded
    msg.add_attachment(payload, maintype="application", subtype="octet-stream", filename="f.bin")
    raw = msg.as_bytes()

    async def main():
        pool = ParsePool(workers=1)  # started on first use
        try:
            parsed = await pool.message(raw)
            found = await pool.part(raw, parsed.attachments[0]["sha256"])
            missing = await pool.part(raw, "0" * 64)
            return parsed, found, missing, len(pool._all)
        finally:
            await pool.close()

    parsed, found, missing, workers = asyncio.run(main())
    assert parsed.attachments[0]["filename"] == "f.bin" and found == payload and missing is None
    assert workers == 1


def test_the_inline_images_of_a_stored_message_are_found_in_one_walk():
    """What the HTTP server's frame asks (mime.find_parts, by the sha256s SQL chose): inline and in a worker."""
    from email.message import EmailMessage

    msg = EmailMessage()
    msg["Subject"] = "newsletter"
    msg.set_content("text")
    msg.add_alternative("<img src='cid:a@x'><img src='cid:b@x'>", subtype="html")
    html = msg.get_payload()[1]
    small, large = b"\x89PNG small", bytes(range(256)) * 400  # the large one: past the inline limit once encoded
    html.add_related(small, "image", "png", cid="<a@x>")
    html.add_related(large, "image", "png", cid="<b@x>")
    raw = msg.as_bytes()

    async def main():
        pool = ParsePool(workers=1)
        try:
            parsed = await pool.message(raw)
            shas = frozenset(a["sha256"] for a in parsed.attachments)
            return parsed, await pool.parts(raw, shas | {"0" * 64}), await pool.parts(raw, frozenset())
        finally:
            await pool.close()

    parsed, found, none = asyncio.run(main())
    by_cid = {a["content_id"]: a["sha256"] for a in parsed.attachments}
    assert found == {by_cid["a@x"]: small, by_cid["b@x"]: large} and none == {}


def _children() -> set[int]:
    """This process's live child processes (from /proc/*/stat)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                found.add(int(entry))
    return found


def test_a_lazy_pool_starts_no_process_until_a_large_message():
    """The inbox server's pool (issue 46, item 5): start() starts nothing (an idle server holds no parsing
    interpreter); the first message over the inline limit starts the workers, and is parsed by them."""
    before = _children()

    async def main():
        pool = ParsePool(workers=2, lazy=True)
        try:
            await pool.start()
            small = await pool.message(b"From: a@x.test\r\nSubject: small\r\n\r\nhi\r\n")
            idle = _children() - before
            big = await pool.message(b"From: a@x.test\r\nSubject: big\r\n\r\n" + b"y" * (64 * 1024))
            return small, idle, big, len(pool._all), _children() - before
        finally:
            await pool.close()

    small, idle, big, workers, busy = asyncio.run(main())
    assert small.subject == "small" and idle == set()
    assert big.subject == "big" and workers == 2 and len(busy) >= 2
