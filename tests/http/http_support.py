"""Helpers of the HTTP tests: the real `mailroom http serve` as a subprocess, and a small HTTP client."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error_code(self) -> str:
        return self.json()["error"]["code"]


@dataclass
class HttpServer:
    base: str
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def request(self, method: str, path: str, *, token: str | None = None, headers: dict[str, str] | None = None,
                body: bytes | dict | None = None, timeout: float = 15) -> Response:
        return request(method, self.base + path, token=token, headers=headers, body=body, timeout=timeout)


def request(method: str, url: str, *, token: str | None = None, headers: dict[str, str] | None = None,
            body: bytes | dict | None = None, timeout: float = 15) -> Response:
    all_headers = dict(headers or {})
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    if isinstance(body, dict):
        body = json.dumps(body).encode()
        all_headers.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=body, method=method, headers=all_headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - 127.0.0.1 only
            return Response(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
    except urllib.error.HTTPError as err:
        return Response(err.code, {k.lower(): v for k, v in err.headers.items()}, err.read())


def wait_for_log(path: Path, pattern: str, proc: subprocess.Popen, timeout: float = 20) -> re.Match:
    deadline = time.monotonic() + timeout
    rx = re.compile(pattern)
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        match = rx.search(text)
        if match:
            return match
        if proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode}: {text}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {pattern!r} in: {path.read_text() if path.exists() else ''}")


def start_http(popen: Any, log_path: Path, *args: str, env: dict[str, str] | None = None) -> HttpServer:
    """`mailroom http serve --port 0 …` started with `popen` (the cli_popen fixture); ready when it serves."""
    log_file = open(log_path, "w")  # noqa: SIM115 - the child writes to it
    proc = popen("http", "serve", "--host", "127.0.0.1", "--port", "0", *args, env=env,
                 stdout=subprocess.DEVNULL, stderr=log_file)
    log_file.close()
    port = wait_for_log(log_path, r"listening on 127\.0\.0\.1:(\d+)", proc).group(1)
    wait_for_log(log_path, r"serving \(pid", proc)
    return HttpServer(f"http://127.0.0.1:{port}", proc, log_path)


class EventStream:
    """A Server-Sent Events client on a raw socket read (urllib buffers): events as (name, data)."""

    def __init__(self, url: str, token: str | None, timeout: float = 10) -> None:
        headers = {"Accept": "text/event-stream"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        self.resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)  # noqa: S310
        self.buffer = ""

    def next_event(self, name: str, timeout: float = 10) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while "\n\n" in self.buffer:
                block, self.buffer = self.buffer.split("\n\n", 1)
                fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
                if fields.get("event") == name:
                    return json.loads(fields["data"])
            line = self.resp.fp.readline()
            if not line:
                raise AssertionError("the event stream ended")
            self.buffer += line.decode()
        raise AssertionError(f"no {name} event within {timeout}s")

    def close(self) -> None:
        self.resp.close()
