"""Every reach into a library's private internals is listed, pinned and guarded (issue 43, item 4;
docs/architecture.md, "Private internals, each guarded").

- The driver's source is scanned (ast) for a private name of another package: an attribute `x._y` on
  anything but self/cls, a `from pkg._mod import`, an imported `_name`, a getattr/hasattr of "_name".
  Each file where one stands must be a place of the table in docs/architecture.md, so a new one cannot
  come in without its row (its library, pin and guard test).
- Each library the table reaches into has an upper bound in pyproject.toml (a bump is a decision).
- The guards of the places no other test file covers: typer's vendored click, the usage-line patch of
  core/options.py, the codec check of inboxes/mime.py.
No database, no subprocess.
"""

from __future__ import annotations

import ast
import codecs
import re
import tomllib
from pathlib import Path

import typer
import typer.core

import mailroom
from mailroom import cli

ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(mailroom.__file__).parent
TABLE_TITLE = "**Private internals, each guarded"

# private names that are mailroom's own (a method of another mailroom class) or documented public API
OWN_OR_PUBLIC = {"_asdict", "_exit", "_fields", "_deliver_group", "_deliver_alone"}
# the libraries the table reaches into, with the name pyproject.toml lists them by
PINNED = ("psycopg[binary,pool]", "typer", "aiosmtplib", "aiosmtpd", "starlette", "dkimpy", "mcp")


def _private_reaches(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")) \
                    and node.attr not in OWN_OR_PUBLIC:
                found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and not node.module.startswith(("mailroom", "__future__")):
            if any(p.startswith("_") for p in node.module.split(".")):
                found.append(f"{node.lineno}: from {node.module}")
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_") \
                and not str(node.args[1].value).startswith("__"):
            found.append(f"{node.lineno}: {node.func.id} {node.args[1].value}")
    return found


def _table() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index(TABLE_TITLE)
    return text[start:text.index("\n\n", text.index("\n|", start))]


def test_every_file_reaching_into_private_internals_is_a_place_of_the_table():
    table = _table()
    missing = {}
    for path in sorted(DRIVER.rglob("*.py")):
        reaches = _private_reaches(path)
        if reaches and f"`{path.relative_to(DRIVER).as_posix()}" not in table:
            missing[path.relative_to(DRIVER).as_posix()] = reaches
    assert missing == {}, f"private internals reached outside docs/architecture.md's table: {missing}"


def test_every_library_of_the_table_has_an_upper_bound():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for name in PINNED:
        spec = next((d for d in deps if re.match(re.escape(name) + r"\s*[<>=!~]", d)), None)
        assert spec is not None, f"{name} is not a dependency"
        assert "<" in spec, f"{spec!r}: a library whose internals the driver reaches needs an upper bound"
        assert f"`{name.split('[')[0]}" in _table(), f"{name} is pinned for a place the table does not list"


def test_cli_catches_the_click_exceptions_typer_raises():
    """cli.click_impl is typer's vendored click (typer._click): main() catches its exceptions; on a typer
    that raised another click's, a usage error would end in a traceback."""
    assert issubclass(typer.BadParameter, cli.click_impl.exceptions.UsageError)


def test_the_usage_line_patch_is_applied():
    """core/options.py replaces TyperArgument._usage_display_name and display_type_rich (the usage line
    writes ADDRESS, not typer's {ADDRESS}): on a typer without them it would silently do nothing."""
    import mailroom.core.options  # noqa: F401 - applies the patch at import

    argument = typer.core.TyperArgument
    for name in ("_usage_display_name", "display_type_rich"):
        assert "_plain_argument_names" in getattr(argument, name).__qualname__, name


def test_a_bytes_to_bytes_codec_is_no_charset():
    """inboxes/mime.py refuses a codec that is not a text encoding through CodecInfo._is_text_encoding."""
    from mailroom.inboxes import mime

    assert codecs.lookup("hex")._is_text_encoding is False
    assert mime._codec("hex") is None and mime._codec("base64") is None
    assert mime._codec("utf-8") == "utf-8"


def test_mcp_server_reaches_one_private_name_for_its_version():
    """mcp/server.py's fast path (_FastCalls) stands on the SDK's public API (mcp.types, the Tool objects
    given to FastMCP's constructor, FastMCP.list_tools(), TransportSecurityMiddleware): the one private name
    left is FastMCP's `_mcp_server`, once, for serverInfo.version (FastMCP's constructor takes none)."""
    reaches = _private_reaches(DRIVER / "mcp" / "server.py")
    assert [r.split(": ", 1)[1] for r in reaches] == ["._mcp_server"], reaches
    line = (DRIVER / "mcp" / "server.py").read_text().splitlines()[int(reaches[0].split(":")[0]) - 1]
    assert line.strip().startswith("server._mcp_server.version = __version__"), line


def test_mcp_server_info_names_mailrooms_version():
    """build() sets serverInfo.version through FastMCP's private `_mcp_server` (docs/architecture.md's
    table): on an SDK where that attribute no longer reaches the initialize answer, the SDK's own version
    would be announced, silently. The SDK's own client on its in-memory transport, no database."""
    import asyncio

    from mcp.shared.memory import create_connected_server_and_client_session

    from mailroom.mcp.server import Backend, McpConfig, build

    server = build(Backend(McpConfig(database_url="host=/nonexistent dbname=none")), errors={})

    async def initialize() -> object:
        async with create_connected_server_and_client_session(server) as session:
            return await session.initialize()

    result = asyncio.run(initialize())
    assert (result.serverInfo.name, result.serverInfo.version) == ("mailroom", mailroom.__version__)
