"""The sender keypair: relay passwords the database stores but cannot read (issue 20, item 4).

The public half lives in the database (`mailroom.set_sender_public_key`): `upsert_sender` encrypts a
password to it with pgcrypto's `pgp_pub_encrypt`, or `mailroom outbound sender` encrypts it here
before sending, so the password never reaches the server. The private half lives only where
`mailroom send` runs (MAILROOM_SENDER_KEY_FILE); `claim_messages` returns the ciphertext and the
sender opens it here.

OpenPGP through pysequoia (Sequoia-PGP): pgcrypto's only public-key cipher is OpenPGP with RSA or
Elgamal keys, and it accepts a certificate with exactly one subkey, so the keypair is an RSA
primary key with one RSA encryption subkey (Sequoia's signing subkey is left out). A sender
decrypts each distinct ciphertext once per process (one RSA operation per relay, cached).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from mailroom.core.errors import ConfigError

KEY_FILE_ENV = "MAILROOM_SENDER_KEY_FILE"
USER_ID = "mailroom sender"


def _pysequoia():  # noqa: ANN202 - the module
    try:
        import pysequoia
    except ImportError:  # pragma: no cover - a dependency of the package
        raise ConfigError("the pysequoia package is not installed (pip install pysequoia)") from None
    return pysequoia


def generate_keypair(bits: int = 3072) -> tuple[bytes, str]:
    """A new sender keypair: (public certificate, binary, for the database; secret key, armored,
    for MAILROOM_SENDER_KEY_FILE). RSA with a single encryption subkey, as pgcrypto needs."""
    p = _pysequoia()
    from pysequoia.packet import PacketPile, Tag

    suite = {2048: p.CipherSuite.RSA2k, 3072: p.CipherSuite.RSA3k, 4096: p.CipherSuite.RSA4k}.get(bits)
    if suite is None:
        raise ConfigError(f"--bits must be 2048, 3072 or 4096, got {bits}")
    # RFC 4880 profile: v4 keys, the certificates pgcrypto reads
    generated = p.Tsk.generate(USER_ID, profile=p.Profile.RFC4880, cipher_suite=suite)
    packets = list(PacketPile.from_bytes(bytes(generated)))
    kept = []
    i = 0
    while i < len(packets):  # drop every subkey (and its binding signature) but the encryption one
        packet = packets[i]
        if packet.tag == Tag.SecretSubkey:
            binding = packets[i + 1]
            if binding.key_flags is not None and binding.key_flags.transport_encryption:
                kept += [packet, binding]
            i += 2
            continue
        kept.append(packet)
        i += 1
    tsk = p.Tsk.from_packets(kept)
    return bytes(tsk.extract_certificate()), str(tsk)


def seal(public_key: bytes, text: str) -> bytes:
    """`text` encrypted to a sender public key (binary OpenPGP message; Sequoia writes it in the
    RFC 9580 form, which the sender reads and upsert_sender checks only structurally)."""
    p = _pysequoia()
    return bytes(p.encrypt(text.encode(), recipients=[p.Cert.from_bytes(public_key)], armor=False))


class Unsealer:
    """Opens what was sealed for the sender key(s) in MAILROOM_SENDER_KEY_FILE (several files
    separated by os.pathsep: the current key and an older one during a key change)."""

    def __init__(self, secret_keys: Iterable[str | bytes]) -> None:
        p = _pysequoia()
        self._decrypt = p.decrypt
        self._decryptors = []
        for key in secret_keys:
            try:
                tsk = p.Tsk.from_bytes(key.encode() if isinstance(key, str) else key)
                self._decryptors.append(tsk.decryptor())
            except Exception:  # noqa: BLE001 - whatever the parser says, one line without the key
                raise ConfigError(f"{KEY_FILE_ENV}: not an OpenPGP secret key (mailroom outbound sender-key init)") from None
        self._opened: dict[bytes, str] = {}

    @classmethod
    def from_files(cls, value: str) -> Unsealer:
        keys = []
        for name in filter(None, value.split(os.pathsep)):
            path = Path(name).expanduser()
            try:
                keys.append(path.read_bytes())
            except OSError as exc:
                raise ConfigError(f"{KEY_FILE_ENV}: cannot read {path}: {exc.strerror}") from None
        if not keys:
            raise ConfigError(f"{KEY_FILE_ENV} is empty")
        return cls(keys)

    @classmethod
    def from_env(cls) -> Unsealer | None:
        value = os.environ.get(KEY_FILE_ENV, "").strip()
        return cls.from_files(value) if value else None

    def open(self, sealed: bytes) -> str | None:
        """The plaintext, or None when none of the keys opens it (sealed for another key)."""
        sealed = bytes(sealed)
        text = self._opened.get(sealed)
        if text is not None:
            return text
        for decryptor in self._decryptors:
            try:
                text = bytes(self._decrypt(sealed, decryptor=decryptor).bytes).decode()
            except Exception:  # noqa: BLE001, S112 - the next key may open it
                continue
            self._opened[sealed] = text
            return text
        return None
