"""POSTs to the dashboard with Authorization: Bearer $PCG_UPLOAD_TOKEN: a request report to URL/api/requests
(`pcgh request --submit URL`), a nightly's run with its cells to URL/api/runs (`pcgh nightly --upload URL`).

Plain urllib (no extra dependency). A request's body is its report (schema.RequestReport) plus the raw config
under "config", so the dashboard can show and re-analyze what was asked for.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from pcg_core.errors import ConfigError

TOKEN_ENV = "PCG_UPLOAD_TOKEN"
ENDPOINT = "/api/requests"
RUNS_ENDPOINT = "/api/runs"
TIMEOUT_S = 30


def endpoint(url: str, path: str = ENDPOINT, flag: str = "--submit") -> str:
    """URL + path, after checking URL is an http(s) URL with a host."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"{flag} {url!r} is not an http(s) URL; pass the dashboard's base URL, e.g. https://pcg.example.com")
    return url.rstrip("/") + path


def token(flag: str = "--submit") -> str:
    value = os.environ.get(TOKEN_ENV, "").strip()
    if not value:
        raise ConfigError(f"{flag} needs the dashboard's token in ${TOKEN_ENV}; export {TOKEN_ENV}=<token> and run again")
    return value


def submit(url: str, body: dict[str, Any], *, bearer: str | None = None, timeout: float = TIMEOUT_S,
           path: str = ENDPOINT, flag: str = "--submit") -> dict[str, Any]:
    """POST `body` as JSON to URL + path; {"url", "status", "response"} (response: the parsed JSON answer, or its
    text). Every failure is a ConfigError naming `flag`, the target and what to check."""
    target = endpoint(url, path, flag)
    bearer = bearer if bearer is not None else token(flag)
    data = json.dumps(body, allow_nan=False, default=_iso).encode("utf-8")
    req = urllib.request.Request(target, data=data, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json", "Authorization": f"Bearer {bearer}",
        "User-Agent": "pcgh"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, text = resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace").strip()[:300]
        hint = f"check ${TOKEN_ENV}" if e.code in (401, 403) else "check the URL and the dashboard's log"
        raise ConfigError(f"{flag} {target}: the dashboard answered HTTP {e.code} {e.reason}"
                          + (f" ({detail})" if detail else "") + f"; {hint}") from e
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(f"{flag} {target}: cannot reach the dashboard ({reason}); check the URL and that it is running") from e
    try:
        response: Any = json.loads(text) if text.strip() else None
    except json.JSONDecodeError:
        response = text[:1000]
    return {"url": target, "status": status, "response": response}


def _iso(value: Any) -> str:
    """JSON for the datetimes of a run (started_at, finished_at)."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")
