"""DKIM signing end to end (issue 27, item 1): `mailroom outbound dkim keygen` makes the key (the
private half in a file, the selector and public half in the database) and prints the TXT record;
`mailroom send` signs what it sends; the messages a real SMTP sink captured verify with dkimpy's
verifier and with Perl's Mail::DKIM (an independent implementation, Debian libmail-dkim-perl), both
answered from the printed record instead of DNS. A message changed after signing fails both."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import dkim
import pytest
from outbound_support import SEND_FLAGS, add_sender, dkim_record

VERIFY_PL = Path(__file__).with_name("dkim_verify.pl")
REQUIRED = {b"from", b"to", b"subject", b"date", b"message-id", b"mime-version", b"content-type"}


def _perl_verify(name: str, value: str, content: bytes) -> str:
    done = subprocess.run(["perl", str(VERIFY_PL), name, value], input=content, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().split("\n")[0]


def _signed_headers(content: bytes) -> set[bytes]:
    sig = re.search(rb"^DKIM-Signature:(.*?)\r?\n(?=\S)", content, re.S | re.M | re.I).group(1)
    tags = re.search(rb"\bh=([^;]+)", re.sub(rb"\s+", b"", sig)).group(1)
    return set(tags.lower().split(b":"))


def test_sent_mail_verifies_under_dkim(conn, cli, smtp_server, tmp_path):
    server = smtp_server()
    add_sender(conn, server.port, from_address="news@mailroom.test")
    key_file = tmp_path / "dkim.pem"
    made = cli("outbound", "dkim", "keygen", "main", "--selector", "mr2030", "--key-file", str(key_file))
    assert made.returncode == 0, made.stderr
    name, value = dkim_record(made.stdout)
    assert name == "mr2030._domainkey.mailroom.test"
    assert value.startswith("v=DKIM1; k=rsa; p=")
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert conn.execute("SELECT count(*) FROM mailroom.dkim_keys WHERE public_key LIKE '%PRIVATE%'").fetchone()[0] == 0

    conn.execute("SELECT mailroom.set_setting('outbound.bounce_domain', 'bounces.mailroom.test')")
    conn.execute("SELECT mailroom.set_setting('outbound.unsubscribe_base_url', 'https://mail.mailroom.test')")
    conn.execute(
        "SELECT mailroom.enqueue_message('main', ARRAY['ann@example.com'], 'Grüße, one', 'text', '<p>html</p>',"
        " ARRAY['cc@example.com'])"
    )
    conn.execute("SELECT mailroom.enqueue_bulk_message('main', ARRAY['bulk@example.com'], 'News', 'unsubscribe below')")
    sent = cli("send", "--until-idle", *SEND_FLAGS, env={"MAILROOM_DKIM_KEY_FILE": str(key_file)})
    assert sent.returncode == 0, sent.stderr

    received = server.handler.received
    assert len(received) == 3  # the first message once per recipient (VERP), the bulk one
    dns = {name.encode(): value.encode()}
    for r in received:
        content = r.content
        assert content.startswith(b"DKIM-Signature:")
        assert dkim.verify(content, dnsfunc=lambda n, timeout=5: dns.get(n.rstrip(b"."))), "dkimpy: no pass"
        assert _perl_verify(name, value, content) == "pass"
        assert REQUIRED <= _signed_headers(content)
        assert b"d=mailroom.test" in content.split(b"\r\n\r\n")[0]
    bulk = next(r for r in received if r.rcpt_tos == ["bulk@example.com"]).content
    assert {b"list-unsubscribe", b"list-unsubscribe-post"} <= _signed_headers(bulk)

    tampered = bulk.replace(b"Subject: News", b"Subject: Nevs")
    assert tampered != bulk
    assert not dkim.verify(tampered, dnsfunc=lambda n, timeout=5: dns.get(n.rstrip(b".")))
    assert _perl_verify(name, value, tampered) == "fail"


def test_no_key_file_sends_unsigned_with_a_warning(conn, cli, smtp_server, tmp_path):
    server = smtp_server()
    add_sender(conn, server.port)
    made = cli("outbound", "dkim", "keygen", "main", "--selector", "s1", "--key-file", str(tmp_path / "k.pem"))
    assert made.returncode == 0, made.stderr
    conn.execute("SELECT mailroom.enqueue_message('main', ARRAY['a@example.com'], 's', 'b')")
    sent = cli("send", "--until-idle", *SEND_FLAGS)
    assert sent.returncode == 0, sent.stderr
    assert not server.handler.received[0].content.startswith(b"DKIM-Signature:")
    assert "leaves unsigned" in sent.stderr


@pytest.mark.parametrize("selector", ["bad selector", "-x", ""])
def test_keygen_refuses_a_bad_selector(conn, cli, smtp_server, tmp_path, selector):
    add_sender(conn, smtp_server().port)
    made = cli("outbound", "dkim", "keygen", "main", "--selector", selector, "--key-file", str(tmp_path / "k.pem"))
    assert made.returncode != 0
    assert made.stderr.startswith("mailroom: error:") and "Traceback" not in made.stderr
    assert not (tmp_path / "k.pem").exists()


def test_openssl_signature_is_dkimpys_byte_for_byte(monkeypatch):
    """The sender's signer (dkimpy with the RSA done by OpenSSL, issue 37) writes the very header dkimpy
    writes alone (PKCS#1 v1.5 is deterministic), for a message and a key of each size it may meet."""
    from mailroom.outbound import dkim as mdkim

    monkeypatch.setattr(dkim.time, "time", lambda: 1_800_000_000)
    message = (b"From: News <news@mailroom.test>\r\nTo: ann@example.com\r\nSubject: Gr\xc3\xbc\xc3\x9fe\r\n"
               b"Date: Fri, 27 Nov 2026 05:00:00 +0000\r\nMessage-ID: <1@mailroom.test>\r\nMIME-Version: 1.0\r\n"
               b"Content-Type: text/plain; charset=utf-8\r\n\r\n" + b"a line  of text \r\n" * 40)
    for bits in (1024, 2048):
        pem = mdkim.generate_key(bits)
        public = mdkim.public_record_key(pem)
        row = {"dkim_public_key": public, "dkim_algorithm": "rsa-sha256", "dkim_selector": "s1",
               "dkim_domain": "mailroom.test"}
        ours = mdkim.Signer({public: pem}).sign(message, row)
        theirs = dkim.sign(message, b"s1", b"mailroom.test", pem, canonicalize=(b"relaxed", b"relaxed"),
                           include_headers=[h.encode() for h in (*mdkim.SIGNED_HEADERS, "from", "subject")]) + message
        assert ours == theirs
        fallback = mdkim.Signer({public: pem})
        fallback._slow = True  # what a dkimpy with other internals gets: dkimpy's own signature, the same bytes
        assert fallback.sign(message, row) == theirs
        assert dkim.verify(ours, dnsfunc=lambda _name, timeout=5, p=public: f"v=DKIM1; k=rsa; p={p}".encode())


def test_openssl_signs_exactly_when_switched_on():
    """dkimpy's internals that OpenSslDkim overrides (DKIM.gen_header) could change so that dkimpy's own
    RSA signs again, the same bytes, only slower: this fails then (MAILROOM_FAST_PATHS=off: dkimpy alone)."""
    from mailroom.core import fastpaths
    from mailroom.outbound import dkim as mdkim

    pem = mdkim.generate_key(1024)
    public = mdkim.public_record_key(pem)
    row = {"dkim_public_key": public, "dkim_algorithm": "rsa-sha256", "dkim_selector": "s1",
           "dkim_domain": "mailroom.test"}
    before = fastpaths.served["outbound.dkim_openssl"]
    signer = mdkim.Signer({public: pem})
    signed = signer.sign(b"From: a@mailroom.test\r\nSubject: s\r\n\r\nbody\r\n", row)
    assert signed.startswith(b"DKIM-Signature:")
    assert (fastpaths.served["outbound.dkim_openssl"] - before == 1) is fastpaths.enabled(), dkim.__file__
    assert signer._slow is not fastpaths.enabled()


def test_the_openssl_signer_never_parses_the_pem_per_message(monkeypatch):
    """dkimpy's DKIM.sign reads the PEM with its pure-Python ASN.1 reader at every message (124 us for a
    2,048-bit key, an eighth of a signed message's sender CPU); the OpenSSL signer loads the key once
    and signs without it (MAILROOM_FAST_PATHS=off: dkimpy alone, which parses)."""
    from mailroom.core import fastpaths
    from mailroom.outbound import dkim as mdkim

    parsed = []
    real = dkim.parse_pem_private_key
    monkeypatch.setattr(dkim, "parse_pem_private_key", lambda data: parsed.append(1) or real(data))
    pem = mdkim.generate_key(1024)
    public = mdkim.public_record_key(pem)
    row = {"dkim_public_key": public, "dkim_algorithm": "rsa-sha256", "dkim_selector": "s1",
           "dkim_domain": "mailroom.test"}
    signer = mdkim.Signer({public: pem})
    for n in range(3):
        assert signer.sign(f"From: a@mailroom.test\r\nSubject: {n}\r\n\r\nbody\r\n".encode(), row).startswith(
            b"DKIM-Signature:")
    assert len(parsed) == (0 if fastpaths.enabled() else 3)
