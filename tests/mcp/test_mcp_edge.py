"""MCP over HTTP behind the edge (issue 43, item 3; mailroom/api/edge.py), the real `mailroom mcp --http-port`.

- A JSON body nested 200,000 levels deep (under 1 MiB) with any Bearer string is 400 (MR033), not a
  RecursionError, a 500 and a traceback.
- A body over the endpoint's bound (1 MiB) is 413 (MR030) before the key is looked at.
- No key at all is 401 with MR240 and its words (SQL's, as REST answers it), not the SQLSTATE 28000.
Every refusal is the REST ErrorResponse (`detail` and `error`).
"""

from __future__ import annotations

import httpx

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _post(mcp_http, body: bytes, headers: dict[str, str]) -> httpx.Response:  # noqa: ANN001
    return httpx.post(f"http://127.0.0.1:{mcp_http.port}/mcp", content=body, headers={**HEADERS, **headers},
                      timeout=30)


def test_json_nested_200000_deep_is_400_not_a_traceback(mcp_http) -> None:
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    assert len(body) < 1024 * 1024
    response = _post(mcp_http, body, {"Authorization": "Bearer anything"})
    assert response.status_code == 400, response.text
    doc = response.json()
    assert doc["error"]["code"] == "MR033" and doc["detail"] == doc["error"]["message"], doc
    assert "Traceback" not in mcp_http.log() and "RecursionError" not in mcp_http.log()


def test_a_body_over_the_bound_is_413_before_the_key(mcp_http) -> None:
    response = _post(mcp_http, b" " * (1024 * 1024 + 1), {})
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "MR030"


def test_no_key_is_401_with_mr240(mcp_http) -> None:
    response = _post(mcp_http, b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}', {})
    assert response.status_code == 401 and response.headers["www-authenticate"].startswith("Bearer")
    doc = response.json()
    assert doc["error"] == {"code": "MR240", "kind": "denied", "message": "credentials required: an API key"}, doc
    assert doc["detail"] == "credentials required: an API key"


def _rpc(mcp_http, api_key: str, method: str, params: dict | None = None) -> dict:  # noqa: ANN001
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    response = httpx.post(f"http://127.0.0.1:{mcp_http.port}/mcp", json=message, timeout=30,
                          headers={**HEADERS, "Authorization": f"Bearer {api_key}"})
    assert response.status_code == 200, response.text
    return response.json()["result"]


def test_server_info_names_mailrooms_version(mcp_http, api_key) -> None:
    from mailroom import __version__

    result = _rpc(mcp_http, api_key, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                                   "clientInfo": {"name": "test", "version": "1"}})
    assert result["serverInfo"] == {"name": "mailroom", "version": __version__} | \
        {k: v for k, v in result["serverInfo"].items() if k not in ("name", "version")}


def test_tool_descriptions_speak_of_what_mcp_has(mcp_http, api_key) -> None:
    tools = {t["name"]: t["description"] for t in _rpc(mcp_http, api_key, "tools/list")["tools"]}
    assert not [name for name, text in tools.items() if "session token" in text], tools
    extend = tools["extend_inbox"]
    mr202 = extend[extend.index("MR202"):].split(";")[0]
    assert "seconds" in mr202, mr202


def test_stdio_with_a_wrong_key_exits_2_before_serving(db_url) -> None:
    import subprocess
    import sys

    from mcp_support import mailroom_env

    args = ("mcp",)
    proc = subprocess.run([sys.executable, "-m", "mailroom", *args], input=b"", capture_output=True, timeout=60,
                          env=mailroom_env(db_url, args, {"MAILROOM_MCP_API_KEY": "mrk_not-a-key"}))
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.decode()
    assert "MAILROOM_MCP_API_KEY" in err and "MR241" in err and "Traceback" not in err, err
    assert "mrk_not-a-key" not in err


def test_extract_codes_description_lists_a_bad_pattern(mcp_http, api_key) -> None:
    tools = {t["name"]: t["description"] for t in _rpc(mcp_http, api_key, "tools/list")["tools"]}
    assert "MR010" in tools["extract_code"] and "MR034" in tools["extract_code"], tools["extract_code"]
    assert "MR011" in tools["extract_link"], tools["extract_link"]


def test_a_resource_error_is_its_own_words(mcp_http, api_key) -> None:
    message = {"jsonrpc": "2.0", "id": 1, "method": "resources/read",
               "params": {"uri": "mailroom://inbox/nobody@example.com"}}
    response = httpx.post(f"http://127.0.0.1:{mcp_http.port}/mcp", json=message, timeout=30,
                          headers={**HEADERS, "Authorization": f"Bearer {api_key}"})
    error = response.json()["error"]
    assert error["message"].startswith("MR203: "), error
