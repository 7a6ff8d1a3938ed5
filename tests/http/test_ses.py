"""POST /hooks/ses: SES receipts through SNS, verified with certificates of the test's own CA.

No network: the signing certificate comes from a certificate directory, or from an HTTPS server on
127.0.0.1 that presents a certificate for sns.us-east-1.amazonaws.com issued by the test CA (the
server is told to connect there and to trust that CA). The canonical string is built here from
the SNS documentation, independently of the driver's.
"""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import json
import ssl
import threading
import uuid
from email.message import EmailMessage

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

TOPIC = "arn:aws:sns:us-east-1:123456789012:mailroom-inbound"
SNS_HOST = "sns.us-east-1.amazonaws.com"
CERT_NAME = "SimpleNotificationService-0000000000000000000000000000000.pem"
CERT_URL = f"https://{SNS_HOST}/{CERT_NAME}"


def _cert(subject: str, key, issuer_key, issuer_name, *, ca: bool = False, san: str | None = None):
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(san)]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """The test's CA, an SNS signing certificate, and a TLS certificate for the SNS host."""
    home = tmp_path_factory.mktemp("pki")
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mailroom test CA")])
    ca = _cert("mailroom test CA", ca_key, ca_key, ca_name, ca=True)
    sign_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    signing = _cert(SNS_HOST, sign_key, ca_key, ca_name)
    tls_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    tls = _cert(SNS_HOST, tls_key, ca_key, ca_name, san=SNS_HOST)
    pem = serialization.Encoding.PEM
    (home / "ca.pem").write_bytes(ca.public_bytes(pem))
    certs = home / "certs"
    certs.mkdir()
    (certs / CERT_NAME).write_bytes(signing.public_bytes(pem))
    (home / "tls.pem").write_bytes(tls.public_bytes(pem))
    (home / "tls.key").write_bytes(tls_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return {"home": home, "certs": certs, "sign_key": sign_key, "signing_pem": signing.public_bytes(pem)}


def _signed(message: dict, key, version: str = "2") -> dict:
    """SNS's signature: the fields in order (Subject only when present), each `name\\nvalue\\n`."""
    names = ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type") if message["Type"] == "Notification" \
        else ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type")
    text = "".join(f"{n}\n{message[n]}\n" for n in names if n in message)
    digest = hashes.SHA256() if version == "2" else hashes.SHA1()  # noqa: S303 - SNS SignatureVersion 1
    signature = key.sign(text.encode(), padding.PKCS1v15(), digest)
    return {**message, "SignatureVersion": version, "Signature": base64.b64encode(signature).decode(),
            "SigningCertURL": message.get("SigningCertURL", CERT_URL)}


def _now_stamp(delta: dt.timedelta = dt.timedelta(0)) -> str:
    return (dt.datetime.now(dt.UTC) + delta).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _receipt(recipients: list[str], raw: bytes, *, base64_content: bool = True, ses_id: str | None = None) -> dict:
    content = base64.b64encode(raw).decode() if base64_content else raw.decode()
    return {
        "Type": "Notification", "MessageId": str(uuid.uuid4()), "TopicArn": TOPIC, "Subject": "Amazon SES Email Receipt",
        "Timestamp": _now_stamp(),
        "Message": json.dumps({
            "notificationType": "Received",
            "mail": {"messageId": ses_id or uuid.uuid4().hex, "source": "app@example.org", "destination": recipients},
            "receipt": {"recipients": recipients, "action": {"type": "SNS", "encoding": "BASE64" if base64_content else "UTF8"}},
            "content": content,
        }),
    }


def _mail(subject: str) -> bytes:
    msg = EmailMessage()
    msg["From"] = "Example App <app@example.org>"
    msg["Subject"] = subject
    msg.set_content(f"{subject}: https://app.example.org/activate?t=1 code 48213\n")
    return msg.as_bytes()


