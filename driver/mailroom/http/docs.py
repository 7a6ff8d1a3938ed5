"""`/docs`: the API's Swagger UI, served from a package, never from a CDN.

The page, its script and its style come from this server (Swagger UI as the `fastapi-offline` package
ships it), so `/docs` works offline and on a network that reaches no CDN, and it runs under a
Content-Security-Policy with no inline script and `frame-ancestors 'none'` (it shares its origin
with the inbox pages' cookies). Every other response of the API carries a CSP of its own through
`SecurityHeaders` (a JSON document needs none of a page's powers).
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response

DOCS_CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; font-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
API_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'; sandbox"

# name -> media type: the only files served (nothing else of the package is reachable)
_STATIC = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css", "favicon.png": "image/png"}

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>mailroom HTTP API</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="/docs/static/favicon.png"><link rel="stylesheet" href="/docs/static/swagger-ui.css">
</head><body><div id="swagger-ui"></div>
<script src="/docs/static/swagger-ui-bundle.js"></script><script src="/docs/init.js"></script>
</body></html>
"""

_INIT = """window.ui = SwaggerUIBundle({
  url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis], layout: "BaseLayout"
});
"""


def _headers(csp: str, cache: str = "no-cache") -> dict[str, str]:
    return {"Content-Security-Policy": csp, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
            "Cache-Control": cache}


def add_routes(app: FastAPI) -> None:
    static = resources.files("fastapi_offline") / "static"
    files = {name: (static / name).read_bytes() for name in _STATIC}  # read once: a few MB, served often

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Response:
        return HTMLResponse(_PAGE, headers=_headers(DOCS_CSP))

    @app.get("/docs/init.js", include_in_schema=False)
    async def docs_init() -> Response:
        return Response(_INIT, media_type="text/javascript", headers=_headers(DOCS_CSP))

    @app.get("/docs/static/{name}", include_in_schema=False)
    async def docs_static(name: str) -> Response:
        if name not in files:
            return Response(status_code=404, headers=_headers(API_CSP))
        return Response(files[name], media_type=_STATIC[name], headers=_headers(DOCS_CSP, "public, max-age=86400"))


class SecurityHeaders:
    """Pure ASGI middleware: every HTTP response gets a CSP (API_CSP unless the route set its own),
    `X-Content-Type-Options: nosniff` and `X-Frame-Options: DENY`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                for name, value in ((b"content-security-policy", API_CSP), (b"x-content-type-options", "nosniff"),
                                    (b"x-frame-options", "DENY")):
                    if name not in names:
                        headers.append((name, value.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
