"""The HTTP face: requests per second and p50/p99 latency of the real `mailroom http serve` under
Debian's `wrk`, next to the same SQL call through pgbench in the same run (the ratio is what the
HTTP layer costs: FastAPI, uvicorn, the pool and one round trip).

1. GET /api/v1/mailboxes/{address}/messages (an inbox of 20 messages, the first page) vs pgbench
   running `SELECT mailroom.http_list_messages(…)` with as many clients.
2. GET /api/v1/mailboxes/{address}/wait answered at once (a matching message is there: the long
   poll's look after a wake-up) vs pgbench running `SELECT mailroom.http_wait_look(…)`.
3. POST /api/v1/mailboxes (an anonymous inbox each, the rate limit set out of the way) vs pgbench
   running `SELECT mailroom.http_create_mailbox(…)`.
All with 16 connections / clients; the server with --workers 2 (the machine's cores).
4. MCP: the `list_messages` tool called over streamable HTTP (`mailroom mcp --http-port`, one
   JSON-RPC POST at a time on a kept-alive connection) vs its SQL call alone (`http_list_messages` on one connection): medians,
   and the difference, what the MCP layer adds to a call.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psycopg

from bench import memory
from mailroom.db import cluster as embedded

AREA = "http"
CONNECTIONS = 16


class Cpu:
    """CPU seconds spent, between start() and stop(), by the server and its workers, the cluster's
    postmaster and backends, and this process's waited children (wrk, pgbench)."""

    def __init__(self, url: str, server: int) -> None:
        with psycopg.connect(url) as conn:
            data = conn.execute("SHOW data_directory").fetchone()[0]
        self.postmaster = int(Path(data, "postmaster.pid").read_text().split()[0])
        self.server = server

    def _now(self) -> tuple[float, float, float]:
        scan = memory.processes()
        server = sum(memory.cpu_seconds(pid) for pid in memory.descendants(self.server, scan))
        # the backends alive now, and through the postmaster's reaped children those that ended
        pg = sum(memory.cpu_seconds(pid, reaped=pid == self.postmaster)
                 for pid in memory.descendants(self.postmaster, scan))
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return server, pg, kids.ru_utime + kids.ru_stime

    def start(self) -> None:
        self.began = self._now()

    def stop(self, requests: float) -> tuple[float, float, float]:
        """µs per request: (server, PostgreSQL, load generator)."""
        ended = self._now()
        return tuple(1e6 * (b - a) / requests for a, b in zip(self.began, ended, strict=True))


def _row(benchmark: str, value: float, unit: str, note: str) -> dict:
    return {"area": AREA, "benchmark": benchmark, "value": value, "unit": unit, "note": note}


def _start(url: str, env: dict[str, str]) -> tuple[subprocess.Popen, int, Path]:
    log_path = Path(tempfile.mkstemp(prefix="bench-http-", suffix=".log")[1])
    argv = [sys.executable, "-m", "mailroom", "http", "serve", "--port", "0", "--workers", "2", "--pool-size", "8",
            "--database-url", url]
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = log_path.read_text()
        match = re.search(r"listening on 127\.0\.0\.1:(\d+)", text)
        if match and text.count("serving (pid") >= 2:
            return proc, int(match.group(1)), log_path
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"http server did not start: {log_path.read_text()[-300:]}")


def _ms(value: str, unit: str) -> float:
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def _wrk(url: str, seconds: int, headers: dict[str, str],
         script: str | None = None) -> tuple[float, float, float, int]:
    """requests/s, p50 ms, p99 ms, requests of wrk (2 threads, CONNECTIONS connections)."""
    exe = shutil.which("wrk")
    if exe is None:
        raise RuntimeError("wrk not found: apt-get install wrk")
    argv = [exe, "-t2", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency"]
    for name, value in headers.items():
        argv += ["-H", f"{name}: {value}"]
    path = None
    if script:
        path = Path(tempfile.mkstemp(suffix=".lua")[1])
        path.write_text(script)
        argv += ["-s", str(path)]
    out = subprocess.run([*argv, url], capture_output=True, text=True, timeout=seconds + 60)
    if path:
        path.unlink(missing_ok=True)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out.stdout)
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out.stdout)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out.stdout)
    if out.returncode != 0 or not (rate and p50 and p99):
        raise RuntimeError(f"wrk failed: {(out.stderr or out.stdout).strip()[-200:]}")
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out.stdout)
    if errors:
        raise RuntimeError(f"wrk saw {errors.group(1)} error responses")
    total = re.search(r"(\d+) requests in", out.stdout)
    return float(rate.group(1)), _ms(*p50.groups()), _ms(*p99.groups()), int(total.group(1))