def test_ses_receipts_stored_replayed_refused(start_server, pki, conn):
    server = start_server("--ses-topic", TOPIC, "--sns-cert-dir", str(pki["certs"]))
    box = server.request("POST", "/api/v1/mailboxes").json()
    key = pki["sign_key"]
    note = _signed(_receipt([box["address"]], _mail("Activate your account")), key)
    first = server.request("POST", "/hooks/ses", body=json.dumps(note).encode())
    assert (first.status, first.json()) == (200, {"stored": 1, "refused": {}, "duplicate": False})
    listed = server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages", token=box["session_token"]).json()
    message = server.request("GET", f"/api/v1/mailboxes/{box['address']}/messages/{listed[0]['id']}",
                             token=box["session_token"]).json()
    assert (message["subject"], message["code"], message["envelope_from"]) == ("Activate your account", "48213",
                                                                               "app@example.org")
    # SNS retries the same notification: nothing more is stored
    replay = server.request("POST", "/hooks/ses", body=json.dumps(note).encode())
    assert (replay.status, replay.json()["duplicate"]) == (200, True)
    assert server.request("GET", f"/api/v1/mailboxes/{box['address']}", token=box["session_token"]).json()[
        "message_count"] == 1

    # not trusted: 403, nothing stored
    forged = dict(note, Message=note["Message"].replace("app@example.org", "evil@example.org"))
    assert forged["Message"] != note["Message"]
    assert server.request("POST", "/hooks/ses", body=json.dumps(forged).encode()).status == 403
    other_topic = _signed(dict(_receipt([box["address"]], _mail("x")), TopicArn=TOPIC + "-other"), key)
    assert server.request("POST", "/hooks/ses", body=json.dumps(other_topic).encode()).status == 403
    evil_host = _signed(dict(_receipt([box["address"]], _mail("x")), SigningCertURL=f"https://evil.example/{CERT_NAME}"),
                        key)
    assert server.request("POST", "/hooks/ses", body=json.dumps(evil_host).encode()).status == 403
    assert server.request("POST", "/hooks/ses", body=b"not json").status == 400

    # SignatureVersion 1, UTF8 content, a catch-all address, an unknown one, an expired inbox
    conn.execute("SELECT mailroom.set_catchall_domain('dev.example', 'team-1')")
    gone = server.request("POST", "/api/v1/mailboxes").json()
    conn.execute("UPDATE mailroom.mailboxes SET expires_at = now() - interval '1 minute' WHERE address = %s",
                 (gone["address"],))
    mixed = _signed(_receipt([box["address"], "qa-run-7@dev.example", "nobody@nowhere.example", gone["address"]],
                             _mail("Second"), base64_content=False), key, version="1")
    answer = server.request("POST", "/hooks/ses", body=json.dumps(mixed).encode())
    assert answer.status == 200
    assert answer.json() == {"stored": 2, "refused": {"expired": 1, "unknown": 1}, "duplicate": False}
    assert conn.execute("SELECT message_count FROM mailroom.mailboxes WHERE address = 'qa-run-7@dev.example'").fetchone() \
        == (1,)
    assert conn.execute("SELECT message_count FROM mailroom.mailboxes WHERE address = %s", (gone["address"],)).fetchone() \
        == (0,)
    assert box["address"] not in server.log() and "Activate" not in server.log()


class _FakeSns(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []
    pem = b""

    def do_GET(self) -> None:  # noqa: N802
        type(self).seen.append(self.path)
        body = type(self).pem if self.path.endswith(".pem") else b"<ConfirmSubscriptionResponse/>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_subscription_confirmed_and_certificate_fetched_over_https(start_server, pki):
    _FakeSns.pem = pki["signing_pem"]
    _FakeSns.seen = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeSns)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["home"] / "tls.pem", pki["home"] / "tls.key")
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server = start_server("--ses-topic", TOPIC, "--sns-ca-file", str(pki["home"] / "ca.pem"),
                              "--sns-connect-to", f"127.0.0.1:{httpd.server_address[1]}")
        subscribe = _signed({
            "Type": "SubscriptionConfirmation", "MessageId": str(uuid.uuid4()), "Token": "tok-123", "TopicArn": TOPIC,
            "Message": "You have chosen to subscribe", "Timestamp": _now_stamp(),
            "SubscribeURL": f"https://{SNS_HOST}/?Action=ConfirmSubscription&TopicArn={TOPIC}&Token=tok-123",
        }, pki["sign_key"])
        confirmed = server.request("POST", "/hooks/ses", body=json.dumps(subscribe).encode())
        assert (confirmed.status, confirmed.json()) == (200, {"confirmed": True})
        assert _FakeSns.seen == [f"/{CERT_NAME}", f"/?Action=ConfirmSubscription&TopicArn={TOPIC}&Token=tok-123"]
        # a SubscribeURL elsewhere is never fetched
        elsewhere = _signed(dict(subscribe, SubscribeURL="https://evil.example/?x"), pki["sign_key"])
        assert server.request("POST", "/hooks/ses", body=json.dumps(elsewhere).encode()).status == 403
        assert len(_FakeSns.seen) == 2
    finally:
        httpd.shutdown()


def test_the_hook_is_off_without_topics(server):
    assert server.request("POST", "/hooks/ses", body=b"{}").status == 404


@pytest.fixture
def fake_sns(pki):
    """An HTTPS endpoint presenting a certificate for the SNS host (the test CA): what it was asked."""
    _FakeSns.pem = pki["signing_pem"]
    _FakeSns.seen = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeSns)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki["home"] / "tls.pem", pki["home"] / "tls.key")
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()


