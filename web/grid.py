"""The matrix grid: a run's cells pivoted into models down and configurations across, grouped by one axis.

A configuration is a cell's non-model axes. Columns are sorted by the group axis first (naturally: tp2 before
tp8), so each group is one contiguous run of columns under one header; a column's own label names only the
axes that vary among the shown cells, so a run that fixes quant and parallel does not repeat them 10,000
times. Filters match exact values or globs (`qwen3-*`), any of several values per axis; `status` also takes
the classes passing, failing and not_counted. Everything is computed in one pass over rows already in memory.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

from harness.outcome import AXES, NOT_COUNTED, CellRecord
from harness.reports import cell_speedup
from harness.reports.stats import is_failing, is_passing, natural_key, ordered_statuses
from web import present

CONFIG_AXES = tuple(a for a in AXES if a != "model")
DEFAULT_GROUP = "graph"
FILTER_KEYS = (*AXES, "status")
STATUS_CLASSES = {"passing": is_passing, "failing": is_failing, "not_counted": lambda s: s in NOT_COUNTED}


@dataclass(slots=True)
class GridCell:
    """One rendered cell; strings precomputed so the template only interpolates them."""

    row: CellRecord
    speedup: float | None
    label: str
    css: str
    title: str
    href: str


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


def cell_href(key: str, run_id: int) -> str:
    """The cell page's URL; a key of the usual characters only needs its '|' escaped (and urllib's quote costs
    more than the rest of the cell together)."""
    k = key.replace("|", "%7C") if _PLAIN_KEY.fullmatch(key) else quote(key, safe="=:")
    return f"/cell?key={k}&run={run_id}"


def build_grid(rows: Sequence[CellRecord], run_id: int, group: str = DEFAULT_GROUP,
               filters: Mapping[str, list[str]] | None = None) -> Grid:
    """Filter, pivot and label a run's cells; `group` is one of CONFIG_AXES."""
    if group not in CONFIG_AXES:
        raise ValueError(f"group {group!r}: choose one of {', '.join(CONFIG_AXES)}")
    filters = {k: list(v) for k, v in (filters or {}).items() if v}
    options: dict[str, set[str]] = {k: set() for k in FILTER_KEYS}
    shown: list[CellRecord] = []
    for r in rows:
        for a in AXES:
            options[a].add(str(r.axes.get(a)))
        options["status"].add(r.status)
        if all(_matches(str(r.axes.get(a)), filters[a]) for a in AXES if a in filters) and (
                "status" not in filters or _status_matches(r.status, filters["status"])):
            shown.append(r)
    grid = Grid(group, filters, {k: sorted(v, key=natural_key) for k, v in options.items()}, total=len(rows),
                shown=len(shown))
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
    by_model: dict[str, list[GridCell | None]] = {}
    counts: Counter[str] = Counter()
    for r, config in zip(shown, shown_configs):
        m = r.metrics
        speedup = cell_speedup(m)
        cell = GridCell(r, speedup, present.short_label(r.status, speedup), present.css_class(r.status),
                        present.tooltip(r.status, r.reason, speedup, m.capture_s, m.graph_pool_bytes, m.token_match),
                        cell_href(r.key, run_id))
        model = str(r.axes.get("model"))
        line = by_model.get(model)
        if line is None:
            line = by_model[model] = [None] * len(configs)
        line[col_index[config]] = cell
        counts[r.status] += 1
    grid.rows = [(m, by_model[m]) for m in sorted(by_model, key=natural_key)]
    grid.counts = {s: counts[s] for s in ordered_statuses(counts)}
    return grid
