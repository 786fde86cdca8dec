"""What every request passes before a route: the upload guard and the security headers (ASGI middlewares).

The upload guard refuses an upload before a byte of its body is read when its token is wrong, when it does
not say how long it is, or when it is longer than the server takes.

FastAPI reads and parses a request body before it runs the route's dependencies, so a token check there comes
after a stranger's 30 MB has been read and parsed, while every other request waits. This ASGI middleware
answers from the headers alone, and holds a body it lets through to the length it declared.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pcg_core.errors import ConfigError
from web.deps import CSP, upload_refusal

DEFAULT_MAX_BYTES = 64 * 2**20  # a nightly's 504 cells with their logs (each kept to 200,000 characters) fit


def max_bytes_from_env() -> int:
    """$PCG_UPLOAD_MAX_MB (MiB) as bytes, else DEFAULT_MAX_BYTES."""
    text = os.environ.get("PCG_UPLOAD_MAX_MB", "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        mb = float(text)
    except ValueError:
        mb = math.nan
    if not (math.isfinite(mb) and mb > 0):
        raise ConfigError(f"PCG_UPLOAD_MAX_MB={text!r}: give a positive number of MiB (default {DEFAULT_MAX_BYTES >> 20})")
    return int(mb * 2**20)


class UploadGuard:
    """Guards requests with a body (POST, PUT, PATCH) under `prefix`."""

    def __init__(self, app: ASGIApp, max_bytes: int = DEFAULT_MAX_BYTES, prefix: str = "/api/") -> None:
        self.app, self.max_bytes, self.prefix = app, max_bytes, prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH") or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = upload_refusal(scope["app"].state.upload_token, headers.get("authorization"))
        if refusal is not None:
            await _answer(send, 401, refusal, {"www-authenticate": "Bearer"})
            return
        length = headers.get("content-length", "")
        if not length.isdigit():
            await _answer(send, 411, "send Content-Length: uploads must say how long they are")
            return
        if int(length) > self.max_bytes:
            await _answer(send, 413, f"the body is {int(length)} bytes; this server takes at most {self.max_bytes} "
                                     "(split the upload, or raise PCG_UPLOAD_MAX_MB)")
            return
        await self.app(scope, _capped(receive, int(length)), send)


def _capped(receive: Receive, limit: int) -> Receive:
    """Ends the body where its declared length ends: a client that sends more is cut off there."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                return {"type": "http.disconnect"}
        return message

    return wrapped


async def _answer(send: Send, status: int, detail: str, extra: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers: list[tuple[bytes, bytes]] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    start: dict[str, Any] = {"type": "http.response.start", "status": status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})


# /docs is the one page that runs scripts: Swagger UI from our own files plus FastAPI's inline start-up script,
# talking to this origin only.
DOCS_CSP = ("default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; connect-src 'self'; base-uri 'none'; frame-ancestors 'none'")


class SecurityHeaders:
    """Every response says nosniff and sends no referrer; one without a CSP of its own (JSON, badges, static
    files, /docs) gets the strict one (DOCS_CSP for /docs), so no route can ship without."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = (DOCS_CSP if scope["path"] == "/docs" else CSP).encode()

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                headers += [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]
                if b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", csp))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
