"""A private OpenDKIM (Debian `opendkim`) as the signing milter of the Postfix reference peer (issue 37, item 2).

`OpenDkim(domain, selector, private_pem)` writes a private opendkim.conf, the key file and a pid file
into a temporary directory, runs `/usr/sbin/opendkim -f -x CONF` (foreground, its own process) on a
unix socket in that directory, and waits until it listens; `milter` is the `unix:/PATH` that
Postfix's smtpd_milters/non_smtpd_milters name. The system configuration (/etc/opendkim.conf) is
never read. It signs (Mode s) mail whose From domain is `domain` with `selector` and the key given:
the same domain, selector and 2,048-bit RSA key as mailroom's signing key of the run, relaxed/relaxed
like mailroom's signer (driver/mailroom/outbound/dkim.py), rsa-sha256. `close()` terminates it by pid.

Why a unix socket (issue 37; docs/benchmarks.md "The Postfix + opendkim reference"): on a loopback
inet socket Postfix + opendkim signed 42 msg/s, 100 ms a message a session, while opendkim's CPU is
~3.5 ms a message. strace -f -tt of opendkim showed every message waiting twice ~42 ms for Postfix's
next milter packet (after its reply to the DATA macros and after its final accept): the length of
Linux's delayed-ACK timer (40 ms), the mark of Nagle's algorithm holding a small write until the
previous one is acknowledged. A unix socket has neither: 122-162 msg/s at 4 sessions in the same
minutes, 20 ms a message on one session. `socket="inet"` keeps the old form, to measure the
difference. The socket is made with UMask 000 (mode 0777) in a directory of its own: Postfix's smtpd
and cleanup (user postfix) must connect to it, and adding postfix to group opendkim would change the
system.

`verify(message, public_key)` checks a DKIM-Signature with dkimpy against the public half (the p= of
the record) instead of DNS: what the bench checks on the sink side before timing either signer.
"""

from __future__ import annotations

import atexit
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from bench import smtp_tools

OPENDKIM = "/usr/sbin/opendkim"
SKIPPED = "skipped: opendkim not installed"


def available() -> bool:
    return os.access(OPENDKIM, os.X_OK)


class OpenDkim:
    """One opendkim process signing for one domain and selector; see the module docstring."""

    def __init__(self, domain: str, selector: str, private_pem: bytes, socket: str = "unix") -> None:
        if not available():
            raise RuntimeError(SKIPPED)
        self.home = Path(tempfile.mkdtemp(prefix="mailroom-bench-opendkim-", dir="/tmp"))
        self.port = smtp_tools.free_port()
        self.socket_path = self.home / "milter.sock"
        if socket == "unix":
            self.milter = f"unix:{self.socket_path}"
            listen = f"local:{self.socket_path}"
            umask = "000"
        else:
            self.milter = f"inet:127.0.0.1:{self.port}"
            listen = f"inet:{self.port}@127.0.0.1"  # libmilter's form; Postfix's is self.milter
            umask = "007"
        key = self.home / f"{selector}.private"
        key.write_bytes(private_pem)
        key.chmod(0o600)
        user = None
        if os.geteuid() == 0:  # opendkim refuses to run as root with a key others could read; run as its user
            for name in ("opendkim", "nobody"):
                try:
                    pw = pwd.getpwnam(name)
                except KeyError:
                    continue
                user = name
                os.chown(self.home, pw.pw_uid, pw.pw_gid)
                os.chown(key, pw.pw_uid, pw.pw_gid)
                break
        conf = {
            "Syslog": "no",
            "LogWhy": "no",
            "Mode": "s",
            "Domain": domain,
            "Selector": selector,
            "KeyFile": str(key),
            "Socket": listen,
            "PidFile": str(self.home / "opendkim.pid"),
            "Canonicalization": "relaxed/relaxed",
            "SignatureAlgorithm": "rsa-sha256",
            "InternalHosts": "127.0.0.1",
            "RequireSafeKeys": "no",
            "UMask": umask,
            "Background": "no",
        }
        if user is not None:
            conf["UserID"] = user
        self.conf = self.home / "opendkim.conf"
        self.conf.write_text("".join(f"{k} {v}\n" for k, v in conf.items()))
        self.home.chmod(0o755)
        self.proc = subprocess.Popen([OPENDKIM, "-f", "-x", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        atexit.register(self.close)
        try:
            if socket == "unix":
                smtp_tools.wait_unix(self.socket_path, self.proc)
            else:
                smtp_tools.wait_port(self.port, self.proc)
        except BaseException:
            err = self.proc.stderr.read().decode(errors="replace")[-300:] if self.proc.poll() is not None else ""
            self.close()
            raise RuntimeError(f"opendkim did not start: {err}") from None

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc.poll() is None else []

    def close(self) -> None:
        atexit.unregister(self.close)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.home, ignore_errors=True)


_TAG = re.compile(rb"\b([a-z]+)=([^;]*)")


def signature_tags(message: bytes) -> dict[str, str] | None:
    """The tags of a message's first DKIM-Signature header (unfolded), or None without one."""
    match = re.search(rb"^DKIM-Signature:(.*?)\r?\n(?![ \t])", message, re.S | re.M | re.I)
    if match is None:
        return None
    value = re.sub(rb"\s+", b"", match.group(1))
    return {k.decode(): v.decode(errors="replace") for k, v in _TAG.findall(value)}


def verify(message: bytes, public_key: str) -> bool:
    """Whether the message's DKIM-Signature verifies (dkimpy) against this public half (the p= of its record)."""
    import dkim

    record = f"v=DKIM1; k=rsa; p={public_key}".encode()
    return bool(dkim.verify(message, dnsfunc=lambda _name, timeout=5: record))
