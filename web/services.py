"""What the pages and the JSON API both show, composed from the Store (and its views) and harness/reports.

The pass rate, the speedup, the status classes and the diff are harness/reports' own (stats.totals,
stats.is_passing/is_counted, diff_runs, diff_markdown): the dashboard shows the numbers `pcgh report` and
`pcgh diff` print, never a second reading of them. Routers turn these results into HTML or JSON; nothing
here knows about HTTP.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, UTC
from typing import Any

from pydantic import TypeAdapter

from harness.metrics import CellMetrics
from harness.outcome import CellRecord
from harness.repro import repro_command
from harness.reports import RunDiff, diff_markdown, diff_runs, results_frame, totals
from harness.reports.run_info import wall_time
from harness.reports.stats import is_counted, is_failing, is_passing, ordered_statuses
from harness.store import HistoryPoint, RunNotFound, Store
from harness.store.rows import RequestRow, RunRow
from web import present
from web.grid import DEFAULT_GROUP, Grid, build_grid, row_matches
from web.support import STORED_SUPPORT, Support, support

STALE_AFTER = timedelta(days=1)
HISTORY_RUNS = 8  # runs in a matrix cell's history strip, this one included
MAX_FAILING = 50  # failing cells listed on a run page
# The latest run's cells by status per model, as the store keeps them per revision (the request queue reads them)
STORED_MODEL_COUNTS: TypeAdapter[dict[str, dict[str, int]]] = TypeAdapter(dict[str, dict[str, int]])


class CellNotFound(LookupError):
    """No run has a result for this cell key (or not the run asked for)."""


@dataclass
class RunSummary:
    """A run's provenance with its final-attempt counts and the reports' pass rate."""

    run: RunRow | None  # None: a card's cells, not one run's
    counts: dict[str, int]
    cells: int
    passing: int
    counted: int
    pass_rate: float | None  # passing / counted; None when nothing counts
    wall_s: float | None


def summarize(run: RunRow | None, counts: Mapping[str, int]) -> RunSummary:
    """From counts by status alone (the runs list has no rows to build a results frame from)."""
    passing = sum(n for s, n in counts.items() if is_passing(s))
    counted = sum(n for s, n in counts.items() if is_counted(s))
    wt = wall_time(run)
    return RunSummary(run, {s: counts[s] for s in ordered_statuses(counts)}, sum(counts.values()), passing,
                      counted, passing / counted if counted else None, wt.total_seconds() if wt else None)


def run_summaries(store: Store, limit: int | None = None) -> list[RunSummary]:
    runs = store.runs(limit)
    counts = store.views.status_counts([r.id for r in runs])
    return [summarize(r, counts[r.id]) for r in runs]


@dataclass
class RunDetail(RunSummary):
    geomean_speedup: float | None = None
    speedup_cells: int = 0
    speedup_measured: bool = True  # False on CPU: no graph captured, so no graph speedup to headline
    failing: list[CellRecord] = field(default_factory=list)
    failing_total: int = 0
    previous_id: int | None = None


def run_detail(store: Store, run_ref: int | str) -> RunDetail:
    """Totals through harness/reports (results_frame → totals), worst cells, the run before it."""
    run = store.run(run_ref)

    def build() -> RunDetail:
        cells = store.views.cells(run.id)
        t = totals(results_frame(cells))
        s = summarize(run, t.counts)
        failing = [r for r in cells if is_failing(r.status)]
        return RunDetail(**vars(s), geomean_speedup=t.geomean_speedup, speedup_cells=t.speedup_cells,
                         speedup_measured=t.speedup_measured,
                         failing=failing[:MAX_FAILING], failing_total=len(failing),
                         previous_id=store.views.previous_run_id(run.id))

    return store.views.derived("run_detail", [run.id], build, repr(run))  # kept per revision


@dataclass
class Freshness:
    run: RunRow | None  # the newest nightly run
    age: timedelta | None
    stale: bool  # that run is older than STALE_AFTER
    message: str


def fmt_age(age: timedelta) -> str:
    s = max(0, int(age.total_seconds()))
    if s < 3600:
        return f"{s // 60} min"
    if s < 2 * 86400:
        return f"{s // 3600} h"
    return f"{s // 86400} days"


def freshness(store: Store, now: datetime | None = None) -> Freshness:
    """Whether the newest nightly run (trigger "nightly") is older than a day, by when it finished (or started)."""
    run = store.latest_run(trigger="nightly")
    if run is None:
        return Freshness(None, None, False, "no nightly run in the store yet")
    at: datetime = run.finished_at or run.started_at
    age = (now or datetime.now(UTC)) - at
    stale = age > STALE_AFTER
    msg = f"newest nightly run #{run.id} ({run.name}) is {fmt_age(age)} old"
    return Freshness(run, age, stale, msg + (": stale, older than a day" if stale else ""))


@dataclass
class MatrixView:
    run: RunRow
    grid: Grid
    support: Support | None  # the whole run's (filters aside); None when not asked for
    strip_runs: list[int]  # the runs before this one in each history strip, oldest first


def matrix(store: Store, run_ref: int | str = "latest", group: str = DEFAULT_GROUP,
           filters: Mapping[str, list[str]] | None = None, *, hide_unsupported: bool = False, page: int | None = None,
           with_history: bool = False, with_support: bool = False) -> MatrixView:
    """The run and its grid (one page of it, when `page` is given); its support summary and its cells' history
    strips (the statuses of the runs before it of the same name) when asked for."""
    run = store.run(run_ref)
    rows = store.views.cells(run.id)
    before = store.views.runs_before(run.id, HISTORY_RUNS - 1) if with_history else []
    wanted = tuple(sorted((k, tuple(v)) for k, v in (filters or {}).items() if v))
    # Kept per the runs' revisions and the question: a query string that asks nothing new costs nothing new
    grid = store.views.derived("grid", [run.id, *before], lambda: build_grid(
        rows, run.id, group, filters, hide_unsupported=hide_unsupported, page=page,
        history=[store.views.statuses(r) for r in before]), group, wanted, hide_unsupported, page)
    summary = None
    if with_support and grid.filters:  # the summary answers the same question as the grid
        summary = support([r for r in rows if row_matches(r, grid.filters)], run.id)
    elif with_support:  # the whole run's: computed once per revision, whatever the query string
        summary = store.views.derived("support", [run.id], lambda: support(rows, run.id), stored=STORED_SUPPORT)
    return MatrixView(run, grid, summary, before)


def run_support(store: Store, run_ref: int | str = "latest") -> tuple[RunRow, Support]:
    """A run and its whole support summary (no grid), kept per revision."""
    run = store.run(run_ref)
    return run, store.views.derived("support", [run.id], lambda: support(store.views.cells(run.id), run.id),
                                    stored=STORED_SUPPORT)


@dataclass
class CellView:
    key: str
    axes: dict[str, str]
    current: HistoryPoint  # the run asked for, else the newest run with this cell
    measured: dict[str, Any]  # what the current attempt measured, as the Store keeps it (defaults left out)
    log: str
    history: list[HistoryPoint]  # oldest run first
    flips: int
    flaky: bool
    repro: str


def _readable(h: HistoryPoint) -> HistoryPoint:
    """`h` with its reason UTF-8-encodable (a row stored before uploads were checked may hold a lone surrogate,
    which would fail the page and the API's JSON alike)."""
    reason = h.record.reason
    return h if present.scrub(reason) is reason else replace(h, record=h.record.model_copy(update={"reason": present.scrub(reason)}))


def cell(store: Store, key: str, run_id: int | None = None) -> CellView:
    history = [_readable(h) for h in store.views.history(key)]
    if not history:
        raise CellNotFound(f"no run has a result for cell {key!r}")
    current = history[-1] if run_id is None else next((h for h in history if h.run_id == run_id), None)
    if current is None:
        raise CellNotFound(f"run {run_id} has no result for cell {key!r}; runs with it: "
                           + ", ".join(str(h.run_id) for h in history[-10:]))
    statuses = [h.record.status for h in history]
    record = current.record
    others = [h.record.metrics for h in reversed(history) if h is not current]
    return CellView(key, record.axes, current,
                    present.scrub(record.metrics.measured()),
                    present.scrub(store.views.log(current.run_id, key)), history, present.flips(statuses),
                    present.is_flaky(statuses), present.scrub(_repro(record, others)))


def _repro(record: CellRecord, others: list[CellMetrics]) -> str:
    """The cell's repro command; a record whose axes cannot give one (stored before uploads checked the model
    grammar) says why instead of failing its page."""
    try:
        return repro_command(record.axes, record.metrics, others)
    except ValueError as e:
        return f"# no repro command: {e}"


@dataclass
class DiffView:
    base: RunRow
    head: RunRow
    diff: RunDiff
    markdown: str


def diff(store: Store, base_ref: int | str | None = None, head_ref: int | str | None = None,
         threshold: float = 0.10) -> DiffView:
    """harness/reports' diff of two runs; head defaults to the latest run, base to the run before head."""
    head = store.run(head_ref if head_ref is not None else "latest")
    if base_ref is None:
        prev = store.views.previous_run_id(head.id)
        if prev is None:
            raise RunNotFound(f"run {head.id} is the first run: there is nothing before it to diff against")
        base_ref = prev
    base = store.run(base_ref)

    def build() -> tuple[RunDiff, str]:
        d = diff_runs(store.views.cells(base.id, latency=True), store.views.cells(head.id, latency=True), threshold)
        return d, diff_markdown(d, base, head)

    # Kept per run pair at their revisions (the runs' rows, which the markdown prints, among the params)
    d, markdown = store.views.derived("diff", [base.id, head.id], build, threshold, repr(base), repr(head))
    return DiffView(base, head, d, markdown)


@dataclass
class QueuedRequest:
    request: RequestRow
    cells: int  # cells of this card in the latest run
    passing: int
    counted: int
    verdicts: list[tuple[str, bool, str]] = field(default_factory=list)  # (axis, ok, reason) from the report


def axis_verdicts(verdict: Any) -> list[tuple[str, bool, str]]:
    """The per-axis verdicts of a request report (`verdicts: {axis: {ok, reason}}`); none for anything else."""
    found = verdict.get("verdicts") if isinstance(verdict, Mapping) else None
    if not isinstance(found, Mapping):
        return []
    return [(str(axis), bool(v.get("ok")), str(v.get("reason") or "")) for axis, v in found.items()
            if isinstance(v, Mapping)]


def requests(store: Store) -> list[QueuedRequest]:
    """The request queue, each with its card's cells in the latest run."""
    latest = store.latest_run()
    per_card: dict[str, Counter[str]] = {}
    if latest is not None:
        counts_by_model = store.views.derived("model_counts", [latest.id], lambda: store.views.model_counts(latest.id),
                                              stored=STORED_MODEL_COUNTS)
        for model, counts in counts_by_model.items():
            per_card.setdefault(model.partition(":")[0], Counter()).update(counts)
    out = []
    for r in map(present.scrub, store.requests()):  # a verdict stored before uploads were checked stays readable
        s = summarize(None, per_card.get(r.card_id or "", Counter()))
        out.append(QueuedRequest(r, s.cells, s.passing, s.counted, axis_verdicts(r.verdict)))
    return out


def model_summary(store: Store, card_id: str) -> RunSummary | None:
    """A card's cells (every variant) in the latest run; None when it has none there."""
    latest = store.latest_run()
    if latest is None:
        return None
    c: Counter[str] = Counter()
    for model, counts in store.views.model_counts(latest.id).items():
        if model.partition(":")[0] == card_id:
            c.update(counts)
    return summarize(latest, c) if c else None


def matrix_summary(store: Store, name: str) -> RunSummary | None:
    """The newest run of this matrix name; None when there is none."""
    run = store.latest_run(name=name)
    return summarize(run, store.views.status_counts([run.id])[run.id]) if run is not None else None
