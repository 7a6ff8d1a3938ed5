"""A private Postfix instance as the reference peer of the benchmarks (issue 25).

`PostfixPeer(mode, ...)` writes main.cf and master.cf into a temporary config_directory (with its
own queue_directory and data_directory beside it), runs `postfix -c DIR check` (creates the queue
directories) and `postfix -c DIR start`; `close()` runs `postfix -c DIR stop` and kills the
master's process group by pid if it is still there. The system-wide instance (/etc/postfix) is
never read nor touched: every command gets `-c DIR`, the smtpd listens on a free 127.0.0.1 port
only, inet_interfaces is loopback-only, no chroot, mydestination is empty, there is no local
delivery, and DNS is off (the relay host is a bracketed IP address).

Two modes:

- "outbound": every message the private smtpd accepts goes to the hold queue
  (`check_recipient_access static:HOLD`); `release_and_drain()` runs `postsuper -H ALL` and
  `postqueue -f` and times until the queue is empty, while Postfix's smtp(8) client relays to
  `relay_port` (the same smtp-sink mailroom's sender drains to). Options (issue 37, item 2):
  `hold="header"` holds in cleanup(8) instead (header_checks `/^Subject:/ HOLD`), so mail injected by
  `sendmail()` (Postfix's sendmail(1) -> postdrop -> pickup, which smtpd's restrictions never see) is
  held too; `hold="none"` holds nothing (`pipeline()`: smtp-source -> smtpd -> queue -> smtp(8), timed
  whole); `milter="inet:127.0.0.1:PORT"` puts a milter (bench/opendkim_peer.py) in smtpd_milters and
  non_smtpd_milters (milter_default_action tempfail: a message the milter did not see is not
  accepted, never sent unsigned).
- "inbound": smtpd -> virtual(8) into one Maildir (virtual_mailbox_maps static:, owned by
  nobody); `count_delivered()` counts the files in its new/ directory.

`pids()` is the master's pid: its process tree (master, smtpd, cleanup, qmgr, smtp, virtual, ...)
is what bench.memory measures.

`available()` tells whether the binaries are there; the benchmarks then report
"skipped: postfix not installed" instead of failing. BENCH_KEEP_POSTFIX=1 keeps the instance's
directory (main.cf, master.cf, its maillog) after it stops, to read what it did.
"""

from __future__ import annotations

import atexit
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench import smtp_tools

POSTFIX = "/usr/sbin/postfix"
POSTSUPER = "/usr/sbin/postsuper"
POSTQUEUE = "/usr/sbin/postqueue"
SENDMAIL = "/usr/sbin/sendmail"
DAEMON_DIR = "/usr/lib/postfix/sbin"
QUEUES = ("maildrop", "incoming", "active", "deferred", "hold")

SKIPPED = "skipped: postfix not installed"


def available() -> bool:
    tools = (POSTFIX, POSTSUPER, POSTQUEUE, f"{DAEMON_DIR}/master", f"{DAEMON_DIR}/smtpd")
    return (all(os.access(p, os.X_OK) for p in tools) and smtp_tools.find("smtp-source") is not None
            and os.geteuid() == 0 and _uid("postfix") is not None)


