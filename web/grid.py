"""The matrix grid: a run's cells pivoted into models down and configurations across, grouped by one axis.

A configuration is a cell's non-model axes. Columns are sorted by the group axis first (naturally: tp2 before
tp8), so each group is one contiguous run of columns under one header; a column's own label names only the
axes that vary among the shown cells, so a run that fixes quant and parallel does not repeat them 10,000
times. Filters match exact values or globs (`qwen3-*`), any of several values per axis; `status` also takes
the classes passing, failing and not_counted; `hide_unsupported` drops the cells the runtime cannot run yet
(unsupported, skipped), and with them every row and column that holds nothing else.

A page holds whole models, up to PAGE_CELLS cells: a 10,000-cell run is a few pages, not one 3 MB table. Only
the page's cells get their labels, tooltips and history strips (TestGrid's: the cell's status in the last runs
of the same name, oldest first, with flipped and flaky cells marked).
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import quote

from markupsafe import Markup

from harness.outcome import AXES, NOT_COUNTED, CellRecord, Status
from harness.reports import cell_speedup
from harness.reports.stats import is_failing, is_passing, natural_key, ordered_statuses, status_class
from web import present

CONFIG_AXES = tuple(a for a in AXES if a != "model")
DEFAULT_GROUP = "graph"
FILTER_KEYS = (*AXES, "status")
STATUS_CLASSES = {"passing": is_passing, "failing": is_failing, "not_counted": lambda s: s in NOT_COUNTED}
NOT_SUPPORTED = (Status.UNSUPPORTED, Status.SKIPPED)  # what "hide unsupported" hides: cells the runtime cannot run
PAGE_CELLS = 1500
_STRIP_LETTER = {"pass": "p", "flaky": "k", "fail": "f", "eager_fail": "e", "not_run": "n"}


@dataclass(slots=True)
class GridCell:
    """One rendered cell; strings precomputed so the template only interpolates them."""

    row: CellRecord
    speedup: float | None
    label: str
    css: str
    title: str
    href: str
    strip: Markup = Markup("")  # the history strip, oldest run first; empty without history
    marks: str = ""  # CSS classes: " slower" (speedup below 1), " flip" (status class changed since the run before), " flaky"


@dataclass
class Column:
    group: str
    config: tuple[str, ...]  # values of CONFIG_AXES
    label: str


@dataclass
class Grid:
    group: str
    filters: dict[str, list[str]]
    options: dict[str, list[str]]  # every value of each axis (and status) in the run, for the filter form
    columns: list[Column] = field(default_factory=list)
    groups: list[tuple[str, int]] = field(default_factory=list)  # (group value, column span)
    rows: list[tuple[str, list[GridCell | None]]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # shown cells by status
    total: int = 0
    shown: int = 0
    hidden: int = 0  # not-supported cells left out by hide_unsupported
    page: int = 1
    pages: int = 1
    models: int = 0  # rows over every page
    first_model: int = 0  # index of the page's first row among them


def parse_filters(params: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """{axis: [values]} from query parameters (repeated or comma-separated); empty values mean 'any'."""
    out: dict[str, list[str]] = {}
    for k in FILTER_KEYS:
        values = [v.strip() for raw in params.get(k, ()) for v in raw.split(",") if v.strip()]
        if values:
            out[k] = values
    return out


def _matches(value: str, wanted: list[str]) -> bool:
    return any(value == w or fnmatch.fnmatchcase(value, w) for w in wanted)


def _status_matches(status: str, wanted: list[str]) -> bool:
    return any(status == w or (w in STATUS_CLASSES and STATUS_CLASSES[w](status)) or fnmatch.fnmatchcase(status, w)
               for w in wanted)


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_.~=:|-]*")


def row_matches(r: CellRecord, filters: Mapping[str, list[str]]) -> bool:
    """Whether a cell is one the filters ask about (each axis filter a list of globs; none given: any)."""
    return all(_matches(str(r.axes.get(a)), filters[a]) for a in AXES if filters.get(a)) and (
        not filters.get("status") or _status_matches(r.status, filters["status"]))


def cell_href(key: str, run_id: int) -> str:
    """The cell page's URL; a key of the usual characters only needs its '|' escaped (and urllib's quote costs
    more than the rest of the cell together)."""
    k = key.replace("|", "%7C") if _PLAIN_KEY.fullmatch(key) else quote(key, safe="=:")
    return f"/cell?key={k}&run={run_id}"


@lru_cache(maxsize=4096)  # a run's strips repeat: a few hundred distinct ones among 10,000 cells
def _strip(history: tuple[str | None, ...]) -> Markup:
    """A history strip: one <i> per run, classed by the status's letter (x: not in that run)."""
    return Markup("".join(f'<i class="{_STRIP_LETTER[status_class(s)] if s else "x"}"></i>' for s in history))


