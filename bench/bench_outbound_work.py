"""Outbound doing what real senders do, against Postfix doing the same (issue 37, item 2).

Area `outbound`, rows `real senders: ...`, next to the drain rows of bench/bench_outbound.py and by
its conventions: mailroom's side is the *default* drain (a burst enqueued through enqueue_message in
one transaction a moment before, not timed; no VACUUM/ANALYZE; `mailroom send --until-idle` with its
defaults, MAILROOM_SEND_* cleared), timed from process start, 1 and 4 senders; rounds interleaved
with Postfix's, medians, the ratio to Postfix's median of the same run, the fdatasync rate in the notes.

1. DKIM. One 2,048-bit RSA key per run (mailroom.outbound.dkim.generate_key), selector `bench`,
   domain mailroom.test (the From domain of both sides): its public half in mailroom.dkim_keys
   (set_dkim_key), its private half in a MAILROOM_DKIM_KEY_FILE for `mailroom send`, and the same PEM
   as the KeyFile of a private opendkim (bench/opendkim_peer.py) that is Postfix's milter. Postfix
   signs in smtpd, when a message comes in (a message requeued or released from hold is never given
   to a milter again: postsuper(1)), so a held-then-released drain would not time its signing; its
   row is the whole pipeline instead: smtp-source (4 sessions, kept open) -> smtpd + opendkim ->
   queue -> smtp(8) -> smtp-sink, timed from smtp-source's start until the queue is empty and every
   delivery is logged. The same pipeline without the milter, in the same rounds, shows what signing
   costs Postfix. Mailroom's row times the drain alone (its enqueue is the application's
   transaction), so its ratio is conservative in Postfix's favour only in that Postfix also received
   the mail over SMTP in its time.
2. VERP, 5 recipients a message. Postfix: sendmail(1) -XV (per-recipient return paths
   bench+rcpt=domain@mailroom.test; smtp-source has no VERP) into a private instance that holds in
   cleanup (header_checks HOLD; not timed), then postsuper -H ALL + postqueue -f, timed until the queue
   is empty and 5 deliveries a message are logged (its qmgr gives each recipient its own
   transaction). Mailroom: the sender `bench` with a bounce domain, 5 `to` recipients a message,
   each its own transaction with its own signed return path (sql/36_outbound_bounces.sql).

Before any timing, each side sends samples to a capturing aiosmtpd sink in this process, and the
run stops unless: both sides' samples carry a DKIM-Signature with d=mailroom.test, s=bench,
a=rsa-sha256 that verifies (dkimpy, against the run's public key); and each side's VERP sample came
as 5 transactions of one recipient each, with 5 distinct return paths of the expected form.

Sizes (full run): 4,000 messages a DKIM row, 2,500 x 5 recipients a VERP row, 3 rounds (`bench.run
--rounds N`); quick: 1,000 and 500, 1 round. Alone: `python -m bench.bench_outbound_work [MESSAGES
[ROUNDS]]` (default 1,000 and 2, both kinds of row).
"""

from __future__ import annotations

import concurrent.futures
import email.utils
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
from aiosmtpd.controller import Controller

from bench import knobs, opendkim_peer, postfix_peer, smtp_tools
from mailroom.outbound import dkim as mdkim
from mailroom.outbound import sqlapi as outbound

AREA = "outbound"
ROOT = Path(__file__).resolve().parents[1]
DOMAIN = "mailroom.test"
SELECTOR = "bench"
SENDER = f"bench@{DOMAIN}"
BOUNCE_DOMAIN = f"bounces.{DOMAIN}"
RECIPIENTS = 5
TEXT_2KB = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod.\n" * 24


def _row(benchmark: str, value: float, unit: str, note: str = "") -> dict:
    return {"area": AREA, "benchmark": f"real senders: {benchmark}", "value": value, "unit": unit, "note": note}


