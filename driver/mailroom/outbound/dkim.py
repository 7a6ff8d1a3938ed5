"""DKIM signing of outbound mail (RFC 6376) with dkimpy: the sender's half of docs/deliverability.md.

The database holds, per From domain, the selector and the public half (mailroom.set_dkim_key,
sql/30_outbound_dkim.sql); claim_messages returns them with each message. The private keys live
only where `mailroom send` runs: MAILROOM_DKIM_KEY_FILE, PEM private keys one after another (mode
0600), written by `mailroom outbound dkim keygen`. The sender signs a message with the key of
that file whose public half is the one the database returned, so a key that was replaced in the
database is never used, and nothing secret ever crosses the connection.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from typing import Any

from mailroom.core import fastpaths
from mailroom.core.errors import ConfigError
from mailroom.core.log import get_logger

log = get_logger("send")

KEY_FILE_ENV = "MAILROOM_DKIM_KEY_FILE"

# RFC 6376 section 5.4.1: the headers that make the message what it is, each signed once more
# than it appears (an empty instance), so that none can be added on the way: From, To, Subject,
# Date, Message-ID, List-Unsubscribe(-Post) and the MIME headers, plus Cc and Reply-To.
SIGNED_HEADERS = (
    "from", "to", "cc", "subject", "date", "message-id", "reply-to", "list-unsubscribe", "list-unsubscribe-post",
    "mime-version", "content-type", "content-transfer-encoding",
)

_PEM = re.compile(rb"-----BEGIN (?:RSA )?PRIVATE KEY-----.+?-----END (?:RSA )?PRIVATE KEY-----\s*", re.S)


def public_record_key(private_pem: bytes) -> str:
    """The p= of a private key's DNS record: base64 of its public SubjectPublicKeyInfo (DER)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(private_pem, password=None)
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(der).decode("ascii")


def generate_key(bits: int = 2048) -> bytes:
    """A new RSA private key (PKCS#8 PEM) for rsa-sha256 signatures."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    if bits not in (1024, 2048, 3072, 4096):
        raise ConfigError(f"--bits must be 1024, 2048, 3072 or 4096, got {bits}")
    key = rsa.generate_private_key(public_exponent=65537, key_size=bits)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def append_key(path: Path, private_pem: bytes) -> None:
    """Add a private key to the key file (created 0600; the keys already there stay)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, private_pem if private_pem.endswith(b"\n") else private_pem + b"\n")
    finally:
        os.close(fd)


_OPENSSL_DKIM: Any = None


