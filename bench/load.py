"""Load held (issue 45, item 4): what one `mailroom run` (and `mailroom mcp --http-port` beside it) holds,
with figures, each scenario apart, on a throwaway cluster. Not part of `make test` nor CI: `make load`.

1. smtp: 1,000 SMTP sessions at once to the inbound server, from the source addresses 127.0.0.2 …
   127.0.0.9 (Linux routes all of 127/8 to lo), each sending one message to an inbox of one of several
   owners. Every session first connects and says EHLO; once all are open (or refused), all send. A session
   refused (421 at connect: --max-sessions, --max-sessions-per-client) is counted by its code and tried
   again a second later, as an MTA would, until its message is stored. Run twice: with the server's
   defaults, and with the caps raised (MAILROOM_INBOX_MAX_SESSIONS, _PER_CLIENT) so that 1,000 are held.
2. sse: 5,000 event streams (`GET /api/v1/mailboxes/{address}/events`) from 12 API keys (each under
   events.max_per_credential, the total under events.max_total: both counted per server process), each
   stream on an inbox of its own; once all are open, one message is delivered over SMTP to each inbox,
   and each stream must get its own as a `message` event.
3. mcp: 1,000 MCP `wait_for_message` calls (streamable HTTP, JSON-RPC POSTs held open) from 12 API keys,
   each on an inbox of its own; once the server holds them all (its mailroom_waits gauge), one message
   to each inbox, and each call must answer its own.
4. rest: REST clients at 200 requests/s for 60 s (open loop: a request every 5 ms, whatever the answers):
   list (50 %), read (30 %), wait (20 %: half answered at once, half held 2 s to their timeout, 408).

During each, another owner (an untouched API key, from 127.0.0.10, in a process of its own) calls `GET
…/messages` over REST and `list_inboxes` over MCP, 5 times a second each: their latency p50/p99 by phase
(ramp: the load arriving; hold: all held; deliver: the mail arriving; load: REST's 60 s). The servers'
memory is the summed Pss of each tree (bench/memory.py), idle before the load and at its peak; the CPU
seconds of the servers, of PostgreSQL and of this client (it competes on the same cores); the machine's
load average at start and end. Figures and findings: docs/reliability.md, "Load held". Nothing lost: every message stored once (by
its subject), every stream and wait answered its own message; every refusal by code.

    python -m bench.load [--only smtp sse mcp rest] [--scale 0.1] [--report FILE.json]

--scale shrinks every count (0.1: 100 sessions, 500 streams, 100 waits, 20 req/s for 6 s), for a look.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import json
import os
import re
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg

from bench import memory, smtp_tools

SOURCES = [f"127.0.0.{n}" for n in range(2, 10)]  # the load's client addresses
PROBE_SOURCE = "127.0.0.10"  # the untouched owner's
KEYS = 12
POSTMASTER: list[int] = []  # the cluster's postmaster (its CPU: its backends', exited ones included)
TTL_MINUTES = 240


def _ms(values: list[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    ordered = sorted(values)
    return statistics.median(ordered) * 1000, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


def _cpu_of(pids: list[int]) -> float:
    """utime + stime seconds of the processes of the trees of `pids` (alive ones, children waited for included)."""
    tick = os.sysconf("SC_CLK_TCK")
    scan = memory.processes()
    total = 0.0
    for root in pids:
        for pid in memory.tree(root, scan):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
    return total


def _nofile(pid: int) -> str:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return f"{soft}/{hard}"
    return "?"


# -- the servers ------------------------------------------------------------------------------------


class Servers:
    """`mailroom run` (inbound SMTP, HTTP face, every worker) and `mailroom mcp --http-port` on one database."""

    def __init__(self, worker_url: str, http_url: str, env: dict[str, str] | None = None) -> None:
        self.smtp_port = smtp_tools.free_port()
        self.http_port = smtp_tools.free_port()
        self.mcp_port = smtp_tools.free_port()
        self.mcp_metrics = smtp_tools.free_port()
        base = {k: v for k, v in os.environ.items() if not k.startswith(("MAILROOM_RUN_", "MAILROOM_SEND_",
                                                                          "MAILROOM_INBOX_", "MAILROOM_HTTP_"))}
        base |= {"PYTHONUNBUFFERED": "1", **(env or {})}
        self.logs = [Path(tempfile.mkstemp(prefix=f"load-{n}-", suffix=".log")[1]) for n in ("run", "mcp")]
        with open(self.logs[0], "w") as out:
            self.run = subprocess.Popen(
                [sys.executable, "-m", "mailroom", "run", "--inbox-port", str(self.smtp_port),
                 "--http-port", str(self.http_port)],
                env={**base, "MAILROOM_DATABASE_URL": worker_url}, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        with open(self.logs[1], "w") as out:
            self.mcp = subprocess.Popen(
                [sys.executable, "-m", "mailroom", "mcp", "--http-port", str(self.mcp_port),
                 "--metrics-port", str(self.mcp_metrics)],
                env={**base, "MAILROOM_DATABASE_URL": http_url}, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + 120
        while not ("running:" in self.logs[0].read_text(errors="replace")
                   and "serving (pid" in self.logs[1].read_text(errors="replace")):
            if self.run.poll() is not None or self.mcp.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the servers did not start:\n{self.log()}")
            time.sleep(0.1)

    def pids(self) -> list[int]:
        return [self.run.pid, self.mcp.pid]

    def waits_armed(self) -> int:
        """The MCP server's mailroom_waits{kind="wait"} (its --metrics-port)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.mcp_metrics}/metrics", timeout=5) as resp:  # noqa: S310
            text = resp.read().decode()
        match = re.search(r'^mailroom_waits\{kind="wait"\} ([\d.]+)', text, re.M)
        return int(float(match.group(1))) if match else 0

    def limits(self) -> dict[str, str]:
        """RLIMIT_NOFILE (soft/hard) of each server process, by name."""
        scan = memory.processes()
        out = {}
        for root in self.pids():
            for pid, (name, *_rest) in memory.tree(root, scan).items():
                with contextlib.suppress(OSError):
                    out[name] = _nofile(pid)
        return out

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-1500:] for p in self.logs)

    def tracebacks(self) -> str:
        return "\n".join(line for p in self.logs for line in p.read_text(errors="replace").splitlines()
                         if "Traceback" in line or "ERROR" in line or "error" in line.lower())

    def stop(self) -> None:
        for proc in (self.run, self.mcp):
            if proc.poll() is None:
                proc.terminate()
        for proc in (self.run, self.mcp):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()


