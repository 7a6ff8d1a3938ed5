"""Helpers of the MCP tests: the SDK's own clients over stdio and streamable HTTP, mail over real SMTP."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import aiosmtplib
import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from mailroom import testing


def mailroom_env(db_url: str, args: tuple[str, ...], extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of `mailroom ARGS`: its database URL as the command's test login (mcp: mr_http)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAILROOM_")}
    env.update(PYTHONUNBUFFERED="1", MAILROOM_DATABASE_URL=db_url, **(extra or {}))
    return testing.driver_env(env, args)


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


@contextlib.asynccontextmanager
async def stdio_session(env: dict[str, str], errlog: Any = None) -> AsyncIterator[ClientSession]:
    """`mailroom mcp` as a subprocess on stdio, driven by the SDK's client (as Claude Desktop runs it)."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "mailroom", "mcp"], env=env)
    async with stdio_client(params, errlog=errlog or sys.stderr) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def http_session(port: int, key: str | None) -> AsyncIterator[ClientSession]:
    """The SDK's streamable HTTP client on `mailroom mcp --http-port`, with `Authorization: Bearer KEY`."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=120)) as client, \
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=client) as (read, write, _), \
            ClientSession(read, write) as session:
        await session.initialize()
        yield session


def doc(result: CallToolResult) -> Any:
    """A tool's answer as JSON; a tool error fails the test with its text."""
    assert not result.isError, result.content[0].text
    return json.loads(result.content[0].text)


def error(result: CallToolResult) -> dict[str, str]:
    """A tool error's {code, kind, message} (and its text says the code first)."""
    assert result.isError, result.content[0].text
    err = result.structuredContent["error"]
    assert result.content[0].text.startswith(f"{err['code']}: "), result.content[0].text
    return err


async def send_mail(port: int, to: str, subject: str, text: str) -> None:
    """One message through the real inbound SMTP server (`mailroom inbox serve`)."""
    message = EmailMessage()
    message["From"] = "Signup <noreply@app.example.org>"
    message["To"] = to
    message["Subject"] = subject
    message.set_content(text)
    async with aiosmtplib.SMTP(hostname="127.0.0.1", port=port, timeout=15) as smtp:
        await smtp.send_message(message)
