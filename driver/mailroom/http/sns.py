"""Amazon SNS message verification for POST /hooks/ses (docs/http.md#inbound-from-ses).

An SNS message is trusted when:
- its TopicArn is one the operator configured (a valid SNS signature only proves the message comes
  from SNS, from anybody's topic);
- its SigningCertURL is https on an SNS host (`sns.<region>.amazonaws.com`, `.com.cn`), path `*.pem`;
- the certificate is current, and its key verifies the Signature (SignatureVersion 1: SHA1withRSA,
  2: SHA256withRSA) over the canonical string of the message's fields.

The certificate comes from a certificate directory when one is configured (the file named like the
URL's last path segment: air-gapped installs, and the tests, which make their own CA), else it is
fetched over HTTPS from the URL (certificate-checked, at most 64 KiB, 5 s) and kept in memory.
`connect_to` sends those HTTPS requests to another host:port while the SNS host name is still the
one checked and verified by TLS (tests run such an endpoint with their own CA; never needed in
production). Subscription confirmations fetch the SubscribeURL the same way, after the same checks.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import http.client
import re
import socket
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

SNS_HOST = re.compile(r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$")
MAX_FETCH = 64 * 1024

# The fields signed, in order, for each message type (absent optional ones are left out).
SIGNED_FIELDS = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
    "UnsubscribeConfirmation": ("Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"),
}
_HASHES = {"1": hashes.SHA1, "2": hashes.SHA256}


class SnsError(Exception):
    """Why a message is not trusted (safe to log: no content of the message)."""


def string_to_sign(message: dict) -> bytes:
    kind = message.get("Type")
    if kind not in SIGNED_FIELDS:
        raise SnsError("unknown message Type")
    lines = []
    for name in SIGNED_FIELDS[kind]:
        value = message.get(name)
        if value is None:
            if name == "Subject":
                continue
            raise SnsError(f"field {name} missing")
        if not isinstance(value, str):
            raise SnsError(f"field {name} is not a string")
        lines.append(f"{name}\n{value}\n")
    return "".join(lines).encode("utf-8")


def check_sns_url(url: object, *, suffix: str = "") -> tuple[str, int, str]:
    """(host, port, path with query) of an https URL on an SNS host, else SnsError."""
    if not isinstance(url, str):
        raise SnsError("URL missing")
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme != "https" or not SNS_HOST.match(host) or parts.username or parts.password:
        raise SnsError("URL is not https on an SNS host")
    if suffix and not parts.path.endswith(suffix):
        raise SnsError(f"URL does not end in {suffix}")
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return host, parts.port or 443, path


@dataclass
class SnsVerifier:
    topics: frozenset[str]
    cert_dir: Path | None = None
    ca_file: str | None = None
    connect_to: tuple[str, int] | None = None
    _certs: dict[str, x509.Certificate] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def verify(self, message: dict) -> None:
        """Raise SnsError unless the message is an authentic SNS message of a configured topic."""
        if message.get("TopicArn") not in self.topics:
            raise SnsError("topic not configured (MAILROOM_SES_TOPICS)")
        hash_class = _HASHES.get(str(message.get("SignatureVersion")))
        if hash_class is None:
            raise SnsError("unsupported SignatureVersion")
        data = string_to_sign(message)
        if message.get("Type") != "Notification":
            check_sns_url(message.get("SubscribeURL"))  # never fetched unless it is on an SNS host
        try:
            signature = base64.b64decode(message.get("Signature") or "", validate=True)
        except (binascii.Error, ValueError):
            raise SnsError("Signature is not base64") from None
        cert = self.certificate(message.get("SigningCertURL"))
        now = dt.datetime.now(dt.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise SnsError("signing certificate is not currently valid")
        key = cert.public_key()
        if not isinstance(key, rsa.RSAPublicKey):
            raise SnsError("signing certificate has no RSA key")
        try:
            key.verify(signature, data, padding.PKCS1v15(), hash_class())
        except InvalidSignature:
            raise SnsError("bad signature") from None

    def certificate(self, url: object) -> x509.Certificate:
        host, port, path = check_sns_url(url, suffix=".pem")
        assert isinstance(url, str)
        with self._lock:
            cached = self._certs.get(url)
        if cached is not None:
            return cached
        if self.cert_dir is not None:
            name = Path(urlsplit(url).path).name
            try:
                pem = (self.cert_dir / name).read_bytes()
            except OSError:
                raise SnsError("signing certificate not in the certificate directory") from None
        else:
            pem = self.fetch(host, port, path)
        try:
            cert = x509.load_pem_x509_certificate(pem)
        except ValueError:
            raise SnsError("signing certificate is not a PEM certificate") from None
        with self._lock:
            self._certs[url] = cert
        return cert

    def confirm(self, message: dict) -> None:
        """Confirm a subscription: GET its SubscribeURL (checked like a certificate URL)."""
        host, port, path = check_sns_url(message.get("SubscribeURL"))
        self.fetch(host, port, path)

    def fetch(self, host: str, port: int, path: str) -> bytes:
        """GET https://host:port/path, the certificate checked for `host`; the body (64 KiB at most)."""
        context = ssl.create_default_context(cafile=self.ca_file)
        target = self.connect_to or (host, port)
        try:
            with socket.create_connection(target, timeout=5) as raw_sock, \
                    context.wrap_socket(raw_sock, server_hostname=host) as sock:
                conn = http.client.HTTPConnection(host, port, timeout=5)
                conn.sock = sock
                conn.request("GET", path, headers={"Host": host, "User-Agent": "mailroom-http"})
                response = conn.getresponse()
                body = response.read(MAX_FETCH + 1)
                if response.status != 200:
                    raise SnsError(f"{host} answered HTTP {response.status}")
        except (OSError, http.client.HTTPException) as exc:
            raise SnsError(f"cannot fetch from {host}: {type(exc).__name__}") from None
        if len(body) > MAX_FETCH:
            raise SnsError(f"answer from {host} is over {MAX_FETCH} bytes")
        return body
