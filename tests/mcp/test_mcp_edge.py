"""MCP over HTTP behind the edge (issue 43, item 3; mailroom/http/edge.py), the real `mailroom mcp --http-port`.

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