def _openssl_dkim() -> Any:
    """dkimpy's DKIM class with its RSA operation done by OpenSSL (the `cryptography` package).

    dkimpy computes the RSA signature itself in Python (two pow() of 1,024 bits, CRT): 56 ms a
    2,048-bit signature on the bench machine (bench/bench_outbound_work.py, issue 37), about 90% of the
    time of signing a 2 KB message, so a sender signing every message was bound at ~20 messages a
    second a core. Canonicalization, the header hash and the header's layout stay dkimpy's; only
    the PKCS#1 v1.5 signature of the header hash (RFC 6376 section 3.3.1, RFC 8017 section 8.2.1)
    is OpenSSL's, on the key loaded once per key (Signer); DKIM.sign's steps run without dkimpy's
    parse of the PEM at every message. The same bytes come out: PKCS#1 v1.5 is deterministic
    (tests/outbound/test_dkim.py compares both, verifies with Perl's Mail::DKIM, and fails when OpenSSL
    no longer signs or the PEM is parsed per message: dkimpy's DKIM.sign, DKIM.gen_header, fold,
    RE_BTAG, HashThrough, hash_headers; pyproject.toml pins the tested minor). MAILROOM_FAST_PATHS=off:
    dkimpy alone."""
    global _OPENSSL_DKIM
    if _OPENSSL_DKIM is not None:
        return _OPENSSL_DKIM
    import dkim
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding, utils

    class OpenSslDkim(dkim.DKIM):
        rsa_key: Any = None  # a cryptography RSAPrivateKey, set before sign()

        def sign(self, selector, domain, privkey, signature_algorithm=None, identity=None,
                 canonicalize=(b"relaxed", b"simple"), include_headers=None, length=False):
            # dkimpy's DKIM.sign (dkimpy 1.1) for rsa-sha256 without parsing `privkey`: dkimpy reads the
            # PEM with its pure-Python ASN.1 reader at every call (124 us for a 2,048-bit key, an eighth
            # of a signed message's sender CPU) only to hand it to gen_header, which signs with the key
            # OpenSSL loaded once (Signer._rsa_key)
            if signature_algorithm:
                self.signature_algorithm = signature_algorithm
            if self.signature_algorithm != b"rsa-sha256" or self.rsa_key is None:
                return super().sign(selector, domain, privkey, None, identity, canonicalize, include_headers, length)
            if identity is not None and not identity.endswith(domain):
                raise dkim.ParameterError("identity must end with domain")
            canon_policy = dkim.CanonicalizationPolicy.from_c_value(b"/".join(canonicalize))
            if include_headers is None:
                include_headers = self.default_sign_headers()
            include_headers = tuple((x if isinstance(x, bytes) else x.encode()).lower() for x in include_headers)
            self.include_headers = include_headers
            if self.tlsrpt:
                length = False
            if b"from" not in include_headers:
                raise dkim.ParameterError("The From header field MUST be signed")
            for x in set(include_headers).intersection(self.should_not_sign):
                raise dkim.ParameterError(f"The {x} header field SHOULD NOT be signed")
            body = canon_policy.canonicalize_body(self.body)
            self.hasher = dkim.HASH_ALGORITHMS[self.signature_algorithm]
            h = self.hasher()
            h.update(body)
            bodyhash = base64.b64encode(h.digest())
            sigfields = [x for x in [
                (b"v", b"1"),
                (b"a", self.signature_algorithm),
                (b"c", canon_policy.to_c_value()),
                (b"d", domain),
                (b"i", identity or b"@" + domain),
                length and (b"l", str(len(body)).encode("ascii")),
                (b"q", b"dns/txt"),
                (b"s", selector),
                (b"t", str(int(dkim.time.time())).encode("ascii")),
                (b"h", b" : ".join(include_headers)),
                (b"bh", bodyhash),
                (b"b", b"0" * 60),
            ] if x]
            res = self.gen_header(sigfields, include_headers, canon_policy, b"DKIM-Signature", None)
            self.domain = domain
            self.selector = selector
            self.signature_fields = dict(sigfields)
            return b"DKIM-Signature: " + res

        def gen_header(self, fields, include_headers, canon_policy, header_name, pk, standardize=False):
            # dkimpy's DKIM.gen_header (dkimpy 1.1) for rsa-sha256 without `standardize`, the RSA by OpenSSL
            if standardize or self.signature_algorithm != b"rsa-sha256" or self.rsa_key is None:
                return super().gen_header(fields, include_headers, canon_policy, header_name, pk, standardize)
            header_value = b"; ".join(b"=".join(x) for x in fields)
            header_value = dkim.fold(header_value, namelen=len(header_name), linesep=b"\r\n")
            header_value = dkim.RE_BTAG.sub(b"\\1", header_value)
            header = (header_name, b" " + header_value)
            h = dkim.HashThrough(self.hasher(), self.debug_content)
            sig = dict(fields)
            headers = canon_policy.canonicalize_headers(self.headers)
            self.signed_headers = dkim.hash_headers(h, canon_policy, headers, include_headers, header, sig)
            sig2 = self.rsa_key.sign(h.digest(), padding.PKCS1v15(), utils.Prehashed(hashes.SHA256()))
            fastpaths.hit("outbound.dkim_openssl")
            idx = [i for i in range(len(fields)) if fields[i][0] == b"b"][0]
            fields[idx] = (b"b", base64.b64encode(bytes(sig2)))
            header_value = b"; ".join(b"=".join(x) for x in fields) + self.linesep
            return dkim.fold(header_value, namelen=len(header_name), linesep=self.linesep)

    _OPENSSL_DKIM = OpenSslDkim
    return OpenSslDkim


