"""Two runs compared cell by cell (matched by key): what a nightly must flag before anyone reads the details.

A new failure is a cell that passed (pass or pass_flaky) in base and fails in head — counted and not passing.
A head status of unsupported, skipped or eager_fail is not a failure of the graph path, so such a change is a
flip, not a new failure; likewise a change between two failing statuses or between pass and pass_flaky.
For cells passing in both runs, a speedup change is a geomean speedup that moved by more than the threshold,
relatively, either way, and a graph latency change the same for the graph path's own latency — both geomeans
over the token counts both runs timed. Graph latency is the steadier signal: the eager side of a speedup is
launch-bound and swings from one process to the next. Only new failures make `has_regression` true; slowdowns
are listed, not gated, because timings on shared machines are noisy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from harness.outcome import CellRecord, canonical_key
from harness.reports.frame import graph_latencies, timings
from harness.reports.markdown import one_line, table
from harness.reports.run_info import FIELDS, run_field, run_label
from harness.store.rows import RunRow
from harness.reports.stats import fmt_speedup, geomean, is_failing, is_passing, natural_key


@dataclass(frozen=True)
class StatusChange:
    key: str
    axes: Mapping[str, Any]
    base_status: str
    head_status: str
    reason: str  # head's reason


@dataclass(frozen=True)
class ValueChange:
    """One number of a cell passing in both runs, base vs head."""

    key: str
    axes: Mapping[str, Any]
    base: float
    head: float

    @property
    def rel_change(self) -> float:
        """head / base - 1."""
        return self.head / self.base - 1


class SpeedupChange(ValueChange):
    """Geomean speedup over eager (×); a negative rel_change is slower."""


class LatencyChange(ValueChange):
    """Geomean graph latency (ms); a positive rel_change is slower."""


@dataclass
class RunDiff:
    new_failures: list[StatusChange] = field(default_factory=list)
    fixes: list[StatusChange] = field(default_factory=list)
    flips: list[StatusChange] = field(default_factory=list)
    speedup_changes: list[SpeedupChange] = field(default_factory=list)  # slowest-going first
    latency_changes: list[LatencyChange] = field(default_factory=list)  # most slowed-down first
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    speedup_threshold: float = 0.10

    @property
    def has_regression(self) -> bool:
        return bool(self.new_failures)

    @property
    def slowdowns(self) -> list[SpeedupChange]:
        return [c for c in self.speedup_changes if c.rel_change < 0]


def _common_geomeans(base: Mapping[str, float], head: Mapping[str, float]) -> tuple[float | None, float | None]:
    """Geomeans of both over the token counts both timed (a count timed in one run only would move its
    geomean by itself)."""
    common = base.keys() & head.keys()
    return geomean(base[n] for n in common), geomean(head[n] for n in common)


def _beyond(kind: type[V], key: str, axes: Mapping[str, Any], values: tuple[float | None, float | None],
            threshold: float) -> V | None:
    """A change of `kind` when both values exist and moved by more than the threshold, relatively."""
    base, head = values
    if base is None or head is None or abs(head / base - 1) <= threshold:
        return None
    return kind(key, axes, base, head)


V = TypeVar("V", bound=ValueChange)


def diff_runs(base_records: Sequence[CellRecord], head_records: Sequence[CellRecord], speedup_threshold: float = 0.10) -> RunDiff:
    """Compare base with head (each one final record per cell, as the store hands them out); status lists sorted
    by key, speedup changes by relative change (most slowed-down first), graph latency changes by relative change
    (most slowed-down first)."""
    if speedup_threshold < 0:
        raise ValueError(f"speedup_threshold must be >= 0, got {speedup_threshold}")
    # Matched by the key in today's spelling (a run stored with quant=fp4 meets one with nvfp4), shown as stored.
    base = {canonical_key(r.key): r for r in base_records}
    head = {canonical_key(r.key): r for r in head_records}
    d = RunDiff(speedup_threshold=speedup_threshold)
    d.added = sorted((head[k].key for k in head.keys() - base.keys()), key=natural_key)
    d.removed = sorted((base[k].key for k in base.keys() - head.keys()), key=natural_key)
    for same in sorted(base.keys() & head.keys(), key=lambda k: natural_key(head[k].key)):
        b, h = base[same], head[same]
        key = h.key
        bs, hs = str(b.status), str(h.status)
        axes = dict(h.axes)
        if bs != hs:
            change = StatusChange(key, axes, bs, hs, h.reason)
            if is_passing(bs) and is_failing(hs):
                d.new_failures.append(change)
            elif is_failing(bs) and is_passing(hs):
                d.fixes.append(change)
            else:
                d.flips.append(change)
        if is_passing(bs) and is_passing(hs):
            mb, mh = b.metrics, h.metrics
            speedups = _common_geomeans(timings(mb.latency.speedup), timings(mh.latency.speedup))
            if (c := _beyond(SpeedupChange, key, axes, speedups, speedup_threshold)) is not None:
                d.speedup_changes.append(c)
            latencies = _common_geomeans(graph_latencies(mb), graph_latencies(mh))
            if (lc := _beyond(LatencyChange, key, axes, latencies, speedup_threshold)) is not None:
                d.latency_changes.append(lc)
    d.speedup_changes.sort(key=lambda c: c.rel_change)
    d.latency_changes.sort(key=lambda c: -c.rel_change)
    return d


def _changes(changes: list[StatusChange]) -> str:
    return table(["cell", "base → head", "head reason"],
                 [(c.key, f"{c.base_status} → {c.head_status}", one_line(c.reason) or "—") for c in changes])


def _provenance_changes(base_run: RunRow | None, head_run: RunRow | None) -> str:
    fields = [f for f in FIELDS if f not in ("id", "name", "status", "trigger", "started_at", "finished_at")]
    changed = [(f, b, h) for f in fields if (b := run_field(base_run, f)) != (h := run_field(head_run, f))]
    return table(["", "base", "head"], changed) if changed else ""


def diff_markdown(diff: RunDiff, base_run: RunRow | None, head_run: RunRow | None) -> str:
    """The diff as Markdown: verdict, what changed in the setup, new failures first, then the rest."""
    parts = [f"# Run diff: {run_label(base_run)} → {run_label(head_run)}"]
    n = len(diff.new_failures)
    parts.append(f"**Regression: {n} new failure(s).**" if diff.has_regression else "**No new failures.**")
    parts.append(f"{n} new failure(s) · {len(diff.fixes)} fix(es) · {len(diff.flips)} other status change(s) · "
                 f"{len(diff.speedup_changes)} speedup and {len(diff.latency_changes)} graph latency change(s) beyond "
                 f"±{100 * diff.speedup_threshold:.0f}% · "
                 f"{len(diff.added)} added · {len(diff.removed)} removed")
    prov = _provenance_changes(base_run, head_run)
    if prov:
        parts += ["## Setup changes", prov]
    parts += ["## New failures", _changes(diff.new_failures) if diff.new_failures else "None."]
    if diff.fixes:
        parts += ["## Fixes", _changes(diff.fixes)]
    if diff.flips:
        parts += ["## Other status changes", _changes(diff.flips)]
    if diff.speedup_changes:
        rows = [(c.key, fmt_speedup(c.base), fmt_speedup(c.head), f"{100 * c.rel_change:+.1f}%")
                for c in diff.speedup_changes]
        parts += ["## Speedup changes", table(["cell", "base", "head", "change"], rows)]
    if diff.latency_changes:
        rows = [(c.key, f"{c.base:.2f} ms", f"{c.head:.2f} ms", f"{100 * c.rel_change:+.1f}%")
                for c in diff.latency_changes]
        parts += ["## Graph latency changes", "Geomean over the token counts both runs timed; slower first.",
                  table(["cell", "base", "head", "change"], rows)]
    if diff.added:
        parts += [f"## Added ({len(diff.added)})", "\n".join(f"- {k}" for k in diff.added)]
    if diff.removed:
        parts += [f"## Removed ({len(diff.removed)})", "\n".join(f"- {k}" for k in diff.removed)]
    return "\n\n".join(parts) + "\n"
