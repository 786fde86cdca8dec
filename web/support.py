"""The answer before the grid: what works, what fails, what is not supported yet, and why.

For each value of the axes a user asks about (SUMMARY_AXES) it counts the run's cells that pass, fail, failed in
eager and are not supported; the reasons of the failing and of the not-supported cells are grouped rather than
left in 10,000 tooltips. A reason groups with others whose first line differs only in numbers ("needs 2 GPUs",
"needs 8 GPUs"); a group links to the matrix filtered to its statuses and to every axis value its cells share.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlencode

from pydantic import TypeAdapter

from harness.outcome import AXES, CellRecord
from harness.reports.markdown import one_line
from harness.reports.matrices import pivot_row
from harness.reports.stats import natural_key, status_class

SUMMARY_AXES = ("model", "quant", "attention", "parallel")
MAX_REASONS = 12  # groups listed per kind; the rest are counted
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


@dataclass
class Tally:
    """Cells by what they say about support: passing, failing (the graph path's fault), eager_fail (the model's),
    not_supported (not launched: unsupported or skipped)."""

    passing: int = 0
    failing: int = 0
    eager_fail: int = 0
    not_supported: int = 0

    def add(self, status: str) -> None:
        c = status_class(status)
        if c in ("pass", "flaky"):
            self.passing += 1
        elif c == "eager_fail":
            self.eager_fail += 1
        elif c == "not_run":
            self.not_supported += 1
        else:
            self.failing += 1

    @property
    def total(self) -> int:
        return self.passing + self.failing + self.eager_fail + self.not_supported

    @property
    def launched(self) -> int:
        return self.total - self.not_supported

    @property
    def counted(self) -> int:
        """What the pass rate counts (harness/reports' is_counted): passing and failing cells."""
        return self.passing + self.failing

    @property
    def pass_rate(self) -> float | None:
        return self.passing / self.counted if self.counted else None


@dataclass
class AxisValue:
    axis: str
    value: str
    tally: Tally
    href: str


@dataclass
class ReasonGroup:
    reason: str  # the first cell's reason, on one line
    cells: int
    statuses: list[str]
    shared: dict[str, str]  # axis → the value every cell of the group has (axes with one value in the run left out)
    href: str


@dataclass
class Support:
    tally: Tally
    by_axis: dict[str, list[AxisValue]] = field(default_factory=dict)
    not_supported: list[ReasonGroup] = field(default_factory=list)
    not_supported_groups: int = 0  # all groups, listed or not
    failing: list[ReasonGroup] = field(default_factory=list)
    failing_groups: int = 0


# The summary as the store keeps it (run_aggregates), per run revision: a restarted server reads it, not 10,000 cells
STORED_SUPPORT: TypeAdapter[Support] = TypeAdapter(Support)


def matrix_href(run_id: int, **params: str | list[str]) -> str:
    """The matrix page of this run with these filters (and every cell shown: a link to unsupported cells must
    show them)."""
    return "/?" + urlencode({"run": run_id, **params, "unsupported": "show"}, doseq=True)


def reason_key(reason: str) -> str:
    """What groups reasons: the first line with its numbers blanked."""
    return _NUMBER.sub("#", one_line(reason, 300))


def _groups(rows: Iterable[CellRecord], run_id: int, varying: set[str]) -> list[ReasonGroup]:
    found: dict[str, tuple[CellRecord, list[CellRecord]]] = {}
    for r in rows:
        k = reason_key(r.reason or r.status)
        if k in found:
            found[k][1].append(r)
        else:
            found[k] = (r, [r])
    out = []
    for first, members in found.values():
        shared = {a: str(first.axes.get(a)) for a in AXES if a in varying
                  and all(str(m.axes.get(a)) == str(first.axes.get(a)) for m in members)}
        statuses: list[str] = sorted({m.status for m in members})
        out.append(ReasonGroup(one_line(first.reason or first.status, 300), len(members), statuses, shared,
                               matrix_href(run_id, status=statuses, **shared)))
    out.sort(key=lambda g: (-g.cells, g.reason))
    return out


def support(rows: Sequence[CellRecord], run_id: int) -> Support:
    """The run's support summary, in one pass over its cells plus one over the failing and unsupported ones."""
    out = Support(Tally())
    per_axis: dict[str, dict[str, Tally]] = {a: {} for a in SUMMARY_AXES}
    filters: dict[str, dict[str, dict[str, str]]] = {a: {} for a in SUMMARY_AXES}  # each value's matrix filter
    failing, not_supported = [], []
    for r in rows:
        out.tally.add(r.status)
        engine = r.axes.get("engine")
        for a in SUMMARY_AXES:
            v = str(pivot_row(a, r.axes.get(a), engine))  # an SGLang cell's model is `model [sglang]`: never mixed
            t = per_axis[a].get(v)
            if t is None:
                t = per_axis[a][v] = Tally()
                shown = {a: str(r.axes.get(a))}
                filters[a][v] = shown if v == shown[a] else {**shown, "engine": str(engine)}
            t.add(r.status)
        c = status_class(r.status)
        if c == "not_run":
            not_supported.append(r)
        elif c == "fail":
            failing.append(r)
    for a, values in per_axis.items():
        out.by_axis[a] = [AxisValue(a, v, values[v], matrix_href(run_id, **filters[a][v]))
                          for v in sorted(values, key=natural_key)]
    varying = {a for a in AXES if len({str(r.axes.get(a)) for r in rows}) > 1}  # the others say nothing
    ns, fl = _groups(not_supported, run_id, varying), _groups(failing, run_id, varying)
    out.not_supported, out.not_supported_groups = ns[:MAX_REASONS], len(ns)
    out.failing, out.failing_groups = fl[:MAX_REASONS], len(fl)
    return out