# -- owners, keys, inboxes --------------------------------------------------------------------------


def make_key(conn: psycopg.Connection, owner: str) -> str:
    key = "mrk_" + secrets.token_urlsafe(32)
    conn.execute("SELECT mailroom.create_api_key(%s, %s, 'load', %s)",
                 (owner, hashlib.sha256(key.encode()).digest(), key[-4:]))
    return key


def make_inboxes(conn: psycopg.Connection, key: str, n: int, face: str = "rest") -> list[str]:
    rows = conn.execute("SELECT mailroom.http_create_mailbox(%s, NULL, %s, 'pro', %s) FROM generate_series(1, %s)",
                        (hashlib.sha256(key.encode()).digest(), TTL_MINUTES, face, n)).fetchall()
    return [doc["address"] for (doc,) in rows]


def deliver_sql(conn: psycopg.Connection, address: str, subject: str) -> int:
    return conn.execute("SELECT mailroom.deliver_message(%s, %s, 'app@example.org', %s, 'App <app@example.org>', %s)",
                        (address, f"Subject: {subject}\r\n\r\nbody".encode(), subject, "body")).fetchone()[0]


def stored(conn: psycopg.Connection, prefix: str) -> collections.Counter[str]:
    return collections.Counter(dict(conn.execute(
        "SELECT subject, count(*) FROM mailroom.messages WHERE subject LIKE %s GROUP BY subject",
        (prefix.replace("%", r"\%") + "%",)).fetchall()))


# -- the other owner's calls ------------------------------------------------------------------------