def _fdatasync_note() -> str:
    rate = os.environ.get("MAILROOM_BENCH_FDATASYNC")
    return f"; fdatasync {int(rate):,}/s (pg_test_fsync, same run)" if rate and rate.isdigit() else ""


class CaptureSink:
    """An aiosmtpd sink in this process that keeps every transaction (MAIL FROM, RCPTs, bytes): samples only."""

    def __init__(self) -> None:
        self.transactions: list[tuple[str, list[str], bytes]] = []
        self.lock = threading.Lock()
        self.port = smtp_tools.free_port()
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port)
        self.controller.start()

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd hook name
        with self.lock:
            self.transactions.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.original_content or b""))
        return "250 2.0.0 Ok"

    def take(self, n: int, timeout: float = 60) -> list[tuple[str, list[str], bytes]]:
        deadline = time.monotonic() + timeout
        while len(self.transactions) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the capture sink got {len(self.transactions)} of {n} transactions")
            time.sleep(0.05)
        time.sleep(0.3)  # nothing more should come
        with self.lock:
            got, self.transactions = self.transactions, []
        if len(got) != n:
            raise RuntimeError(f"the capture sink got {len(got)} transactions, {n} expected")
        return got

    def close(self) -> None:
        self.controller.stop()


def _send_env(url: str, key_file: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_SEND_")}
    env |= {"MAILROOM_DATABASE_URL": url, "PYTHONPATH": str(ROOT / "driver")}
    env.pop(mdkim.KEY_FILE_ENV, None)
    if key_file is not None:
        env[mdkim.KEY_FILE_ENV] = str(key_file)
    return env


def _recipients(g: int) -> list[str]:
    return [f"rcpt{g}-{k}@example.com" for k in range(1, RECIPIENTS + 1)]


def drain(conn: psycopg.Connection, url: str, processes: int, total: int, port: int, recipients: int,
          key_file: Path | None) -> float:
    """The default drain (module docstring): msgs/s of `processes` `mailroom send --until-idle` from their start."""
    outbound.upsert_sender.call(conn, name="bench", from_address=SENDER, host="127.0.0.1", port=port)
    conn.execute("TRUNCATE mailroom.outbound_messages")
    with conn.transaction():
        for g in range(total):
            to = _recipients(g)[:recipients] if recipients > 1 else [f"rcpt{g}@example.com"]
            outbound.enqueue_message.call(conn, sender="bench", to=to, subject=f"bench {g}", text_body=TEXT_2KB)
    argv = [sys.executable, "-m", "mailroom", "send", "--until-idle"]
    env = _send_env(url, key_file)
    started = time.perf_counter()
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for _ in range(processes)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"mailroom send failed: {err.decode()[-300:]}")
    elapsed = time.perf_counter() - started
    sent = conn.execute("SELECT count(*) FROM mailroom.outbound_messages WHERE status = 'sent'").fetchone()[0]
    if sent != total:
        raise RuntimeError(f"{sent} of {total} sent")
    return total / elapsed


def _check_signed(who: str, message: bytes, public_key: str) -> None:
    tags = opendkim_peer.signature_tags(message)
    if tags is None:
        raise RuntimeError(f"{who}: the sample message has no DKIM-Signature")
    want = {"d": DOMAIN, "s": SELECTOR, "a": "rsa-sha256"}
    if any(tags.get(k) != v for k, v in want.items()):
        raise RuntimeError(f"{who}: DKIM-Signature tags {tags.get('d')}/{tags.get('s')}/{tags.get('a')}, "
                           f"expected {DOMAIN}/{SELECTOR}/rsa-sha256")
    if not opendkim_peer.verify(message, public_key):
        raise RuntimeError(f"{who}: the sample's DKIM-Signature does not verify against the run's key")


