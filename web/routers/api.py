"""The JSON API: everything the pages show, for scripts and other dashboards. Reading is public.

Each endpoint is the page's service call (web.services) turned into a response model (web.schemas); the
numbers are the ones on the pages because they come from the same call.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response

from harness.reports import cell_speedup
from harness.reports.json_report import jsonable
from harness.store.rows import RunRow
from web import services
from web.deps import MAX_LIMIT, MAX_THRESHOLD, StoreDep, gc_paused, kept_json
from web.grid import CONFIG_AXES, DEFAULT_GROUP, Grid, parse_filters
from web.schemas import (
    CellOut,
    ColumnOut,
    DiffOut,
    FailingCellOut,
    FreshnessOut,
    HistoryPointOut,
    LatencyChangeOut,
    MatrixCellOut,
    MatrixOut,
    RequestOut,
    RequestsOut,
    RunDetailOut,
    RunOut,
    RunsOut,
    RunSummaryOut,
    SpeedupChangeOut,
    StatusChangeOut,
    SupportOut,
)
from web.support import ReasonGroup, Tally

router = APIRouter(prefix="/api", tags=["read"])
Group = Annotated[str, Query(description=f"axis the columns are grouped by: {', '.join(CONFIG_AXES)}")]


def run_out(run: RunRow) -> RunOut:
    return RunOut.model_validate(run, from_attributes=True)


def summary_out(s: services.RunSummary) -> dict[str, Any]:
    return {"run": run_out(s.run) if s.run is not None else None, "cells": s.cells, "counts": s.counts, "passing": s.passing, "counted": s.counted,
            "pass_rate": s.pass_rate, "wall_s": s.wall_s}


def freshness_out(f: services.Freshness) -> FreshnessOut:
    return FreshnessOut(newest_nightly_id=f.run.id if f.run else None,
                        age_s=f.age.total_seconds() if f.age is not None else None, stale=f.stale, message=f.message)


@router.get("/runs", response_model=RunsOut, summary="Runs, newest first, with counts and pass rates")
def list_runs(store: StoreDep, limit: Annotated[int | None, Query(ge=1, le=MAX_LIMIT)] = None) -> RunsOut:
    return RunsOut(freshness=freshness_out(services.freshness(store)),
                   runs=[RunSummaryOut(**summary_out(s)) for s in services.run_summaries(store, limit)])


@router.get("/runs/{run_ref}", response_model=RunDetailOut, summary="One run ('latest' or an id): provenance and totals")
def get_run(run_ref: str, store: StoreDep) -> RunDetailOut:
    d = services.run_detail(store, run_ref)
    return RunDetailOut(**summary_out(d), geomean_speedup=d.geomean_speedup, speedup_cells=d.speedup_cells,
                        failing_total=d.failing_total, previous_id=d.previous_id,
                        failing=[FailingCellOut(key=r.key, status=r.status, reason=r.reason) for r in d.failing])


def _filters(request: Request) -> dict[str, list[str]]:
    return parse_filters({k: request.query_params.getlist(k) for k in request.query_params})


@router.get("/matrix", response_model=MatrixOut,
            summary="A run's cells as the matrix page shows them; filter with ?AXIS=VALUE (globs, repeatable) "
                    "and ?status=STATUS|passing|failing|not_counted")
def get_matrix(request: Request, store: StoreDep, run: str = "latest", group: Group = DEFAULT_GROUP,
               unsupported: Annotated[Literal["show", "hide"], Query(
                   description="hide leaves out the cells the runtime cannot run yet (unsupported, skipped)")] = "show",
               ) -> Response:
    if group not in CONFIG_AXES:
        raise HTTPException(422, f"group {group!r}: choose one of {', '.join(CONFIG_AXES)}")
    filters = _filters(request)
    with gc_paused():
        v = services.matrix(store, run, group, filters, hide_unsupported=unsupported == "hide")
        wanted = tuple(sorted((k, tuple(x)) for k, x in filters.items() if x))
        return kept_json(request, "api_matrix", [v.run.id], lambda: _matrix_out(v.run, v.grid), group, wanted,
                         unsupported, repr(v.run))


def _tally(t: Tally) -> dict[str, Any]:
    return {"passing": t.passing, "failing": t.failing, "eager_fail": t.eager_fail, "not_supported": t.not_supported,
            "launched": t.launched, "pass_rate": t.pass_rate}


def _groups(groups: list[ReasonGroup]) -> list[dict[str, Any]]:
    return [{"reason": g.reason, "cells": g.cells, "statuses": g.statuses, "shared": g.shared} for g in groups]


@router.get("/support", response_model=SupportOut,
            summary="A run's support summary: cells by axis value (pass, fail, not supported), reasons grouped")
def get_support(store: StoreDep, run: str = "latest") -> SupportOut:
    with gc_paused():
        r, s = services.run_support(store, run)
    return SupportOut(run=run_out(r), tally=_tally(s.tally),
                      by_axis={a: [{"value": x.value, "tally": _tally(x.tally)} for x in values]
                               for a, values in s.by_axis.items()},
                      failing=_groups(s.failing), failing_groups=s.failing_groups,
                      not_supported=_groups(s.not_supported), not_supported_groups=s.not_supported_groups)


def _matrix_out(r: RunRow, grid: Grid) -> MatrixOut:
    cells = [MatrixCellOut(key=c.row.key, axes=c.row.axes, status=c.row.status, label=c.label, speedup=c.speedup,
                           reason=c.row.reason, capture_s=c.row.metrics.capture.capture_s,
                           graph_pool_bytes=c.row.metrics.capture.graph_pool_bytes, token_match=c.row.metrics.judge.token_match)
             for _, line in grid.rows for c in line if c is not None]
    return MatrixOut(run=run_out(r), group=grid.group, filters=grid.filters, options=grid.options, total=grid.total,
                     shown=grid.shown, hidden=grid.hidden, counts=grid.counts, models=[m for m, _ in grid.rows],
                     columns=[ColumnOut(group=c.group, config=dict(zip(CONFIG_AXES, c.config))) for c in grid.columns],
                     cells=cells)


@router.get("/cell", response_model=CellOut, summary="One cell: its history across runs, its log and its repro command")
def get_cell(store: StoreDep, key: str, run: int | None = None) -> CellOut:
    v = services.cell(store, key, run)
    history = [HistoryPointOut(run_id=h.run_id, run_name=h.run_name, started_at=h.started_at, trigger=h.trigger,
                               status=h.record.status, reason=h.record.reason, attempts=h.attempts,
                               speedup=cell_speedup(h.record.metrics), speedups=jsonable(h.record.metrics.latency.speedup),
                               capture_s=jsonable(h.record.metrics.capture.capture_s),
                               graph_pool_bytes=h.record.metrics.capture.graph_pool_bytes)
               for h in v.history]
    current = v.current.record
    return CellOut(key=v.key, axes=v.axes, run_id=v.current.run_id, status=current.status, reason=current.reason,
                   metrics=jsonable(v.measured), log=v.log, flips=v.flips, flaky=v.flaky, repro=v.repro,
                   history=history)


@router.get("/diff", response_model=DiffOut,
            summary="What changed between two runs, new failures first (head defaults to latest, base to the run before)")
def get_diff(request: Request, store: StoreDep, base: str | None = None, head: str | None = None,
             threshold: Annotated[float, Query(ge=0, le=MAX_THRESHOLD, allow_inf_nan=False)] = 0.10) -> Response:
    with gc_paused():
        v = services.diff(store, base, head, threshold)
    d = v.diff

    def changes(cs: list) -> list[StatusChangeOut]:
        return [StatusChangeOut(key=c.key, axes=dict(c.axes), base_status=c.base_status, head_status=c.head_status,
                                reason=c.reason) for c in cs]

    def build() -> DiffOut:
        return DiffOut(base=run_out(v.base), head=run_out(v.head), has_regression=d.has_regression,
                       new_failures=changes(d.new_failures), fixes=changes(d.fixes), flips=changes(d.flips),
                       speedup_changes=[SpeedupChangeOut(key=c.key, axes=dict(c.axes), base=c.base, head=c.head,
                                                         rel_change=c.rel_change) for c in d.speedup_changes],
                       latency_changes=[LatencyChangeOut(key=c.key, axes=dict(c.axes), base_ms=c.base, head_ms=c.head,
                                                         rel_change=c.rel_change) for c in d.latency_changes],
                       added=d.added, removed=d.removed, speedup_threshold=d.speedup_threshold, markdown=v.markdown)

    with gc_paused():  # kept as the diff itself is: per run pair at their revisions
        return kept_json(request, "api_diff", [v.base.id, v.head.id], build, threshold, repr(v.base), repr(v.head))


@router.get("/requests", response_model=RequestsOut, summary="The queue of requested models, with verdicts and status")
def get_requests(store: StoreDep) -> RequestsOut:
    return RequestsOut(requests=[
        RequestOut(**jsonable(r.request.model_dump(exclude={"match"})), matrix_cells=r.cells, matrix_passing=r.passing, matrix_counted=r.counted)
        for r in services.requests(store)])
