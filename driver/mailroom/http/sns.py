"""Amazon SNS message verification for POST /hooks/ses (docs/http.md#inbound-from-ses).

An SNS message is trusted when:
- its TopicArn is one the operator configured (a valid SNS signature only proves the message comes
  from SNS, from anybody's topic);
- its Timestamp is within MAX_AGE (an hour, AWS's advice) and at most MAX_SKEW ahead: the setting
  ses.replay_window (how long a handled SES messageId is remembered, sql/29_ses.sql) is at least an
  hour, so a notification replayed after its receipt was forgotten is refused, never stored again;
- its SigningCertURL is https on an SNS host (`sns.<region>.amazonaws.com`, `.com.cn`), on the
  default port, no user, a path ending `.pem`, no query and no fragment: all checked before anything
  is fetched (a SubscribeURL the same, but it has a query);
- the certificate is current, and its key verifies the Signature (SignatureVersion 1: SHA1withRSA,
  2: SHA256withRSA) over the canonical string of the message's fields.

The certificate comes from a certificate directory when one is configured (the file named like the
URL's last path segment: air-gapped installs, and the tests, which make their own CA), else it is
fetched over HTTPS from the URL (certificate-checked, at most 64 KiB, 5 s) and kept in memory: at
most CACHE_SIZE certificates, the least recently used dropped first, keyed by host and path.
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
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

SNS_HOST = re.compile(r"^sns\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$")
MAX_FETCH = 64 * 1024
CACHE_SIZE = 32  # signing certificates kept (SNS uses a handful; a flood of URLs cannot grow it)
MAX_AGE = dt.timedelta(hours=1)  # oldest Timestamp taken (<= ses.replay_window, whose minimum is 1 hour)
MAX_SKEW = dt.timedelta(minutes=5)  # a Timestamp this far ahead of our clock at most
_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?Z$")

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


def check_sns_url(url: object, *, certificate: bool = False) -> tuple[str, int, str]:
    """(host, 443, path with query) of an https URL on an SNS host, on the default port, without a
    user or a fragment, else SnsError; a certificate's URL (certificate=True) also has a path ending
    .pem and no query. Nothing is fetched before this passed."""
    if not isinstance(url, str) or len(url) > 2048:
        raise SnsError("URL missing")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise SnsError("URL is not https on an SNS host") from None
    host = (parts.hostname or "").lower()
    if parts.scheme != "https" or not SNS_HOST.match(host) or parts.username is not None or parts.password is not None:
        raise SnsError("URL is not https on an SNS host")
    if port not in (None, 443):
        raise SnsError("URL is not on the default port")
    if parts.fragment or url.endswith("#"):
        raise SnsError("URL has a fragment")
    if certificate and (parts.query or "?" in url or not parts.path.endswith(".pem")):
        raise SnsError("certificate URL is not a path ending .pem without a query")
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return host, 443, path


def check_timestamp(value: object, now: dt.datetime | None = None) -> None:
    """SnsError unless the message's Timestamp (ISO 8601 UTC, as SNS writes it) is within MAX_AGE
    of now and at most MAX_SKEW ahead."""
    if not isinstance(value, str) or not _TIMESTAMP.match(value):
        raise SnsError("Timestamp missing or not an ISO 8601 UTC time")
    try:
        stamp = dt.datetime.fromisoformat(value[:-1] + "+00:00")
    except ValueError:
        raise SnsError("Timestamp missing or not an ISO 8601 UTC time") from None
    now = now or dt.datetime.now(dt.UTC)
    if stamp < now - MAX_AGE:
        raise SnsError(f"Timestamp is more than {MAX_AGE.total_seconds() / 3600:g} hour(s) old (a replay?)")
    if stamp > now + MAX_SKEW:
        raise SnsError("Timestamp is in the future")


@dataclass
class SnsVerifier:
    topics: frozenset[str]
    cert_dir: Path | None = None
    ca_file: str | None = None
    connect_to: tuple[str, int] | None = None
    _certs: OrderedDict[tuple[str, str], x509.Certificate] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def verify(self, message: dict) -> None:
        """Raise SnsError unless the message is an authentic SNS message of a configured topic."""
        if message.get("TopicArn") not in self.topics:
            raise SnsError("topic not configured (MAILROOM_SES_TOPICS)")
        hash_class = _HASHES.get(str(message.get("SignatureVersion")))
        if hash_class is None:
            raise SnsError("unsupported SignatureVersion")
        data = string_to_sign(message)
        check_timestamp(message.get("Timestamp"))  # (signed: part of the canonical string)
        check_sns_url(message.get("SigningCertURL"), certificate=True)  # before any fetch
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
        host, port, path = check_sns_url(url, certificate=True)
        key = (host, path)
        with self._lock:
            cached = self._certs.get(key)
            if cached is not None:
                self._certs.move_to_end(key)
                return cached
        if self.cert_dir is not None:
            name = Path(path).name
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
            self._certs[key] = cert
            self._certs.move_to_end(key)
            while len(self._certs) > CACHE_SIZE:
                self._certs.popitem(last=False)
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
