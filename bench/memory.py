"""Resident memory (VmRSS of /proc/<pid>/status) of a process tree, idle and under load (issue 37, item 8).

- tree(pid): {pid: (name, VmRSS KiB, RssAnon KiB)} for pid and every descendant (parent links of
  /proc/*/stat); the name is `mailroom <command>` for a mailroom process, else the kernel's comm
  (smtpd, qmgr, ...). VmRSS counts shared pages (libraries, the interpreter) in every process that
  maps them; RssAnon is the process's own anonymous memory, the fairer sum over many processes.
- Peak({group: roots}): a thread sampling the trees of each group every 250 ms (one /proc scan per
  sample) until stopped; `.peaks[group]` is the sample whose summed VmRSS was the largest (processes
  alive together at one moment: a sum over every process ever seen would add up short-lived
  cleanup/virtual/smtpd processes that never ran at once).
- by_name(): sums per process name (master, smtpd, cleanup, mailroom send, ...).
- summary(): one line, "name xN total MiB (max M MiB)" per name.
- descendants(pid), cpu_seconds(pid): a process tree's members, and a process's CPU seconds (the
  HTTP and inboxes areas' CPU a request or message); stop_server(): ends a server those areas started.
- pss_kib(pid): (Pss, Anonymous) of /proc/<pid>/smaps_rollup, the metric agreed for issues 43-47
  (docs/architecture.md, "Memory, measured one way"): a page shared by n processes counts 1/n in
  each, so the sum over a tree is what the tree really holds. tree(), Peak and the sums take it as
  `reader` (the default stays VmRSS for the older rows).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterable
from pathlib import Path


def _stat_text(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    text = _stat_text(pid)
    if text is None:
        return None
    name = text[text.index("(") + 1:text.rindex(")")]
    return name, int(text.rsplit(")", 1)[1].split()[1])


def cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    """User + system CPU seconds of one process so far (/proc/<pid>/stat; 0 once gone); with reaped, those
    of the children it has waited for too (a postmaster's ended backends: its cutime and cstime)."""
    text = _stat_text(pid)
    if text is None:
        return 0.0
    fields = text.rsplit(")", 1)[1].split()  # from the third field (state) on
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def label(pid: int, comm: str) -> str:
    """`mailroom <command>` for a mailroom process (from its command line: python -m mailroom inbox serve
    ..., or the console script), else the kernel's comm (master, smtpd, qmgr, ...). A worker `mailroom run`
    forked is named by its comm, `mr <command>` (mailroom.core.supervisor.comm_of): its command line is run's."""
    if comm.startswith("mr "):
        return "mailroom " + comm[3:]
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return comm
    for i, arg in enumerate(args):
        if arg == "mailroom" and i > 0 and args[i - 1] == "-m" or arg.endswith("/mailroom") and i <= 1:
            words = []
            for word in args[i + 1:]:
                if not word or word.startswith("-") or len(words) == 2:
                    break
                words.append(word)
            if words and words[0] in ("inbox", "http", "mcp", "db"):
                words = words[:2]
            else:
                words = words[:1]
            return " ".join(["mailroom", *words])
    if any(a.endswith("inbox_serve_lines") for a in args):
        return "bench.inbox_serve_lines"
    if any("multiprocessing.resource_tracker" in a for a in args):
        return "multiprocessing resource tracker"
    if any("multiprocessing.spawn" in a for a in args) or "--multiprocessing-fork" in args:
        return "multiprocessing child"
    return comm


def rss_kib(pid: int) -> tuple[int, int] | None:
    """(VmRSS, RssAnon) in KiB; (0, 0) for a zombie or kernel thread, None once gone."""
    found = {"VmRSS:": 0, "RssAnon:": 0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key = line.split(None, 1)[0] if line else ""
            if key in found:
                found[key] = int(line.split()[1])
    except OSError:
        return None
    return found["VmRSS:"], found["RssAnon:"]


def pss_kib(pid: int) -> tuple[int, int] | None:
    """(Pss, Anonymous) in KiB from /proc/<pid>/smaps_rollup; (0, 0) for a zombie or kernel thread, None
    once gone (or not readable: another user's process)."""
    found = {"Pss:": 0, "Anonymous:": 0}
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None if not Path(f"/proc/{pid}").exists() else (0, 0)
    for line in text.splitlines():
        key = line.split(None, 1)[0] if line else ""
        if key in found:
            found[key] = int(line.split()[1])
    return found["Pss:"], found["Anonymous:"]


Reader = Callable[[int], "tuple[int, int] | None"]


def processes() -> tuple[dict[int, str], dict[int, int]]:
    """One scan of /proc: ({pid: comm}, {pid: parent pid})."""
    names: dict[int, str] = {}
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                names[int(entry)], parents[int(entry)] = stat
    return names, parents


def descendants(root: int, scan: tuple[dict[int, str], dict[int, int]] | None = None) -> set[int]:
    """root and every process below it (empty once root is gone), from one scan of /proc."""
    names, parents = scan or processes()
    members = {root} if root in names else set()
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in members and pid not in members:
                members.add(pid)
                grew = True
    return members


def tree(root: int, scan: tuple[dict[int, str], dict[int, int]] | None = None,
         reader: Reader = rss_kib) -> dict[int, tuple[str, int, int]]:
    """{pid: (name, first, second)} of root and its descendants: (VmRSS, RssAnon) KiB by default,
    (Pss, Anonymous) with reader=pss_kib."""
    names, parents = scan or processes()
    members = descendants(root, (names, parents))
    labels = {pid: label(pid, names[pid]) for pid in members}
    out = {}
    for pid in members:
        rss = reader(pid)
        if rss is not None:
            name = labels[pid]
            if name.startswith("multiprocessing") and parents[pid] in labels:  # whose helper it is
                name = f"{labels[parents[pid]]}: {name}"
            out[pid] = (name, *rss)
    return out


Procs = dict[int, tuple[str, int, int]]


def by_name(procs: Procs) -> dict[str, tuple[int, int, int, int]]:
    """{name: (count, VmRSS total KiB, VmRSS max KiB, RssAnon total KiB)}."""
    out: dict[str, tuple[int, int, int, int]] = {}
    for name, rss, anon in procs.values():
        n, total, top, anons = out.get(name, (0, 0, 0, 0))
        out[name] = (n + 1, total + rss, max(top, rss), anons + anon)
    return out


def summary(procs: Procs) -> str:
    """ "name xN VmRSS MiB (max M) [anon A]" per name, largest first, then the RssAnon total."""
    parts = [f"{name} x{n} {total / 1024:.1f} MiB" + (f" (max {top / 1024:.1f})" if n > 1 else "")
             + f" [anon {anon / 1024:.1f}]"
             for name, (n, total, top, anon) in sorted(by_name(procs).items(), key=lambda kv: -kv[1][1])]
    if not parts:
        return "no process"
    return ", ".join(parts) + f"; RssAnon total {anon_mib(procs):.1f} MiB"


def total_mib(procs: Procs) -> float:
    """Summed VmRSS, MiB."""
    return sum(p[1] for p in procs.values()) / 1024


def anon_mib(procs: Procs) -> float:
    """Summed RssAnon, MiB."""
    return sum(p[2] for p in procs.values()) / 1024


class Peak:
    """Samples, every `interval` s, the process trees of each group's roots (`groups[name]()` is called
    each time: processes come and go), from one scan of /proc per sample (the sampler itself must
    not load a 2-core machine); `.peaks[name]` is that group's sample with the largest summed VmRSS."""

    def __init__(self, groups: dict[str, Callable[[], Iterable[int]]], interval: float = 0.25,
                 reader: Reader = rss_kib) -> None:
        self.groups = groups
        self.reader = reader
        self.interval = interval
        self.peaks: dict[str, Procs] = {name: {} for name in groups}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        scan = processes()
        for group, roots in self.groups.items():
            now = {pid: p for root in list(roots()) for pid, p in tree(root, scan, self.reader).items()}
            if total_mib(now) >= total_mib(self.peaks[group]):
                self.peaks[group] = now

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> Peak:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def stop_server(proc: subprocess.Popen, log_path: Path, timeout: float) -> None:
    """A server process a bench area started (its stderr in log_path): SIGTERM, then SIGKILL after
    `timeout` seconds; its log removed."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
    log_path.unlink(missing_ok=True)