def _pgbench(url: str, sql: str, seconds: int) -> tuple[float, float, int]:
    """tps, average latency (ms) and transactions of pgbench with CONNECTIONS clients running one statement."""
    path = Path(tempfile.mkstemp(suffix=".sql")[1])
    path.write_text(sql + "\n")
    path.chmod(0o644)
    exe = shutil.which("pgbench") or str(embedded.find_bindir() / "pgbench")
    out = subprocess.run([exe, "-n", "-c", str(CONNECTIONS), "-j", "2", "-T", str(seconds), "-f", str(path), url],
                         capture_output=True, text=True, timeout=seconds + 60)
    path.unlink(missing_ok=True)
    tps = re.search(r"tps = ([\d.]+)", out.stdout)
    latency = re.search(r"latency average = ([\d.]+) ms", out.stdout)
    if out.returncode != 0 or not tps or not latency:
        raise RuntimeError(f"pgbench failed: {out.stderr.strip()[-200:]}")
    done = re.search(r"number of transactions actually processed: (\d+)", out.stdout)
    return float(tps.group(1)), float(latency.group(1)), int(done.group(1))


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def run(url: str, quick: bool, progress: Callable[[str], None]) -> list[dict]:
    seconds = 3 if quick else 10
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT mailroom.set_setting('http.create_limit', '1000000')")
        doc = conn.execute("SELECT mailroom.http_create_mailbox(null, 'bench', 60)").fetchone()[0]
        address, token = doc["address"], doc["session_token"]
        for n in range(20):
            conn.execute("SELECT mailroom.deliver_message(%s, %s, 'app@example.org', %s, 'App <app@example.org>', %s)",
                         (address, f"Subject: message {n}\r\n\r\nbody".encode(), f"message {n}", "body " * 50))
    from mailroom.testing import as_login

    auth = {"Authorization": f"Bearer {token}"}
    messages = f"/api/v1/mailboxes/{address}/messages"
    cases = [  # (what, path, headers, wrk script, the same SQL call, its name)
        ("GET /api/v1/mailboxes/{address}/messages (20 messages)", messages, auth, None,
         f"SELECT mailroom.http_list_messages({_literal(address)}, {_literal(token)}, NULL);", "http_list_messages"),
        ("GET /api/v1/mailboxes/{address}/wait (answered at once)",
         f"/api/v1/mailboxes/{address}/wait?subject=message%25&timeout=5", auth, None,
         f"SELECT mailroom.http_wait_look({_literal(address)}, {_literal(token)}, NULL, 'message%', NULL, false);",
         "http_wait_look"),
        ("POST /api/v1/mailboxes (anonymous inbox)", "/api/v1/mailboxes", {}, 'wrk.method = "POST"\n',
         "SELECT mailroom.http_create_mailbox(NULL, 'bench-pgbench');", "http_create_mailbox"),
    ]
    rows: list[dict] = []
    for fast in (True, False):  # the fast paths off: GET …/messages only (issue 46 item 2: "off and on")
        env = {} if fast else {"MAILROOM_FAST_PATHS": "off"}
        proc, port, log_path = _start(as_login(url, "mr_http"), env)  # the server's own least-privilege role
        try:
            base = f"http://127.0.0.1:{port}"
            probe = urllib.request.Request(f"{base}{messages}", headers=auth)
            with urllib.request.urlopen(probe, timeout=10) as resp:  # noqa: S310 - 127.0.0.1
                assert len(json.loads(resp.read())) == 20
            cpu = Cpu(url, proc.pid)
            for what, path, headers, script, sql, name in cases if fast else cases[:1]:
                label = what if fast else f"{what}, fast paths off (MAILROOM_FAST_PATHS=off)"
                progress(f"{label}: wrk {seconds}s, {CONNECTIONS} connections")
                cpu.start()
                rate, p50, p99, requests = _wrk(f"{base}{path}", seconds, headers, script=script)
                served = cpu.stop(requests)
                progress("the same call through pgbench")
                cpu.start()
                tps, avg, calls = _pgbench(url, sql, seconds)
                called = cpu.stop(calls)
                rows.append(_row(f"{label}, wrk {CONNECTIONS} conn", rate, "req/s",
                                 f"p50 {p50:.2f} ms, p99 {p99:.2f} ms; {rate / tps:.2f}× the pgbench line below"))
                rows.append(_row(f"same SQL call ({name}) through pgbench, {CONNECTIONS} clients", tps, "tx/s",
                                 f"latency average {avg:.2f} ms"))
                rows.append(_cpu_row(label, served, called, tps))
        finally:
            memory.stop_server(proc, log_path, timeout=15)
    progress("MCP: list_messages over streamable HTTP vs its SQL call")
    rows += _mcp_rows(url, 100 if quick else 400)
    return rows


