"""What every router takes from the app: the Store, the templates, and the upload token check.

The app holds one Store for its lifetime; routers get it per request through `Depends(get_store)`, so tests and
`python -m web` differ only in the URL given to create_app. Templates run with autoescape on for every file
(not just *.html), and every page goes out with a Content Security Policy that allows our own CSS and nothing
else: no scripts at all, so even a log that slipped past escaping could not run.
"""

from __future__ import annotations

import gc
import gzip
import json
import secrets
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import jinja2
from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from pydantic import BaseModel
from starlette.responses import Response

from harness.reports.json_report import jsonable
from harness.reports.run_info import fmt_duration
from harness.reports.stats import fmt_rate, fmt_speedup
from harness.store import Store
from web import present

HERE = Path(__file__).parent
# Bounds of the query parameters every page and API route shares (a value past them is a 422 naming it).
MAX_LIMIT = 10_000  # runs listed at once
MAX_PAGE = 100_000  # a page number of the matrix (past the last page shows the last)
MAX_THRESHOLD = 100.0  # a relative change; past 100× nothing is left to report
CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; script-src 'none'; form-action 'self'; "
       "base-uri 'none'; frame-ancestors 'none'")


def _fmt_time(v: datetime | str | None) -> str:
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M UTC")
    return "n/a" if v is None else str(v)


def _as_text(v: Any) -> str:
    """A metric value as a reader expects it: nested values as the API's JSON (jsonable: NaN as null), not
    Python's repr; a scalar as str."""
    return json.dumps(jsonable(v), ensure_ascii=False) if isinstance(v, (dict, list, tuple)) else str(v)


def _finalize(v: Any) -> Any:
    """Every value a template prints, with lone surrogates replaced (present.scrub); Markup stays Markup."""
    if isinstance(v, Markup):
        return Markup(present.scrub(str(v)))
    return present.scrub(v) if isinstance(v, str) else v


def _make_templates() -> Jinja2Templates:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                             finalize=_finalize)
    env.filters.update(rate=fmt_rate, speedup=fmt_speedup, duration=fmt_duration, when=_fmt_time, as_text=_as_text)
    env.globals.update(css_class=present.css_class)
    return Jinja2Templates(env=env)


templates = _make_templates()


# pcg_core has the same guard for graph capture; importing it would import torch, so the dashboard keeps its own.
@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while a big page is built.

    A 10,000-cell matrix makes ~200,000 objects that live until the response is sent, and each full collection
    they trigger walks every object on the heap, which made the matrix page slower and its time erratic. Any
    garbage made meanwhile is collected as usual afterwards. Left as found if the collector was already off.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def get_store(request: Request) -> Store:
    return request.app.state.store


StoreDep = Annotated[Store, Depends(get_store)]


def render(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> Response:
    """A page from web/templates, with the CSP header."""
    response = templates.TemplateResponse(request, name, context, status_code=status_code)
    response.headers["Content-Security-Policy"] = CSP
    return response


_bearer = HTTPBearer(auto_error=False, description="the server's upload token (create_app arg or $PCG_UPLOAD_TOKEN)")


def upload_refusal(expected: str | None, authorization: str | None) -> str | None:
    """Why an upload with this Authorization header is refused, or None when its bearer token matches.

    The one check: web.guard runs it before any body is read, require_upload_token again for the route (and
    for the OpenAPI security scheme). A server started without a token takes no uploads."""
    if not expected:
        return "uploads are disabled: this server was started without an upload token (set PCG_UPLOAD_TOKEN)"
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return "send Authorization: Bearer <upload token>"
    if not secrets.compare_digest(token.strip().encode(), expected.encode()):
        return "wrong upload token"
    return None


def kept_page(request: Request, build: Callable[[], Response], *extra: Hashable) -> Response:
    """The response `build` makes for this URL, or the copy kept from an earlier request while the store's
    version and `extra` (what else the page prints, e.g. its freshness line) are unchanged (web.cache)."""
    key = (request.url.path, request.url.query, request.app.state.store.views.version(), *extra)
    status_code, body, headers = request.app.state.pages.get(key, lambda: _frozen(build()))
    response = Response(body, status_code)
    response.raw_headers = list(headers)
    return response


def kept_json(request: Request, name: str, run_ids: list[int], build: Callable[[], BaseModel],
              *params: Hashable) -> Response:
    """An API response over these runs, encoded (and gzipped) once per their revisions and `params` (what the
    answer depends on besides them): a big answer (a 10,000-cell matrix, a diff of two runs) costs its
    serialization and compression once, whatever the query string says."""
    body, packed = request.app.state.store.views.derived(name, run_ids, lambda: _encoded(build()), *params)
    headers = {"vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("accept-encoding", "").lower() and len(packed) < len(body):
        return Response(packed, media_type="application/json", headers={**headers, "content-encoding": "gzip"})
    return Response(body, media_type="application/json", headers=headers)


def _encoded(model: BaseModel) -> tuple[bytes, bytes]:
    body = model.model_dump_json().encode()
    return body, gzip.compress(body, compresslevel=5)


def _frozen(response: Response) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    return response.status_code, bytes(response.body), list(response.raw_headers)


def require_upload_token(request: Request,
                         creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """401 unless `Authorization: Bearer <token>` matches (upload_refusal)."""
    refusal = upload_refusal(request.app.state.upload_token, request.headers.get("authorization"))
    if refusal is not None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, refusal, headers={"WWW-Authenticate": "Bearer"})