class Probe:
    """The untouched owner: REST GET …/messages and MCP list_inboxes, each 5 times a second, from a process
    of its own (`python -m bench.load --probe …`: the load's client loop, busy with thousands of sockets,
    must not delay its calls), each call a line (wall clock, call, seconds, outcome); binned here by the
    phase the load was in when the call started."""

    def __init__(self, servers: Servers, key: str, address: str) -> None:
        self.servers, self.key, self.address = servers, key, address
        self.phase = "idle"
        self._phases: list[tuple[float, str]] = [(0.0, "idle")]
        self._lines: list[dict] = []
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "phase" and "_phases" in self.__dict__:
            self._phases.append((time.time(), value))
        super().__setattr__(name, value)

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.load", "--probe", str(self.servers.http_port), str(self.servers.mcp_port),
             self.address], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self._proc.stdin.write(self.key + "\n")  # never on a command line
        self._proc.stdin.flush()

        def read() -> None:
            for line in self._proc.stdout:
                with contextlib.suppress(ValueError):
                    self._lines.append(json.loads(line))

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    async def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            await asyncio.to_thread(self._proc.wait)

    def reset(self) -> None:
        self._lines.clear()
        self._phases[:] = [(time.time(), self.phase)]

    def _phase_at(self, t: float) -> str:
        phase = self._phases[0][1]
        for since, name in self._phases:
            if since <= t:
                phase = name
        return phase

    def rows(self) -> tuple[list[dict], dict[str, int]]:
        samples: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        bad: collections.Counter[str] = collections.Counter()
        for line in list(self._lines):
            if line["t"] < self._phases[0][0]:
                continue
            if line["ok"] is True:
                samples[(line["kind"], self._phase_at(line["t"]))].append(line["s"])
            else:
                bad[f"{line['kind']} {line['ok']}"] += 1
        out = []
        for (kind, phase), values in sorted(samples.items(), key=lambda kv: (kv[0][0], _PHASES.index(kv[0][1]))):
            p50, p99 = _ms(values)
            out.append({"call": "REST GET …/messages" if kind == "rest" else "MCP list_inboxes", "phase": phase,
                        "n": len(values), "p50_ms": round(p50, 1), "p99_ms": round(p99, 1)})
        return out, dict(bad)


def probe_main(http_port: int, mcp_port: int, address: str) -> int:
    """The probe process: both calls 5 times a second each until terminated, a JSON line per call."""
    import httpx

    key = sys.stdin.readline().strip()

    async def loop(kind: str) -> None:
        transport = httpx.AsyncHTTPTransport(local_address=PROBE_SOURCE)
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "list_inboxes", "arguments": {}}}
        async with httpx.AsyncClient(transport=transport, headers={"Authorization": f"Bearer {key}"},
                                     timeout=60) as client:
            while True:
                t, started = time.time(), time.perf_counter()
                try:
                    if kind == "rest":
                        resp = await client.get(f"http://127.0.0.1:{http_port}/api/v1/mailboxes/{address}/messages")
                        ok: Any = resp.status_code == 200 or resp.status_code
                    else:
                        resp = await client.post(f"http://127.0.0.1:{mcp_port}/mcp", json=body,
                                                 headers={"Accept": "application/json, text/event-stream"})
                        ok = (resp.status_code == 200 and not resp.json()["result"].get("isError")) or resp.status_code
                except Exception as exc:  # noqa: BLE001 - a figure, not a failure of the probe
                    ok = type(exc).__name__
                took = time.perf_counter() - started
                print(json.dumps({"t": t, "kind": kind, "s": took, "ok": ok}), flush=True)
                await asyncio.sleep(max(0.2 - took, 0))

    async def both() -> None:
        await asyncio.gather(loop("rest"), loop("mcp"))

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(both())
    return 0


_PHASES = ["idle", "ramp", "hold", "deliver", "load"]


# -- a raw HTTP/1.1 client (thousands of held requests: httpx's per-connection cost would be the client's) --