def _pages(sizes: list[int], per_page: int) -> list[int]:
    """The index of each page's first row: whole rows, at most per_page cells a page (a longer row alone)."""
    starts, n = [0], 0
    for i, size in enumerate(sizes):
        if n and n + size > per_page:
            starts.append(i)
            n = 0
        n += size
    return starts


def build_grid(rows: Sequence[CellRecord], run_id: int, group: str = DEFAULT_GROUP,
               filters: Mapping[str, list[str]] | None = None, *, hide_unsupported: bool = False,
               page: int | None = None, per_page: int | None = None,
               history: Sequence[Mapping[str, str]] = ()) -> Grid:
    """Filter, pivot and label a run's cells; `group` is one of CONFIG_AXES. `page` (1-based) keeps that page
    of models (per_page cells at most, PAGE_CELLS by default), None every model; `history` is the statuses by key of the runs before this one, oldest first."""
    if group not in CONFIG_AXES:
        raise ValueError(f"group {group!r}: choose one of {', '.join(CONFIG_AXES)}")
    filters = {k: list(v) for k, v in (filters or {}).items() if v}
    options: dict[str, set[str]] = {k: set() for k in FILTER_KEYS}
    shown: list[CellRecord] = []
    hidden = 0
    for r in rows:
        for a in AXES:
            options[a].add(str(r.axes.get(a)))
        options["status"].add(r.status)
        if row_matches(r, filters):
            if hide_unsupported and r.status in NOT_SUPPORTED:
                hidden += 1
            else:
                shown.append(r)
    grid = Grid(group, filters, {k: sorted(v, key=natural_key) for k, v in options.items()}, total=len(rows),
                shown=len(shown), hidden=hidden)
    grid.options["status"] = ordered_statuses(options["status"])
    gi = CONFIG_AXES.index(group)

    shown_configs = [tuple(str(r.axes.get(a)) for a in CONFIG_AXES) for r in shown]
    configs = sorted(set(shown_configs),
                     key=lambda c: (natural_key(c[gi]), *(natural_key(v) for v in c)))
    varying = [i for i in range(len(CONFIG_AXES)) if i != gi and len({c[i] for c in configs}) > 1]
    col_index = {c: i for i, c in enumerate(configs)}
    grid.columns = [Column(c[gi], c, " · ".join(c[i] for i in varying)) for c in configs]
    for col in grid.columns:
        if grid.groups and grid.groups[-1][0] == col.group:
            grid.groups[-1] = (col.group, grid.groups[-1][1] + 1)
        else:
            grid.groups.append((col.group, 1))
    by_model: dict[str, list[tuple[CellRecord, tuple[str, ...]]]] = {}
    counts: Counter[str] = Counter()
    for r, config in zip(shown, shown_configs):
        by_model.setdefault(str(r.axes.get("model")), []).append((r, config))
        counts[r.status] += 1
    models = sorted(by_model, key=natural_key)
    starts = _pages([len(by_model[m]) for m in models], per_page or PAGE_CELLS)
    grid.models, grid.pages = len(models), len(starts)
    if page is not None:
        grid.page = min(max(page, 1), grid.pages)
        lo = starts[grid.page - 1]
        hi = starts[grid.page] if grid.page < grid.pages else len(models)
        grid.first_model, models = lo, models[lo:hi]
    for model in models:
        line: list[GridCell | None] = [None] * len(configs)
        for r, config in by_model[model]:
            line[col_index[config]] = _cell(r, run_id, [h.get(r.key) for h in history])
        grid.rows.append((model, line))
    grid.counts = {s: counts[s] for s in ordered_statuses(counts)}
    return grid


def _cell(r: CellRecord, run_id: int, before: list[str | None]) -> GridCell:
    m = r.metrics
    speedup = cell_speedup(m)
    cell = GridCell(r, speedup, present.short_label(r.status, speedup), present.css_class(r.status),
                    present.tooltip(r.status, r.reason, speedup, m.capture.capture_s, m.capture.graph_pool_bytes, m.judge.token_match),
                    cell_href(r.key, run_id))
    if speedup is not None and speedup < 1:
        cell.marks = " slower"  # passing, but the graph is slower than eager: red, not the green of a speedup
    if before:
        cell.strip = _strip((*before, r.status))
        marks = ""
        if before[-1] is not None and status_class(before[-1]) != status_class(r.status):
            marks += " flip"
        if present.is_flaky([s for s in (*before, r.status) if s is not None]):
            marks += " flaky"
        cell.marks += marks
    return cell