def _check_verp(who: str, got: list[tuple[str, list[str], bytes]], pattern: str) -> None:
    paths = [mail_from for mail_from, _, _ in got]
    if any(len(rcpts) != 1 for _, rcpts, _ in got) or len(set(paths)) != RECIPIENTS:
        raise RuntimeError(f"{who}: VERP sample not {RECIPIENTS} one-recipient transactions with distinct return paths")
    bad = [p for p in paths if not re.fullmatch(pattern, p)]
    if bad:
        raise RuntimeError(f"{who}: return path {bad[0]!r} is not of the form {pattern}")


def _verp_message(g: int) -> bytes:
    head = (f"From: <{SENDER}>\r\nTo: {', '.join(_recipients(g))}\r\nSubject: bench {g}\r\n"
            f"Date: {email.utils.formatdate()}\r\nMessage-ID: <bench{g}.{time.time_ns()}@{DOMAIN}>\r\n"
            "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n")
    return (head + TEXT_2KB.replace("\n", "\r\n")).encode()


def _inject_verp(peer: postfix_peer.PostfixPeer, total: int) -> None:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda g: peer.sendmail(SENDER, _recipients(g), _verp_message(g), verp=True), range(total)))


def verify_samples(conn: psycopg.Connection, url: str, key_file: Path, public_key: str, milter: str,
                   progress: Callable[[str], None]) -> None:
    """The checks of the module docstring, on samples sent to a capturing sink (raise on any failure)."""
    capture = CaptureSink()
    peer = None
    try:
        progress("real senders: checking that Postfix + opendkim signs (a sample to a capturing sink)")
        peer = postfix_peer.PostfixPeer("outbound", relay_port=capture.port, hold="none", milter=milter)
        smtp_tools.smtp_source(peer.port, 1, 1, 2000, SENDER, "rcpt@example.com")
        (sample,) = capture.take(1)
        _check_signed("Postfix + opendkim", sample[2], public_key)
        progress("real senders: checking Postfix's sendmail -XV (5 recipients, one sample)")
        peer.close()
        peer = postfix_peer.PostfixPeer("outbound", relay_port=capture.port, hold="header")
        peer.sendmail(SENDER, _recipients(0), _verp_message(0), verp=True)
        peer.wait_held(1)
        peer.release_and_drain(RECIPIENTS)
        _check_verp("Postfix -XV", capture.take(RECIPIENTS), r"bench\+rcpt0-[1-5]=example\.com@mailroom\.test")
        peer.close()
        peer = None
        progress("real senders: checking that mailroom send signs, and its VERP (samples to the capturing sink)")
        drain(conn, url, 1, 1, capture.port, 1, key_file)
        (sample,) = capture.take(1)
        _check_signed("mailroom send", sample[2], public_key)
        outbound.delete_dkim_key.call(conn, domain=DOMAIN)
        outbound.set_sender_bounce_domain.call(conn, sender="bench", domain=BOUNCE_DOMAIN)
        drain(conn, url, 1, 1, capture.port, RECIPIENTS, None)
        _check_verp("mailroom VERP", capture.take(RECIPIENTS), r"bounce\+\d+-[1-5]-[0-9a-f]{16}@bounces\.mailroom\.test")
    finally:
        if peer is not None:
            peer.close()
        capture.close()
        outbound.set_sender_bounce_domain.call(conn, sender="bench", domain=None)


# messages a round (full run): each side of a DKIM row runs >= ~10 s on the quiet 2-core VM (Postfix +
# opendkim ~150-250 msg/s, mailroom signed ~350-500); VERP 2,500 x 5 recipients (the release ~15 s,
# its untimed sendmail -XV injection ~40 s a round: 10,000 took 2.5 min a round, not timed)
DKIM_MESSAGES = 4000
VERP_MESSAGES = 2500


