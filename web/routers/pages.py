"""The HTML pages: matrix (/), cell, runs, run, diff and requests. Server-rendered, no JavaScript.

Filters and choices are plain query parameters set by GET forms, so every view is a link that can be shared
or bookmarked. Each handler makes one service call (web.services) and renders one template.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from markupsafe import Markup
from starlette.responses import PlainTextResponse, Response

from harness.outcome import AXES
from harness.store import RunNotFound
from harness.reports import cell_speedup
from web import services
from web.deps import MAX_LIMIT, MAX_PAGE, MAX_THRESHOLD, StoreDep, gc_paused, kept_page, render, templates
from web.grid import CONFIG_AXES, DEFAULT_GROUP, STATUS_CLASSES, parse_filters
from web.plots import line_plot
from web.support import SUMMARY_AXES

router = APIRouter(include_in_schema=False)
DIFF_ROWS = 200  # rows of each diff table on the page; the Markdown has them all


@router.get("/")
def matrix_page(request: Request, store: StoreDep, run: str = "latest", group: str = DEFAULT_GROUP,
                page: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1,
                unsupported: Literal["hide", "show"] = "hide") -> Response:
    """The support summary, then the grid: one page of models, cells the runtime cannot run hidden by default
    (the summary counts and explains them)."""
    fresh = services.freshness(store)
    if group not in CONFIG_AXES:
        group = DEFAULT_GROUP
    filters = parse_filters({k: request.query_params.getlist(k) for k in request.query_params})

    def build() -> Response:
        with gc_paused():
            try:
                v = services.matrix(store, run, group, filters, hide_unsupported=unsupported == "hide", page=page,
                                    with_history=True, with_support=True)
            except RunNotFound as e:
                if run != "latest":
                    raise
                return render(request, "empty.html", {"message": str(e), "freshness": fresh})
            runs = store.runs(50)  # for the run picker; an older run asked for by id is added to it
            if all(x.id != v.run.id for x in runs):
                runs.append(v.run)
            href = _href(request)
            # The grid's HTML (the page's bulk): rendered once per grid and the parameters its links carry, kept
            # per the runs' revisions as the grid is
            fragment = store.views.derived("grid_html", [v.run.id, *v.strip_runs], lambda: Markup(
                templates.get_template("_grid.html").render(grid=v.grid, strip_runs=v.strip_runs, href=href)),
                group, tuple(sorted(_known_params(request))), unsupported, page)
            return render(request, "matrix.html", {
                "grid_fragment": fragment,
                "run": v.run, "grid": v.grid, "support": v.support, "strip_runs": v.strip_runs, "runs": runs,
                "axes": AXES, "config_axes": CONFIG_AXES, "summary_axes": SUMMARY_AXES,
                "status_classes": list(STATUS_CLASSES), "freshness": fresh, "unsupported": unsupported,
                "href": href})

    return kept_page(request, build, fresh.message)


MATRIX_PARAMS = {"run", "group", "page", "unsupported", "status", *AXES}  # what the matrix page reads


def _known_params(request: Request) -> list[tuple[str, str]]:
    return [(k, v) for k, v in request.query_params.multi_items() if k in MATRIX_PARAMS]


def _href(request: Request) -> Callable[..., str]:
    """This page's URL with some parameters replaced (None drops one); parameters the page does not read are left
    out, so they change no link (and no kept grid)."""
    def href(**changes: object) -> str:
        params = [(k, v) for k, v in _known_params(request) if k not in changes]
        params += [(k, str(v)) for k, v in changes.items() if v is not None]
        return f"{request.url.path}?{urlencode(params)}"
    return href


def _plots(v: services.CellView) -> list[Any]:
    labels = [str(h.run_id) for h in v.history]
    metrics = [h.record.metrics for h in v.history]
    tokens = sorted({n for m in metrics for n in m.latency.speedup})
    speedup = {f"{n} tokens": [m.latency.speedup.get(n) for m in metrics] for n in tokens}
    pool = [m.capture.graph_pool_bytes for m in metrics]
    return [
        line_plot("Speedup over eager (×), per token count", labels, speedup, fmt=lambda x: f"{x:.2f}", unit="×"),
        line_plot("Capture time (s)", labels, {"capture s": [m.capture.capture_s for m in metrics]},
                  fmt=lambda x: f"{x:.3g}", unit=" s"),
        line_plot("Graph memory pool (MiB)", labels, {"MiB": [None if p is None else p / 2**20 for p in pool]},
                  fmt=lambda x: f"{x:.3g}", unit=" MiB"),
    ]


@router.get("/cell")
def cell_page(request: Request, store: StoreDep, key: str, run: int | None = None) -> Response:
    fresh = services.freshness(store)

    def build() -> Response:
        v = services.cell(store, key, run)
        history = [(h, cell_speedup(h.record.metrics)) for h in reversed(v.history)]
        return render(request, "cell.html", {"v": v, "history": history, "plots": _plots(v), "freshness": fresh,
                                             "speedup": cell_speedup(v.current.record.metrics)})

    return kept_page(request, build, fresh.message)


@router.get("/runs")
def runs_page(request: Request, store: StoreDep, limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 200) -> Response:
    fresh = services.freshness(store)
    return kept_page(request, lambda: render(request, "runs.html", {
        "summaries": services.run_summaries(store, limit), "freshness": fresh}), fresh.message)


@router.get("/runs/{run_ref}")
def run_page(request: Request, run_ref: str, store: StoreDep) -> Response:
    fresh = services.freshness(store)
    return kept_page(request, lambda: render(request, "run.html", {
        "d": services.run_detail(store, run_ref), "freshness": fresh}), fresh.message)


@router.get("/diff")
def diff_page(request: Request, store: StoreDep, base: str | None = None, head: str | None = None,
              threshold: Annotated[float, Query(ge=0, le=MAX_THRESHOLD, allow_inf_nan=False)] = 0.10, format: str = "html") -> Response:
    fresh = services.freshness(store)
    if not base and not head and format != "md" and len(runs := store.runs(2)) < 2:  # the nav's Diff link: no 404
        return render(request, "diff_none.html", {"run": runs[0] if runs else None, "freshness": fresh})

    def build() -> Response:
        with gc_paused():
            v = services.diff(store, base or None, head or None, threshold)
            if format == "md":
                return PlainTextResponse(v.markdown, media_type="text/markdown; charset=utf-8")
            # the tables (the page's bulk): rendered once per run pair and threshold, kept per their revisions
            body = store.views.derived("diff_html", [v.base.id, v.head.id], lambda: Markup(
                templates.get_template("_diff_body.html").render(
                    v=v, max_rows=DIFF_ROWS, slower=sum(c.rel_change > 0 for c in v.diff.latency_changes),
                    worse=sum(c.rel_change < 0 for c in v.diff.speedup_changes))),
                threshold, repr(v.base), repr(v.head))
            return render(request, "diff.html", {"v": v, "body": body, "runs": store.runs(200), "freshness": fresh})

    return kept_page(request, build, fresh.message)


@router.get("/requests")
def requests_page(request: Request, store: StoreDep) -> Response:
    return render(request, "requests.html", {"rows": services.requests(store), "freshness": services.freshness(store)})
