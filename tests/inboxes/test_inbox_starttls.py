"""STARTTLS on `mailroom inbox serve` (issue 27, item 4): with --tls-cert/--tls-key the server offers
STARTTLS in EHLO, and a client that verifies the certificate against the test's own CA (smtplib with a
verifying SSLContext, on 127.0.0.1) upgrades and delivers; a client trusting another CA is refused by its
own verification; with --require-tls MAIL before STARTTLS gets 530 5.7.0; without a certificate nothing is
offered; bad TLS flags are one line and exit 2."""

from __future__ import annotations

import datetime as dt
import ipaddress
import smtplib
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _ca(home: Path, label: str):
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(label)).issuer_name(_name(label))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    path = home / f"{label.replace(' ', '_')}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, path


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A test CA, a server certificate it signs for 127.0.0.1 (and localhost), and another CA."""
    home = tmp_path_factory.mktemp("smtp-pki")
    ca_key, ca, ca_path = _ca(home, "mailroom test CA")
    _, _, other_ca_path = _ca(home, "another CA")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    (home / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (home / "server.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                        serialization.NoEncryption()))
    return {"ca": ca_path, "other_ca": other_ca_path, "cert": home / "server.pem", "key": home / "server.key"}


def _verifying(cafile: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(cafile))
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    return context


def _message(to: str) -> bytes:
    return f"From: <a@example.com>\r\nTo: <{to}>\r\nSubject: over TLS\r\n\r\nsecret body\r\n".encode()


def _stored(conn, mailbox) -> int:
    return conn.execute("SELECT count(*) FROM mailroom.messages WHERE mailbox_id = %s",
                        (mailbox.id,)).fetchone()[0]


def test_starttls_offered_verified_and_delivered(start_server, make_mailbox, conn, pki):
    server = start_server("--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]))
    box = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        assert client.has_extn("starttls")
        code, _ = client.starttls(context=_verifying(pki["ca"]))
        assert code == 220
        assert client.sock.version() in ("TLSv1.2", "TLSv1.3")
        client.ehlo()
        assert not client.has_extn("starttls"), "STARTTLS is not offered again inside TLS"
        client.sendmail("a@example.com", [box.address], _message(box.address))
    assert _stored(conn, box) == 1
    assert "STARTTLS offered" in server.log()

    # a client that trusts another CA refuses the certificate (its verification is real)
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        with pytest.raises(ssl.SSLCertVerificationError):
            client.starttls(context=_verifying(pki["other_ca"]))


def test_require_tls_refuses_mail_before_starttls(start_server, make_mailbox, conn, pki):
    server = start_server("--tls-cert", str(pki["cert"]), "--tls-key", str(pki["key"]), "--require-tls")
    box = make_mailbox()
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        assert client.has_extn("starttls")
        code, reply = client.mail("a@example.com")
        assert (code, reply.decode()) == (530, "5.7.0 Must issue a STARTTLS command first")
        client.starttls(context=_verifying(pki["ca"]))
        client.ehlo()
        client.sendmail("a@example.com", [box.address], _message(box.address))
    assert _stored(conn, box) == 1
    assert "STARTTLS required" in server.log()


def test_no_certificate_no_starttls(server):
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        assert not client.has_extn("starttls")
        assert client.docmd("STARTTLS")[0] in (454, 502)


@pytest.mark.parametrize(("flags", "line"), [
    (("--require-tls",), "--require-tls needs --tls-cert and --tls-key"),
    (("--tls-cert", "/nonexistent.pem"), "--tls-cert and --tls-key go together"),
    (("--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"),
     "cannot load the TLS certificate and key (/nonexistent.pem, /nonexistent.key): No such file or directory"),
])
def test_bad_tls_flags_are_one_line_exit_2(cli, flags, line):
    r = cli("inbox", "serve", "--port", "0", *flags, timeout=30)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"mailroom: error: {line}"


def test_tls_flags_have_environment_variables(cli, pki, start_server, make_mailbox, conn):
    server = start_server(env={"MAILROOM_INBOX_TLS_CERT": str(pki["cert"]), "MAILROOM_INBOX_TLS_KEY": str(pki["key"]),
                               "MAILROOM_INBOX_REQUIRE_TLS": "true"})
    with smtplib.SMTP(server.host, server.port, timeout=10) as client:
        client.ehlo()
        assert client.mail("a@example.com")[0] == 530