def _uid(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


# name type private unpriv chroot wakeup maxproc command: chroot is off everywhere (the queue is
# in a temporary directory without the files a chroot needs).
_MASTER_CF = """\
127.0.0.1:{port} inet n - n - - smtpd
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
proxywrite unix -       -       n       -       1       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
virtual   unix  -       n       n       -       -       virtual
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
"""


class PostfixPeer:
    """A private Postfix instance under a temporary directory; see the module docstring."""

    def __init__(self, mode: str, relay_port: int | None = None, concurrency: int = 20, hold: str = "smtpd",
                 milter: str | None = None) -> None:
        if mode not in ("outbound", "inbound") or hold not in ("smtpd", "header", "none"):
            raise ValueError(mode)
        if not available():
            raise RuntimeError(SKIPPED)
        self.mode = mode
        self.home = Path(tempfile.mkdtemp(prefix="mailroom-bench-postfix-", dir="/tmp"))
        self.home.chmod(0o755)
        self.config = self.home / "etc"
        self.queue = self.home / "spool"
        self.data = self.home / "data"
        self.maildir_base = self.home / "vmail"
        self.maillog = self.home / "maillog"
        for d in (self.config, self.queue, self.data):
            d.mkdir()
        postfix_uid = _uid("postfix")
        os.chown(self.data, postfix_uid, pwd.getpwuid(postfix_uid).pw_gid)
        self.port = smtp_tools.free_port()
        self._started = False
        self._log_offset = 0
        self._sent = 0
        main = {
            "compatibility_level": "3.6",
            "config_directory": str(self.config),
            "queue_directory": str(self.queue),
            "data_directory": str(self.data),
            "daemon_directory": DAEMON_DIR,
            "meta_directory": "/etc/postfix",
            "mail_owner": "postfix",
            "setgid_group": "postdrop",
            "myhostname": "postfix-peer.bench.test",
            "mydomain": "bench.test",
            "myorigin": "$myhostname",
            "inet_interfaces": "loopback-only",
            "inet_protocols": "ipv4",
            "mydestination": "",
            "local_transport": "error:no local delivery",
            "alias_maps": "",
            "alias_database": "",
            "local_recipient_maps": "",
            "mynetworks": "127.0.0.0/8",
            "smtpd_peername_lookup": "no",
            "smtp_dns_support_level": "disabled",
            "smtpd_relay_restrictions": "permit_mynetworks, reject",
            "smtpd_tls_security_level": "none",
            "smtp_tls_security_level": "none",
            "biff": "no",
            "maillog_file": str(self.maillog),
            "maillog_file_prefixes": str(self.home),
            "default_destination_concurrency_limit": str(concurrency),
            "default_process_limit": "100",
            "queue_run_delay": "300s",
            "minimal_backoff_time": "300s",
            "delay_warning_time": "0",
            "message_size_limit": "10240000",
        }
        if mode == "outbound":
            if relay_port is None:
                raise ValueError("outbound mode needs relay_port")
            main |= {
                "relayhost": f"[127.0.0.1]:{relay_port}",
                "relay_domains": "",
                "smtpd_recipient_restrictions": ("check_recipient_access static:HOLD" if hold == "smtpd"
                                                 else "permit_mynetworks, reject"),
                "smtp_destination_concurrency_limit": str(concurrency),
            }
            if hold == "header":  # cleanup(8) holds whatever way the message came in
                (self.home / "hold_checks").write_text("/^Subject:/ HOLD\n")
                main["header_checks"] = f"regexp:{self.home / 'hold_checks'}"
            if milter is not None:
                main |= {"smtpd_milters": milter, "non_smtpd_milters": milter, "milter_protocol": "6",
                         "milter_default_action": "tempfail"}
        else:
            nobody = _uid("nobody") or 65534
            self.maildir_base.mkdir()
            os.chown(self.maildir_base, nobody, nobody)
            main |= {
                "virtual_mailbox_domains": "example.com",
                "virtual_mailbox_base": str(self.maildir_base),
                "virtual_mailbox_maps": "static:bench/",
                "virtual_uid_maps": f"static:{nobody}",
                "virtual_gid_maps": f"static:{nobody}",
                "virtual_minimum_uid": "1",
                "virtual_destination_concurrency_limit": str(concurrency),
                "smtpd_recipient_restrictions": "permit_mynetworks, reject",
            }
        (self.config / "main.cf").write_text("".join(f"{k} = {v}\n" for k, v in main.items()))
        (self.config / "master.cf").write_text(_MASTER_CF.format(port=self.port))
        atexit.register(self.close)
        try:
            self._postfix("check")
            self._started = True  # from here close() stops it, whatever start says
            self._postfix("start")
            smtp_tools.wait_port(self.port)
        except BaseException:
            self.close()
            raise

    # -- control -----------------------------------------------------------------------------
    def _postfix(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        # postfix(1) says why it failed on stderr only when that is a terminal (else to syslog): `script`
        # gives it one, so the reason reaches the exception
        argv = [POSTFIX, "-c", str(self.config), *args]
        if shutil.which("script"):
            argv = ["script", "-qec", shlex.join(argv), "/dev/null"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if check and out.returncode != 0:
            raise RuntimeError(f"postfix {' '.join(args)} failed: {(out.stderr or out.stdout).strip()[-400:]}"
                               f"{self._log_tail()}")
        return out

    def _log_tail(self) -> str:
        try:
            return "; maillog: " + self.maillog.read_text()[-400:]
        except OSError:
            return ""

    def _master_pid(self) -> int | None:
        try:
            return int((self.queue / "pid" / "master.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def pids(self) -> list[int]:
        """The master's pid (the root of every Postfix process of this instance), for bench.memory."""
        pid = self._master_pid()
        return [] if pid is None else [pid]

    def close(self) -> None:
        atexit.unregister(self.close)
        if not self._started:
            if self.home.exists() and not os.environ.get("BENCH_KEEP_POSTFIX"):
                shutil.rmtree(self.home, ignore_errors=True)
            return
        self._started = False
        pid = self._master_pid()
        self._postfix("stop", check=False)
        if pid is not None:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.1)
            if _alive(pid):
                try:  # the master and its children share the master's process group
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    os.kill(pid, signal.SIGKILL)
        if not os.environ.get("BENCH_KEEP_POSTFIX"):  # BENCH_KEEP_POSTFIX=1 keeps the directory to read
            shutil.rmtree(self.home, ignore_errors=True)

    # -- queue -------------------------------------------------------------------------------
    def queued(self, queues: tuple[str, ...] = QUEUES) -> int:
        total = 0
        for name in queues:
            for _root, _dirs, files in os.walk(self.queue / name):
                total += len(files)
        return total

    def sent(self) -> int:
        """Deliveries Postfix logged as sent (status=sent lines in its maillog so far). Reads only what
        was appended since the last call: the waits poll this at 20 Hz, and re-reading a maillog of
        tens of MB every time took CPU from the Postfix being timed."""
        try:
            with open(self.maillog, "rb") as log:
                log.seek(self._log_offset)
                chunk = log.read()
        except OSError:
            return self._sent
        complete = chunk.rfind(b"\n") + 1  # a line still being written is read whole next time
        self._sent += chunk.count(b"status=sent", 0, complete)
        self._log_offset += complete
        return self._sent

    def wait_held(self, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.queued(("hold",)) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.queued(('hold',))} of {n} messages on hold{self._log_tail()}")
            time.sleep(0.05)
        # pickup(8) removes a maildrop file (sendmail's) once cleanup(8) has written the queue file:
        # for a moment both are there
        deadline = time.monotonic() + 10
        while (have := self.queued()) != n and time.monotonic() < deadline:
            time.sleep(0.05)
        if have != n:
            raise RuntimeError(f"{have} messages queued, {n} expected (all on hold)")

    def release_and_drain(self, n: int, timeout: float = 600) -> float:
        """Seconds from `postsuper -H ALL` until the queue is empty and n more deliveries are logged."""
        before = self.sent()
        t0 = time.perf_counter()
        out = subprocess.run([POSTSUPER, "-c", str(self.config), "-H", "ALL"], capture_output=True, text=True,
                             timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"postsuper -H ALL failed: {out.stderr.strip()[-300:]}")
        out = subprocess.run([POSTQUEUE, "-c", str(self.config), "-f"], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"postqueue -f failed: {out.stderr.strip()[-300:]}")
        deadline = time.monotonic() + timeout
        while self.queued() > 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"postfix: {self.queued()} messages still queued after {timeout:.0f}s")
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
        # the log line may trail the queue file's removal by a moment
        deadline = time.monotonic() + 10
        while self.sent() - before < n and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.sent() - before != n:
            raise RuntimeError(f"postfix logged {self.sent() - before} deliveries of {n}{self._log_tail()}")
        return elapsed

    def sendmail(self, sender: str, recipients: list[str], message: bytes, verp: bool = False) -> None:
        """Inject one message with Postfix's sendmail(1) into this instance (-C its config directory):
        verp=True passes -XV (per-recipient return paths sender+rcpt=domain@..., default_verp_delimiters)."""
        argv = [SENDMAIL, "-C", str(self.config), *(["-XV"] if verp else []), "-f", sender, "-i", "--", *recipients]
        out = subprocess.run(argv, input=message, capture_output=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"sendmail failed ({out.returncode}): {out.stderr.decode(errors='replace')[-300:]}")

    def pipeline(self, n: int, sessions: int, size: int, sender: str, rcpt: str, timeout: float = 600) -> float:
        """Seconds from smtp-source's start (n messages, `sessions` sessions kept open) until the queue
        is empty and n more deliveries are logged: receiving (with the milter, if any), queueing and
        relaying, all timed (hold="none")."""
        before = self.sent()
        t0 = time.perf_counter()
        smtp_tools.smtp_source(self.port, sessions, n, size, sender, rcpt)
        deadline = time.monotonic() + timeout
        while self.queued() > 0 or self.sent() - before < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"postfix: {self.sent() - before} of {n} delivered after {timeout:.0f}s"
                                   f"{self._log_tail()}")
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
        if self.sent() - before != n:
            raise RuntimeError(f"postfix logged {self.sent() - before} deliveries of {n}{self._log_tail()}")
        return elapsed

    # -- inbound Maildir ---------------------------------------------------------------------
    @property
    def maildir_new(self) -> Path:
        return self.maildir_base / "bench" / "new"

    def count_delivered(self) -> int:
        try:
            return sum(1 for _ in os.scandir(self.maildir_new))
        except FileNotFoundError:
            return 0

    def clear_maildir(self) -> None:
        shutil.rmtree(self.maildir_base / "bench", ignore_errors=True)

    def inbound(self, sessions: int, n: int, size: int, timeout: float = 600, reuse: bool = True) -> float:
        """Seconds from smtp-source's start until all n messages are files in the Maildir's new/
        (reuse: smtp-source -d, sessions kept open; else a new session per message)."""
        self.clear_maildir()
        t0 = time.perf_counter()
        smtp_tools.smtp_source(self.port, sessions, n, size, "bench@example.com", "inbox@example.com", reuse)
        deadline = time.monotonic() + timeout
        while (have := self.count_delivered()) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"postfix: {have} of {n} messages in the Maildir after {timeout:.0f}s"
                                   f"{self._log_tail()}")
            time.sleep(0.05)  # a scandir of 10,000 names takes ~2 ms: polled at 20 Hz
        elapsed = time.perf_counter() - t0
        if have != n:
            raise RuntimeError(f"postfix: {have} messages in the Maildir, {n} sent")
        return elapsed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive for our purpose
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False