def run(conn: psycopg.Connection, url: str, quick: bool, progress: Callable[[str], None],
        total: int | None = None, reps: int | None = None) -> list[dict]:
    names = ("Postfix + opendkim milter: smtp-source -> smtpd -> smtp(8) -> smtp-sink, signing",
             "Postfix without milter: smtp-source -> smtpd -> smtp(8) -> smtp-sink (same pipeline, unsigned)",
             "mailroom send, DKIM-signed (default drain), 1 sender -> smtp-sink",
             "mailroom send, DKIM-signed (default drain), 4 senders -> smtp-sink",
             f"Postfix sendmail -XV, {RECIPIENTS} recipients a message, hold released -> smtp-sink",
             f"mailroom send, VERP, {RECIPIENTS} recipients a message (default drain), 1 sender -> smtp-sink",
             f"mailroom send, VERP, {RECIPIENTS} recipients a message (default drain), 4 senders -> smtp-sink")
    if not (postfix_peer.available() and opendkim_peer.available()):
        why = postfix_peer.SKIPPED if not postfix_peer.available() else opendkim_peer.SKIPPED
        progress(f"real senders: {why}")
        return [_row(n, float("nan"), "", why) for n in names]
    dkim_total = total or (1000 if quick else DKIM_MESSAGES)
    verp_total = total or (500 if quick else VERP_MESSAGES)
    reps = reps or knobs.rounds(quick)
    rates: dict[str, list[float]] = {n: [] for n in names}
    home = Path(tempfile.mkdtemp(prefix="mailroom-bench-dkim-"))
    key_file = home / "dkim.pem"
    private = mdkim.generate_key(2048)
    mdkim.append_key(key_file, private)
    public = mdkim.public_record_key(private)
    outbound.upsert_sender.call(conn, name="bench", from_address=SENDER, host="127.0.0.1", port=25)
    signer = opendkim_peer.OpenDkim(DOMAIN, SELECTOR, private)
    sink = smtp_tools.SmtpSink()
    peers: list[postfix_peer.PostfixPeer] = []
    try:
        outbound.set_dkim_key.rows(conn, sender="bench", selector=SELECTOR, public_key=public)
        verify_samples(conn, url, key_file, public, signer.milter, progress)
        signing = postfix_peer.PostfixPeer("outbound", relay_port=sink.port, hold="none", milter=signer.milter)
        plain = postfix_peer.PostfixPeer("outbound", relay_port=sink.port, hold="none")
        verp = postfix_peer.PostfixPeer("outbound", relay_port=sink.port, hold="header")
        peers += [signing, plain, verp]
        for rep in range(reps):
            tag = f"real senders, round {rep + 1}/{reps}"
            for name, peer in ((names[0], signing), (names[1], plain)):
                elapsed = peer.pipeline(dkim_total, 4, 2000, SENDER, "rcpt@example.com")
                rates[name].append(dkim_total / elapsed)
                progress(f"{tag}: {name}: {dkim_total / elapsed:,.0f} msgs/s ({elapsed:.1f} s)")
            outbound.set_dkim_key.rows(conn, sender="bench", selector=SELECTOR, public_key=public)
            for name, procs in ((names[2], 1), (names[3], 4)):
                rate = drain(conn, url, procs, dkim_total, sink.port, 1, key_file)
                rates[name].append(rate)
                progress(f"{tag}: {name}: {rate:,.0f} msgs/s ({rate / rates[names[0]][-1]:.2f}x this round's Postfix)")
            outbound.delete_dkim_key.call(conn, domain=DOMAIN)
            progress(f"{tag}: injecting {verp_total} messages x {RECIPIENTS} recipients with sendmail -XV (not timed)")
            _inject_verp(verp, verp_total)
            verp.wait_held(verp_total)
            elapsed = verp.release_and_drain(verp_total * RECIPIENTS)
            rates[names[4]].append(verp_total / elapsed)
            progress(f"{tag}: {names[4]}: {verp_total / elapsed:,.0f} msgs/s ({elapsed:.1f} s)")
            outbound.set_sender_bounce_domain.call(conn, sender="bench", domain=BOUNCE_DOMAIN)
            try:
                for name, procs in ((names[5], 1), (names[6], 4)):
                    rate = drain(conn, url, procs, verp_total, sink.port, RECIPIENTS, None)
                    rates[name].append(rate)
                    progress(f"{tag}: {name}: {rate:,.0f} msgs/s ({rate / rates[names[4]][-1]:.2f}x this round's "
                             "Postfix)")
            finally:
                outbound.set_sender_bounce_domain.call(conn, sender="bench", domain=None)
    finally:
        for peer in peers:
            peer.close()
        sink.close()
        signer.close()
        conn.execute("TRUNCATE mailroom.outbound_messages")
        conn.execute("DELETE FROM mailroom.dkim_keys WHERE domain = %s", (DOMAIN,))
        key_file.unlink(missing_ok=True)
        home.rmdir()
    med = {n: statistics.median(rates[n]) for n in names}
    runs = {n: ", ".join(f"{r:,.0f}" for r in rates[n]) for n in names}
    fsync = _fdatasync_note()
    rows = [
        _row(names[0], med[names[0]], "msgs/s",
             f"reference: median of {reps} runs ({runs[names[0]]}); {dkim_total} msgs of ~2 KB (smtp-source -s 4 -d "
             "-l 2000) signed in smtpd by opendkim on a unix socket (2,048-bit RSA, relaxed/relaxed, "
             "d=mailroom.test s=bench), timed from "
             f"smtp-source's start until the queue is empty and every delivery logged; {med[names[0]] / med[names[1]]:.2f}x "
             f"its own unsigned pipeline{fsync}"),
        _row(names[1], med[names[1]], "msgs/s",
             f"median of {reps} runs ({runs[names[1]]}); the same instance settings without smtpd_milters, interleaved"
             f"{fsync}"),
    ]
    for name in names[2:4]:
        rows.append(_row(name, med[name], "msgs/s",
                         f"{med[name] / med[names[0]]:.2f}x Postfix + opendkim ({med[names[0]]:,.0f} msgs/s, same run, "
                         f"interleaved); median of {reps} runs ({runs[name]}); {dkim_total} msgs of ~2 KB enqueued by "
                         "enqueue_message just before (not timed), each signed by the sender (dkimpy, the same key, "
                         f"selector and domain), `mailroom send --until-idle` defaults, timed from process start{fsync}"))
    rows.append(_row(names[4], med[names[4]], "msgs/s",
                     f"reference: median of {reps} runs ({runs[names[4]]}); {verp_total} msgs of ~2 KB to {RECIPIENTS} "
                     f"recipients each ({verp_total * RECIPIENTS} deliveries, one transaction each, return paths "
                     "bench+rcpt=domain@mailroom.test) injected by sendmail -XV on hold (not timed), then postsuper -H "
                     f"ALL + postqueue -f until the queue is empty and every delivery logged{fsync}"))
    for name in names[5:]:
        rows.append(_row(name, med[name], "msgs/s",
                         f"{med[name] / med[names[4]]:.2f}x Postfix -XV ({med[names[4]]:,.0f} msgs/s, same run, "
                         f"interleaved); median of {reps} runs ({runs[name]}); {verp_total} msgs x {RECIPIENTS} recipients "
                         "enqueued by enqueue_message just before (not timed), one transaction and one signed return "
                         f"path a recipient, `mailroom send --until-idle` defaults, timed from process start{fsync}"))
    return rows


if __name__ == "__main__":  # alone: python -m bench.bench_outbound_work [MESSAGES [ROUNDS]]
    from bench.run import progress as say
    from bench.run import start_cluster
    from mailroom import testing as _testing

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    r = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    cluster = start_cluster()
    try:
        db = _testing.migrated_database(cluster, "bench_real_senders")
        with psycopg.connect(db, autocommit=True) as c:
            for row in run(c, db, True, say, n, r):
                say(f"{row['benchmark']}: {row['value']:,.1f} {row['unit']} ({row['note']})")
    finally:
        _testing.stop_cluster(cluster)
