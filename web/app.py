"""create_app: the dashboard for one results database. `python -m web` (`pcgh serve`) and the tests build it here.

OpenAPI: /openapi.json as FastAPI makes it, and /docs is FastAPI's Swagger UI page with its JavaScript and CSS
served from our own /static/swagger (the swagger-ui-bundle-v2 package ships Swagger UI 5, which reads
OpenAPI 3.1) instead of FastAPI's default CDN, so the browser fetches nothing from outside. ReDoc, which
has no such package, is off.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from swagger_ui_bundle import swagger_ui_path

from harness.store import RunNotFound, Store
from web.cache import KeptViews, page_cache
from web.deps import render
from web.guard import SecurityHeaders, UploadGuard, max_bytes_from_env
from web.routers import api, badges, pages, upload
from web.services import CellNotFound

STATIC = Path(__file__).parent / "static"
SWAGGER_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")


def create_app(db_url: str | None = None, upload_token: str | None = None) -> FastAPI:
    """The app over `db_url` (None: $PCG_DB_URL or sqlite:///pcg.db); uploads need `upload_token`, else
    $PCG_UPLOAD_TOKEN; with neither, uploads are refused and everything else works."""
    store = Store(db_url)
    store.views = KeptViews(store.views.engine, **store.views.flags)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        store.close()

    app = FastAPI(title="pcg compatibility dashboard", version="0.1.0", docs_url=None, redoc_url=None,
                  lifespan=lifespan,
                  description="Read the pcg compatibility matrix: runs, cells, histories, diffs, requests. "
                              "Uploads need `Authorization: Bearer <token>`.")
    app.state.store = store
    app.state.pages = page_cache()
    app.state.upload_token = upload_token if upload_token is not None else os.environ.get("PCG_UPLOAD_TOKEN") or None
    app.add_middleware(GZipMiddleware, minimum_size=2048, compresslevel=5)
    app.add_middleware(UploadGuard, max_bytes=max_bytes_from_env())
    app.add_middleware(SecurityHeaders)

    @app.get("/static/swagger/{name}", include_in_schema=False)
    def swagger_file(name: str) -> Response:
        # Only what /docs loads: the package's folder also holds Swagger's stock demo page, which fetches an
        # outside host.
        if name not in SWAGGER_FILES:
            return JSONResponse({"detail": "not found"}, status_code=404)
        return FileResponse(Path(swagger_ui_path) / name)

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    for r in (upload.router, api.router, badges.router, pages.router):
        app.include_router(r)
    derived_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:  # FastAPI's, plus the upload body's schema (a route that reads raw bytes)
            spec = derived_openapi()
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in upload.OPENAPI_COMPONENTS.items():
                schemas.setdefault(name, schema)
        assert app.openapi_schema is not None  # FastAPI's openapi() keeps what it made
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/docs", include_in_schema=False)
    def docs() -> Response:
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} — API",
                                   swagger_js_url="/static/swagger/swagger-ui-bundle.js",
                                   swagger_css_url="/static/swagger/swagger-ui.css",
                                   swagger_favicon_url="/static/swagger/favicon-32x32.png",
                                   swagger_ui_parameters={"validatorUrl": None})

    def not_found(request: Request, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": message}, status_code=404)
        return render(request, "error.html", {"status": 404, "message": message}, status_code=404)

    @app.exception_handler(RequestValidationError)
    def invalid(request: Request, e: RequestValidationError) -> Response:
        # The 422 names each bad field and why, without echoing its input: a NaN or a lone surrogate there would
        # make the error itself unrenderable as JSON (a 500 in place of the 422).
        detail = [{"loc": list(err.get("loc", ())), "msg": str(err.get("msg", "")).encode("utf-8", "backslashreplace").decode(),
                   "type": err.get("type", "")} for err in e.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(RunNotFound)
    def run_not_found(request: Request, e: RunNotFound) -> Response:
        return not_found(request, str(e))

    @app.exception_handler(CellNotFound)
    def cell_not_found(request: Request, e: CellNotFound) -> Response:
        return not_found(request, str(e))

    return app