def _cpu_row(label: str, served: tuple[float, float, float], called: tuple[float, float, float], tps: float) -> dict:
    """The CPU a request costs above its SQL call (issue 46 item 2): the server's, PostgreSQL's and the load
    generator's, against pgbench's; the budget the 0.8× goal leaves on this machine's cores; the ratio the
    machine would reach with the server's CPU taken out (CPU-bound: rate = cores / CPU per request)."""
    server, pg, wrk = served
    pg_b, bench = called[1], called[2]
    cores = os.cpu_count() or 1
    budget = 1e6 * cores / (0.8 * tps) - pg - wrk  # µs of server CPU per request the goal allows
    without = (pg_b + bench) / (pg + wrk)
    return _row(f"{label}: server CPU per request", round(server), "µs",
                f"PostgreSQL {pg:.0f} µs and wrk {wrk:.0f} µs a request; pgbench's call: PostgreSQL {pg_b:.0f} µs,"
                f" pgbench {bench:.0f} µs; the 0.8× goal leaves the server {budget:.0f} µs a request on {cores} cores;"
                f" with the server's CPU taken out the ratio would be {without:.2f}×")


def _mcp_rows(url: str, calls: int) -> list[dict]:
    """Median latency of the `list_messages` tool over MCP (20 messages) and of its SQL call alone."""
    import httpx

    from mailroom.api.operations import BY_NAME
    from mailroom.testing import as_login

    key = "mrk_" + secrets.token_urlsafe(32)
    digest = hashlib.sha256(key.encode()).digest()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT mailroom.create_api_key('bench-mcp', %s, 'bench', %s)", (digest, key[-4:]))
        address = conn.execute("SELECT mailroom.http_create_mailbox(%s, NULL, p_face => 'mcp')",
                               (digest,)).fetchone()[0]["address"]
        for n in range(20):
            conn.execute("SELECT mailroom.deliver_message(%s, %s, 'app@example.org', %s, 'App <app@example.org>', %s)",
                         (address, f"Subject: message {n}\r\n\r\nbody".encode(), f"message {n}", "body " * 50))
    login = as_login(url, "mr_http")
    log_path = Path(tempfile.mkstemp(prefix="bench-mcp-", suffix=".log")[1])
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([sys.executable, "-m", "mailroom", "mcp", "--http-port", "0", "--database-url", login],
                                stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 30
        while not (match := re.search(r"listening on 127\.0\.0\.1:(\d+)", log_path.read_text())):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mailroom mcp did not start: {log_path.read_text()[-300:]}")
            time.sleep(0.1)
        port = int(match.group(1))

        async def tool_calls() -> list[float]:
            # the tool call as it travels: one JSON-RPC POST on a kept-alive connection (the server is
            # stateless: no session to open), the answer read whole; no client SDK's own work counted
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "list_messages", "arguments": {"address": address}}}
            headers = {"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"}
            async with httpx.AsyncClient(headers=headers, timeout=30) as client:
                times = []
                for n in range(calls + 10):
                    started = time.perf_counter()
                    resp = await client.post(f"http://127.0.0.1:{port}/mcp", json=body)
                    times.append(time.perf_counter() - started)
                    if n == 0:
                        text = resp.text
                        data = json.loads(text[text.index("{"):text.rindex("}") + 1])
                        assert resp.status_code == 200 and not data["result"].get("isError"), text[:300]
                        assert len(json.loads(data["result"]["content"][0]["text"])) == 20  # REST's array
                return times[10:]

        async def sql_calls() -> list[float]:
            async with await psycopg.AsyncConnection.connect(login, autocommit=True) as conn:
                times = []
                for _ in range(calls + 10):
                    started = time.perf_counter()
                    await BY_NAME["list_messages"].sql.avalue(conn, address=address, session_token=None, key_digest=digest,
                                                                  limit=20)
                    times.append(time.perf_counter() - started)
                return times[10:]

        tool, sql = [], []
        for _ in range(4):  # interleaved: the machine's load moves both alike
            tool += asyncio.run(tool_calls())
            sql += asyncio.run(sql_calls())
    finally:
        memory.stop_server(proc, log_path, timeout=15)
    tool_ms, sql_ms = statistics.median(tool) * 1000, statistics.median(sql) * 1000
    return [
        _row("MCP tool call list_messages (20 messages), streamable HTTP POST, 1 client", tool_ms, "ms",
             f"median of {len(tool)}; {tool_ms - sql_ms:+.2f} ms over the SQL call below"),
        _row("same SQL call (http_list_messages) on one connection", sql_ms, "ms", f"median of {len(sql)}"),
    ]