class Signer:
    """The private keys of MAILROOM_DKIM_KEY_FILE by their public half; signs claimed rows."""

    def __init__(self, keys: dict[str, bytes]):
        self.keys = keys
        self._missing: set[tuple[str, str]] = set()
        self._loaded: dict[bytes, Any] = {}  # PEM -> the key OpenSSL signs with, loaded once
        # dkimpy's own RSA: MAILROOM_FAST_PATHS=off, or a dkimpy whose internals OpenSslDkim does not fit
        self._slow = not fastpaths.enabled()

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Signer:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read {KEY_FILE_ENV} {path}: {exc.strerror}") from None
        keys: dict[str, bytes] = {}
        for match in _PEM.finditer(data):
            pem = match.group(0)
            try:
                keys[public_record_key(pem)] = pem
            except (ValueError, TypeError):
                raise ConfigError(f"{KEY_FILE_ENV} {path}: a private key cannot be read") from None
        if not keys:
            raise ConfigError(f"{KEY_FILE_ENV} {path} holds no PEM private key")
        return cls(keys)

    @classmethod
    def from_env(cls) -> Signer:
        """The key file MAILROOM_DKIM_KEY_FILE names; without one, a signer with no key (mail of
        a domain with a DKIM key in the database then leaves unsigned, with a warning)."""
        path = os.environ.get(KEY_FILE_ENV)
        return cls.from_file(path) if path else cls({})

    def sign(self, payload: bytes, row: dict[str, Any]) -> bytes:
        """The message with its DKIM-Signature header first, when the row's From domain has a key
        in the database and its private half is here; else the message unchanged (once per
        domain and key, a warning: mail of a domain that publishes DKIM leaves unsigned)."""
        public = row.get("dkim_public_key")
        if not public:
            return payload
        pem = self.keys.get(public)
        if pem is None or row.get("dkim_algorithm") != "rsa-sha256":
            self._warn(row)
            return payload
        selector, domain = row["dkim_selector"].encode("ascii"), row["dkim_domain"].encode("ascii")
        include = [h.encode("ascii") for h in SIGNED_HEADERS + ("from", "subject")]
        if not self._slow:
            try:
                signer = _openssl_dkim()(payload)
                signer.rsa_key = self._rsa_key(pem)
                return signer.sign(selector, domain, pem, canonicalize=(b"relaxed", b"relaxed"),
                                   include_headers=include) + payload
            except TypeError:
                # a dkimpy whose DKIM.gen_header is not the one OpenSslDkim overrides: dkimpy signs alone
                self._slow = True
                log.warning("DKIM: this dkimpy's signing internals changed; signing with dkimpy's own RSA (slower)")
        import dkim

        return dkim.sign(payload, selector, domain, pem, canonicalize=(b"relaxed", b"relaxed"),
                         include_headers=include) + payload

    def _rsa_key(self, pem: bytes) -> Any:
        key = self._loaded.get(pem)
        if key is None:
            from cryptography.hazmat.primitives import serialization

            key = self._loaded[pem] = serialization.load_pem_private_key(pem, password=None)
        return key

    def _warn(self, row: dict[str, Any]) -> None:
        marker = (row.get("dkim_domain") or "", row.get("dkim_selector") or "")
        if marker not in self._missing:
            self._missing.add(marker)
            log.warning("DKIM: no private key in %s (%s) for selector %s of %s: its mail leaves unsigned",
                        KEY_FILE_ENV, "no file" if not self.keys else "not in it", marker[1], marker[0])