def test_certificate_url_checked_before_any_fetch(start_server, pki, fake_sns):
    """Issue 34: the SigningCertURL must be https, on an SNS host, on the default port, a path ending
    .pem and no query; anything else is refused (403) and never fetched."""
    server = start_server("--ses-topic", TOPIC, "--sns-ca-file", str(pki["home"] / "ca.pem"),
                          "--sns-connect-to", f"127.0.0.1:{fake_sns.server_address[1]}")
    box = server.request("POST", "/api/v1/mailboxes").json()
    for url in (f"https://{SNS_HOST}:8443/{CERT_NAME}", f"https://{SNS_HOST}/{CERT_NAME}?x=1",
                f"https://{SNS_HOST}/{CERT_NAME}#x", f"http://{SNS_HOST}/{CERT_NAME}",
                f"https://{SNS_HOST}/{CERT_NAME}.txt", f"https://{SNS_HOST}:0/{CERT_NAME}",
                f"https://{SNS_HOST}:99999/{CERT_NAME}", f"https://u@{SNS_HOST}/{CERT_NAME}"):
        note = _signed(dict(_receipt([box["address"]], _mail("x")), SigningCertURL=url), pki["sign_key"])
        answer = server.request("POST", "/hooks/ses", body=json.dumps(note).encode())
        assert answer.status == 403, (url, answer.status)
    assert _FakeSns.seen == [], "a refused certificate URL was fetched"
    # the same notification with the SNS form of the URL (explicit :443 is the default port) is taken
    for url in (CERT_URL, f"https://{SNS_HOST}:443/{CERT_NAME}"):
        note = _signed(dict(_receipt([box["address"]], _mail("y")), SigningCertURL=url), pki["sign_key"])
        assert server.request("POST", "/hooks/ses", body=json.dumps(note).encode()).status == 200
    assert _FakeSns.seen == [f"/{CERT_NAME}"], "one fetch, then the cached certificate (keyed by host and path)"


def test_old_or_future_notifications_refused(start_server, pki, conn):
    """Issue 34: Timestamp within an hour (SNS's and AWS's advice; ses.replay_window is at least an hour,
    so a replay after its receipt was forgotten is refused, not stored again); a future one (over 5
    minutes ahead) is refused too."""
    server = start_server("--ses-topic", TOPIC, "--sns-cert-dir", str(pki["certs"]))
    box = server.request("POST", "/api/v1/mailboxes").json()
    key = pki["sign_key"]
    # a notification handled two hours ago, its receipt forgotten (ses.replay_window passed): replayed
    old = _signed(dict(_receipt([box["address"]], _mail("old")), Timestamp=_now_stamp(-dt.timedelta(hours=2))), key)
    answer = server.request("POST", "/hooks/ses", body=json.dumps(old).encode())
    assert answer.status == 403 and "Timestamp" in answer.json()["error"]["message"], answer.body
    future = _signed(dict(_receipt([box["address"]], _mail("f")), Timestamp=_now_stamp(dt.timedelta(hours=1))), key)
    assert server.request("POST", "/hooks/ses", body=json.dumps(future).encode()).status == 403
    for bad in ("yesterday", "2026-13-01T00:00:00.000Z", ""):
        note = _signed(dict(_receipt([box["address"]], _mail("b")), Timestamp=bad), key)
        assert server.request("POST", "/hooks/ses", body=json.dumps(note).encode()).status == 403
    recent = _signed(dict(_receipt([box["address"]], _mail("recent")),
                          Timestamp=_now_stamp(-dt.timedelta(minutes=50))), key)
    assert server.request("POST", "/hooks/ses", body=json.dumps(recent).encode()).status == 200
    assert conn.execute("SELECT message_count FROM mailroom.mailboxes WHERE address = %s",
                        (box["address"],)).fetchone() == (1,)


def test_certificate_cache_is_bounded(pki, tmp_path):
    """Issue 34: the certificate cache keeps at most 32 certificates (least recently used first out),
    however many distinct certificate URLs arrive."""
    from mailroom.http.sns import SnsVerifier

    for i in range(40):
        (tmp_path / f"cert-{i}.pem").write_bytes(pki["signing_pem"])
    verifier = SnsVerifier(frozenset([TOPIC]), cert_dir=tmp_path)
    for i in range(40):
        verifier.certificate(f"https://{SNS_HOST}/cert-{i}.pem")
        verifier.certificate(f"https://{SNS_HOST}/cert-0.pem")  # the one in use stays
    assert len(verifier._certs) == 32
    assert any("cert-0.pem" in str(k) for k in verifier._certs) and not any("cert-1.pem" in str(k) for k in verifier._certs)