async def _connect(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0), limit=1 << 20)


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status = int((await reader.readline()).split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def _body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    out = b""
    while (size := int((await reader.readline()).strip() or b"0", 16)) > 0:
        out += (await reader.readexactly(size + 2))[:-2]
    return out


def _code_of(status: int, body: bytes) -> str:
    found = re.search(rb"MR\d{3}", body)
    return f"{status} {found.group().decode() if found else ''}".strip()


# -- SMTP ------------------------------------------------------------------------------------------


async def _smtp_send(port: int, source: str, messages: list[tuple[str, str]], refusals: collections.Counter,
                     opened: asyncio.Event | None = None, go: asyncio.Event | None = None,
                     held: list[int] | None = None) -> int:
    """Send (recipient, subject) messages over one session (again, a second later, after a refusal): how
    many answered 250. With `opened`/`go`: the session counts itself in `held` once EHLO is answered and
    waits for `go` before it sends."""
    import aiosmtplib

    done = 0
    first = True
    while done < len(messages):
        client = aiosmtplib.SMTP(hostname="127.0.0.1", port=port, source_address=(source, 0), timeout=120,
                                 start_tls=False)
        try:
            await client.connect()
            await client.ehlo()
            if first and held is not None:
                held[0] += 1
                if opened is not None:
                    opened.set()
                await go.wait()
            while done < len(messages):
                rcpt, subject = messages[done]
                msg = (f"From: load@example.org\r\nTo: {rcpt}\r\nSubject: {subject}\r\n"
                       f"Message-ID: <{subject.replace(' ', '.')}@load.example>\r\n\r\nhello\r\n")
                await client.sendmail("load@example.org", [rcpt], msg.encode())
                done += 1
            with contextlib.suppress(Exception):
                await client.quit()
        except aiosmtplib.SMTPResponseException as exc:
            refusals[str(exc.code)] += 1
            with contextlib.suppress(Exception):
                client.close()
            await asyncio.sleep(1)
        except (aiosmtplib.SMTPException, OSError) as exc:
            refusals[type(exc).__name__] += 1
            with contextlib.suppress(Exception):
                client.close()
            await asyncio.sleep(1)
        finally:
            if first and held is not None and opened is not None:
                opened.set()
            first = False
    return done


async def deliver_smtp(port: int, items: list[tuple[str, str]], sessions: int,
                       refusals: collections.Counter) -> None:
    """Deliver (recipient, subject) items over `sessions` sessions at once, spread over SOURCES (at most
    8 a source: under --max-sessions-per-client 10)."""
    chunks = [items[i::sessions] for i in range(sessions)]
    await asyncio.gather(*(_smtp_send(port, SOURCES[i % len(SOURCES)], chunk, refusals)
                           for i, chunk in enumerate(chunks) if chunk))


# -- the scenarios ---------------------------------------------------------------------------------


class Scenario:
    """One scenario's measure: memory (idle, peak), CPU of the servers and the client, load average."""

    def __init__(self, name: str, servers: Servers, probe: Probe) -> None:
        self.name, self.servers, self.probe = name, servers, probe
        self.result: dict[str, Any] = {"scenario": name, "limits": servers.limits()}

    async def __aenter__(self) -> Scenario:
        await asyncio.sleep(3)
        scan = memory.processes()
        self.result["pss_idle_mib"] = round(sum(memory.total_mib(memory.tree(p, scan, memory.pss_kib))
                                                 for p in self.servers.pids()), 1)
        self.result["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
        self.peak = memory.Peak({"servers": self.servers.pids}, interval=0.5, reader=memory.pss_kib)
        self.peak.__enter__()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self._cpu = usage.ru_utime + usage.ru_stime
        self._server_cpu = _cpu_of(self.servers.pids())
        self._pg_cpu = _cpu_of(POSTMASTER)
        self._t0 = time.monotonic()
        self.probe.reset()
        self.probe.phase = "ramp"
        return self

    async def __aexit__(self, *exc: object) -> None:
        wall = time.monotonic() - self._t0
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.peak.__exit__()
        self.result["wall_s"] = round(wall, 1)
        self.result["client_cpu_s"] = round(usage.ru_utime + usage.ru_stime - self._cpu, 1)
        self.result["servers_cpu_s"] = round(_cpu_of(self.servers.pids()) - self._server_cpu, 1)
        self.result["postgres_cpu_s"] = round(_cpu_of(POSTMASTER) - self._pg_cpu, 1)
        self.result["pss_peak_mib"] = round(memory.total_mib(self.peak.peaks["servers"]), 1)
        self.result["pss_peak_by_process"] = memory.summary(self.peak.peaks["servers"])
        self.result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        self.probe.phase = "idle"
        await asyncio.sleep(0.5)  # the calls under way are answered
        self.result["other_owner"], self.result["other_owner_failures"] = self.probe.rows()


async def scenario_smtp(servers: Servers, probe: Probe, conn: psycopg.Connection, owners: list[list[str]],
                        sessions: int, label: str) -> dict:
    """`sessions` SMTP sessions at once, each one message to an inbox of one of the owners."""
    tag = f"load-smtp-{secrets.token_hex(3)}"
    inboxes = [box for boxes in owners for box in boxes]
    refusals: collections.Counter[str] = collections.Counter()
    async with Scenario(f"smtp ({label})", servers, probe) as sc:
        opened_all = asyncio.Event()
        go = asyncio.Event()
        held = [0]
        reported = [0]
        events = [asyncio.Event() for _ in range(sessions)]

        async def one(i: int) -> int:
            return await _smtp_send(servers.smtp_port, SOURCES[i % len(SOURCES)],
                                    [(inboxes[i % len(inboxes)], f"{tag} {i}")], refusals, events[i], go, held)

        tasks = [asyncio.ensure_future(one(i)) for i in range(sessions)]

        async def all_reported() -> None:
            for event in events:
                await event.wait()
                reported[0] += 1
            opened_all.set()

        started = time.monotonic()
        watcher = asyncio.ensure_future(all_reported())
        await opened_all.wait()
        watcher.cancel()
        sc.result["open_s"] = round(time.monotonic() - started, 1)
        sc.result["sessions_held_at_once"] = held[0]
        probe.phase = "hold"
        await asyncio.sleep(5)  # held, idle
        probe.phase = "deliver"
        started = time.monotonic()
        go.set()
        sent = await asyncio.gather(*tasks)
        sc.result["deliver_s"] = round(time.monotonic() - started, 1)
        await asyncio.sleep(1)
    counts = stored(conn, tag + " ")
    sc.result.update(sessions=sessions, answered_250=sum(sent), refusals=dict(refusals),
                     stored_once=sum(1 for v in counts.values() if v == 1),
                     stored_twice_or_more=sum(1 for v in counts.values() if v > 1),
                     missing=sessions - len(counts))
    return sc.result


async def _hold_then_deliver(sc: Scenario, probe: Probe, servers: Servers, plan: list, tag: str, tasks: list,
                             writers: list) -> collections.Counter[str]:
    """What the SSE and MCP scenarios do once everything is held: hold 10 s, then mail one message to each
    held stream or wait (48 SMTP sessions), then give their answers 60 s; the SMTP refusals met."""
    probe.phase = "hold"
    await asyncio.sleep(10)
    probe.phase = "deliver"
    started = time.monotonic()
    smtp_refusals: collections.Counter[str] = collections.Counter()
    await deliver_smtp(servers.smtp_port, [(address, f"{tag} {i}") for i, (_, address) in enumerate(plan)],
                       48, smtp_refusals)
    sc.result["deliver_s"] = round(time.monotonic() - started, 1)
    _, pending = await asyncio.wait(tasks, timeout=60)
    sc.result["all_answered_s"] = round(time.monotonic() - started, 1)
    for task in pending:
        task.cancel()
    for writer in writers:
        writer.close()
    return smtp_refusals


async def scenario_sse(servers: Servers, probe: Probe, conn: psycopg.Connection, keys: list[str],
                       boxes: list[list[str]], streams: int) -> dict:
    tag = f"load-sse-{secrets.token_hex(3)}"
    plan = [(keys[i % len(keys)], boxes[i % len(keys)][i // len(keys)]) for i in range(streams)]
    refusals: collections.Counter[str] = collections.Counter()
    got: dict[int, str] = {}
    opened = [0]
    opening = asyncio.Semaphore(100)  # streams being opened at once (each first reads its inbox in SQL)
    writers: list[asyncio.StreamWriter] = []

    async def stream(i: int, key: str, address: str, ready: asyncio.Event) -> None:
        await opening.acquire()  # given back once the stream is open (its `mailbox` event) or over
        holding = True
        try:
            reader, writer = await _connect(servers.http_port, SOURCES[i % len(SOURCES)])
            writers.append(writer)
            writer.write(f"GET /api/v1/mailboxes/{address}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n".encode())
            status, headers = await _head(reader)
            if status != 200:
                refusals[_code_of(status, await _body(reader, headers))] += 1
                return
            buffer = b""
            while True:
                size = int((await reader.readline()).strip() or b"0", 16)
                if size == 0:
                    refusals["stream ended"] += 1
                    return
                buffer += (await reader.readexactly(size + 2))[:-2]
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    fields = dict(line.split(": ", 1) for line in event.decode().splitlines()
                                  if ": " in line and not line.startswith(":"))
                    if fields.get("event") == "mailbox" and holding:
                        holding = False
                        opening.release()
                        opened[0] += 1
                        ready.set()
                    elif fields.get("event") == "message":
                        got[i] = json.loads(fields["data"])["subject"]
                        return
                    elif fields.get("event") == "closed":
                        refusals["closed " + json.loads(fields["data"])["error"]["code"]] += 1
                        return
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            refusals[type(exc).__name__] += 1
        finally:
            if holding:
                opening.release()
            ready.set()

    async with Scenario("sse", servers, probe) as sc:
        readies = [asyncio.Event() for _ in range(streams)]
        tasks = [asyncio.ensure_future(stream(i, key, address, readies[i])) for i, (key, address) in enumerate(plan)]
        started = time.monotonic()
        for ready in readies:
            await ready.wait()
        sc.result["open_s"] = round(time.monotonic() - started, 1)
        sc.result["streams_open"] = opened[0]
        smtp_refusals = await _hold_then_deliver(sc, probe, servers, plan, tag, tasks, writers)
    counts = stored(conn, tag + " ")
    right = sum(1 for i, subject in got.items() if subject == f"{tag} {i}")
    sc.result.update(streams=streams, keys=len(keys), refusals=dict(refusals), smtp_refusals=dict(smtp_refusals),
                     streams_got_their_message=right, streams_without=streams - right,
                     stored_once=sum(1 for v in counts.values() if v == 1),
                     stored_twice_or_more=sum(1 for v in counts.values() if v > 1), missing=streams - len(counts))
    return sc.result


async def scenario_mcp(servers: Servers, probe: Probe, conn: psycopg.Connection, keys: list[str],
                       boxes: list[list[str]], waits: int) -> dict:
    tag = f"load-mcp-{secrets.token_hex(3)}"
    plan = [(keys[i % len(keys)], boxes[i % len(keys)][i // len(keys)]) for i in range(waits)]
    refusals: collections.Counter[str] = collections.Counter()
    got: dict[int, str] = {}
    writers: list[asyncio.StreamWriter] = []

    async def wait(i: int, key: str, address: str) -> None:
        body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
            "name": "wait_for_message", "arguments": {"address": address, "timeout_seconds": 240}}}).encode()
        try:
            reader, writer = await _connect(servers.mcp_port, SOURCES[i % len(SOURCES)])
            writers.append(writer)
            writer.write(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{servers.mcp_port}\r\nAuthorization: Bearer {key}\r\n"
                         "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            status, headers = await _head(reader)
            data = await _body(reader, headers)
            if status != 200:
                refusals[_code_of(status, data)] += 1
                return
            result = json.loads(data)["result"]
            text = result["content"][0]["text"]
            if result.get("isError"):
                refusals[_code_of(status, text.encode())] += 1
                return
            got[i] = json.loads(text)["subject"]
        except (OSError, asyncio.IncompleteReadError, ValueError, KeyError) as exc:
            refusals[type(exc).__name__] += 1

    async with Scenario("mcp", servers, probe) as sc:
        started = time.monotonic()
        tasks = []
        for i, (key, address) in enumerate(plan):
            tasks.append(asyncio.ensure_future(wait(i, key, address)))
            if i % 50 == 49:
                await asyncio.sleep(0.05)
        while (armed := await asyncio.to_thread(servers.waits_armed)) + sum(refusals.values()) < waits:
            if time.monotonic() - started > 120:
                break
            await asyncio.sleep(0.2)
        sc.result["arm_s"] = round(time.monotonic() - started, 1)
        sc.result["waits_held"] = armed
        smtp_refusals = await _hold_then_deliver(sc, probe, servers, plan, tag, tasks, writers)
    counts = stored(conn, tag + " ")
    right = sum(1 for i, subject in got.items() if subject == f"{tag} {i}")
    sc.result.update(waits=waits, keys=len(keys), refusals=dict(refusals), smtp_refusals=dict(smtp_refusals),
                     waits_got_their_message=right, waits_without=waits - right,
                     stored_once=sum(1 for v in counts.values() if v == 1),
                     stored_twice_or_more=sum(1 for v in counts.values() if v > 1), missing=waits - len(counts))
    return sc.result


class _KeepAlive:
    """One kept-alive HTTP/1.1 connection from a source address, requests one after another."""

    def __init__(self, port: int, source: str) -> None:
        self.port, self.source = port, source
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def get(self, path: str, key: str) -> tuple[int, bytes]:
        try:
            if self.conn is None:
                self.conn = await _connect(self.port, self.source)
            reader, writer = self.conn
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\r\n".encode())
            status, headers = await _head(reader)
            body = await _body(reader, headers)
            if headers.get("connection", "").lower() == "close":
                self.close()
            return status, body
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.conn[1].close()
            self.conn = None


async def scenario_rest(servers: Servers, probe: Probe, conn: psycopg.Connection, keys: list[str],
                        boxes: list[list[str]], rate: float, seconds: float) -> dict:
    """Open loop: a request due every 1/rate s whatever the answers, taken by the first free one of 12
    kept-alive connections per source address (raw HTTP/1.1: an HTTP library's own CPU per request would
    be what limits the rate on 2 cores); latency from when it was due (queueing included)."""
    targets = []  # (key, address, [ids]): each key's inboxes hold 20 messages
    for key, addresses in zip(keys, boxes, strict=True):
        for address in addresses:
            ids = [deliver_sql(conn, address, f"rest {n}") for n in range(20)]
            targets.append((key, address, ids))
    statuses: collections.Counter[str] = collections.Counter()
    latency: dict[str, list[float]] = collections.defaultdict(list)
    due: asyncio.Queue = asyncio.Queue()
    base = "/api/v1/mailboxes"

    async def worker(client: _KeepAlive) -> None:
        while True:
            n, at = await due.get()
            key, address, ids = targets[n % len(targets)]
            kind = ("list", "list", "list", "list", "list", "read", "read", "read", "wait", "wait held")[n % 10]
            path = {"list": f"{base}/{address}/messages", "read": f"{base}/{address}/messages/{ids[n % 20]}",
                    "wait": f"{base}/{address}/wait?after={ids[0]}&timeout=5",
                    "wait held": f"{base}/{address}/wait?after={ids[-1]}&timeout=2"}[kind]
            try:
                status, body = await client.get(path, key)
                code = _code_of(status, body) if status >= 400 else str(status)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                code = type(exc).__name__
            statuses[f"{kind} {code}"] += 1
            latency[kind].append(time.monotonic() - at)
            due.task_done()

    clients = [_KeepAlive(servers.http_port, source) for source in SOURCES for _ in range(12)]
    async with Scenario("rest", servers, probe) as sc:
        probe.phase = "load"
        workers = [asyncio.ensure_future(worker(client)) for client in clients]
        started = time.monotonic()
        n = 0
        while (elapsed := time.monotonic() - started) < seconds:
            while n < elapsed * rate:
                due.put_nowait((n, started + n / rate))
                n += 1
            await asyncio.sleep(0.002)
        sc.result["behind_at_end"] = due.qsize()
        await due.join()
        for task in workers:
            task.cancel()
        for client in clients:
            client.close()
        sc.result["sent"] = n
        sc.result["rate_per_s"] = round(n / seconds, 1)
    sc.result["statuses"] = dict(sorted(statuses.items()))
    sc.result["latency_ms"] = {kind: dict(zip(("p50", "p99"), (round(x, 1) for x in _ms(values)), strict=True))
                               for kind, values in sorted(latency.items())}
    return sc.result


# -- the run ---------------------------------------------------------------------------------------


def _markdown(results: list[dict]) -> str:
    lines = []
    for r in results:
        lines.append(f"### {r['scenario']}\n")
        lines.append("| figure | value |\n|---|---|")
        for name, value in r.items():
            if name in ("scenario", "other_owner"):
                continue
            lines.append(f"| {name} | {value} |")
        lines.append("\n| other owner's call | phase | calls | p50 ms | p99 ms |\n|---|---|---|---|---|")
        for row in r["other_owner"]:
            lines.append(f"| {row['call']} | {row['phase']} | {row['n']} | {row['p50_ms']} | {row['p99_ms']} |")
        lines.append("")
    return "\n".join(lines)


async def _main(args: argparse.Namespace, worker_url: str, http_url: str, su_url: str) -> list[dict]:
    conn = psycopg.connect(su_url, autocommit=True)
    conn.execute("SELECT mailroom.set_setting('http.create_limit', '1000000')")
    scale = args.scale
    n_smtp, n_sse, n_mcp = int(1000 * scale), int(5000 * scale), int(1000 * scale)
    owners = [make_key(conn, f"load-{n}") for n in range(KEYS)]
    probe_key = make_key(conn, "load-other")
    probe_box = make_inboxes(conn, probe_key, 1)[0]
    make_inboxes(conn, probe_key, 2, "mcp")
    for n in range(5):
        deliver_sql(conn, probe_box, f"other {n}")
    results = []

    async def with_servers(env: dict[str, str] | None, work: Any) -> dict:
        servers = await asyncio.to_thread(Servers, worker_url, http_url, env)
        probe = Probe(servers, probe_key, probe_box)
        probe.start()
        try:
            result = await work(servers, probe)
            result["server_errors"] = servers.tracebacks()[-2000:]
            return result
        finally:
            await probe.stop()
            await asyncio.to_thread(servers.stop)

    if "smtp" in args.only:
        boxes = [make_inboxes(conn, key, 10) for key in owners[:6]]
        results.append(await with_servers(None, lambda s, p: scenario_smtp(s, p, conn, boxes, n_smtp, "defaults")))
        print(_markdown(results[-1:]), flush=True)
        raised = {"MAILROOM_INBOX_MAX_SESSIONS": str(n_smtp + 100),
                  "MAILROOM_INBOX_MAX_SESSIONS_PER_CLIENT": str(n_smtp // len(SOURCES) + 10)}
        results.append(await with_servers(raised, lambda s, p: scenario_smtp(
            s, p, conn, boxes, n_smtp, f"--max-sessions {raised['MAILROOM_INBOX_MAX_SESSIONS']}, "
                                       f"--max-sessions-per-client {raised['MAILROOM_INBOX_MAX_SESSIONS_PER_CLIENT']}")))
        print(_markdown(results[-1:]), flush=True)
    if "sse" in args.only:
        per_key = -(-n_sse // KEYS)
        boxes = [make_inboxes(conn, key, per_key) for key in owners]
        results.append(await with_servers(None, lambda s, p: scenario_sse(s, p, conn, owners, boxes, n_sse)))
        print(_markdown(results[-1:]), flush=True)
    if "mcp" in args.only:
        per_key = -(-n_mcp // KEYS)
        boxes = [make_inboxes(conn, key, per_key, "mcp") for key in owners]
        results.append(await with_servers(None, lambda s, p: scenario_mcp(s, p, conn, owners, boxes, n_mcp)))
        print(_markdown(results[-1:]), flush=True)
    if "rest" in args.only:
        boxes = [make_inboxes(conn, key, 5) for key in owners[:8]]
        results.append(await with_servers(None, lambda s, p: scenario_rest(
            s, p, conn, owners[:8], boxes, 200 * scale, max(60 * scale, 5))))
        print(_markdown(results[-1:]), flush=True)
    conn.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=("smtp", "sse", "mcp", "rest"),
                        default=["smtp", "sse", "mcp", "rest"])
    parser.add_argument("--scale", type=float, default=1.0, help="every count times this (default 1)")
    parser.add_argument("--report", help="write the figures here as JSON")
    parser.add_argument("--probe", nargs=3, metavar=("HTTP_PORT", "MCP_PORT", "ADDRESS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        return probe_main(int(args.probe[0]), int(args.probe[1]), args.probe[2])
    # the client holds thousands of sockets: its soft limit up to its hard one
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    need = int(5000 * args.scale) + 500
    if hard < need:
        print(f"RLIMIT_NOFILE hard limit {hard} < {need}: raise it (ulimit -Hn) for this scale", file=sys.stderr)
        return 2
    from mailroom import testing

    print(f"machine: {os.cpu_count()} cores, {os.uname().release}; ulimit -n {soft}/{hard} (client raised to "
          f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}); load average {os.getloadavg()}", flush=True)
    cluster = testing.start_cluster("mailroom-load-")
    try:
        url = testing.migrated_database(cluster, "load")
        POSTMASTER.append(int((cluster.pgdata / "postmaster.pid").read_text().split()[0]))
        results = asyncio.run(_main(args, testing.as_login(url, "mr_worker"), testing.as_login(url, "mr_http"), url))
    finally:
        testing.stop_cluster(cluster)
    if args.report:
        Path(args.report).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
