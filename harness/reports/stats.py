"""Status classes and the arithmetic every report shares, so the summary, the JSON, the matrices and the diff
can never disagree about what passed, what counts and what the speedup is.

A status is one of five classes: pass, flaky (pass_flaky: passing, but shown apart), fail (counted and not
passing, including eager_nondeterministic and any status this module does not know), eager_fail, and not_run
(unsupported, skipped). The pass rate is passing / counted, where counted leaves out NOT_COUNTED.
"""

from __future__ import annotations

import math
import numbers
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.outcome import NOT_COUNTED, PASSING, STATUSES

if TYPE_CHECKING:
    import pandas as pd


def is_passing(status: str) -> bool:
    """pass or pass_flaky."""
    return status in PASSING


def is_counted(status: str) -> bool:
    """Counted against the pass rate: everything but eager_fail, unsupported and skipped."""
    return status not in NOT_COUNTED


def is_failing(status: str) -> bool:
    """Counted and not passing: the graph path's fault (unknown statuses land here, loudly, not silently)."""
    return is_counted(status) and not is_passing(status)


def status_class(status: str) -> str:
    """One of pass, flaky, fail, eager_fail, not_run."""
    if status == "pass_flaky":
        return "flaky"
    if is_passing(status):
        return "pass"
    if status == "eager_fail":
        return "eager_fail"
    if status in NOT_COUNTED:
        return "not_run"
    return "fail"


def ordered_statuses(statuses: Iterable[str]) -> list[str]:
    """Distinct statuses in STATUSES order; unknown ones after, alphabetically."""
    rank = {s: i for i, s in enumerate(STATUSES)}
    return sorted(set(statuses), key=lambda s: (rank.get(s, len(rank)), s))


def geomean(values: Iterable[Any]) -> float | None:
    """Geometric mean of the positive finite numbers among values; None when there are none.

    Speedups are ratios, so their mean is geometric. None, NaN, inf and non-positive values (a timing that
    failed) are left out rather than poisoning the mean.
    """
    vals = [float(v) for v in values if is_positive_finite(v)]
    if len(vals) <= 1:  # a single timing is returned as is, not through exp(log(x))'s rounding
        return vals[0] if vals else None
    return math.exp(math.fsum(math.log(v) for v in vals) / len(vals))


def is_positive_finite(v: Any) -> bool:
    if type(v) is float:  # nearly every value: skip the abstract-base-class checks, 3× the cost of the rest
        return 0 < v < math.inf
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v > 0  # type: ignore[operator]  # typeshed's numbers.Real types no comparison with an int


def natural_key(value: Any) -> tuple:
    """Sort key that puts "trim:4" before "trim:16" and "tp2" before "tp8"."""
    parts = re.split(r"(\d+)", str(value))
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts)


@dataclass(frozen=True)
class Totals:
    """The headline numbers of one run."""

    counts: dict[str, int]
    cells: int
    passing: int
    counted: int
    not_counted: int
    pass_rate: float | None  # None when nothing is counted
    geomean_speedup: float | None  # over passing cells that have a speedup
    speedup_cells: int
    # CUDA graphs the passing cells with a speedup captured, summed; None where none recorded it (older runs). 0 is
    # a CPU run: no graph is captured there, so its "speedup" times eager against the uncaptured backend.
    graphs_captured: int | None = None

    @property
    def speedup_measured(self) -> bool:
        """Whether the geomean speedup is one of graphs: not on CPU, where nothing is captured."""
        return self.graphs_captured != 0


def totals(frame: pd.DataFrame | Sequence[Mapping[str, Any]]) -> Totals:
    """Totals from a results frame or its rows (frame.results_frame, frame.result_rows)."""
    if isinstance(frame, Sequence):
        statuses, speedups = [r["status"] for r in frame], [r.get("speedup") for r in frame]
        graphs = [r.get("graphs_captured") for r in frame]
    else:
        statuses, speedups = list(frame["status"]), list(frame["speedup"])
        graphs = list(frame["graphs_captured"]) if "graphs_captured" in frame else [None] * len(statuses)
    c = Counter(statuses)
    passing = sum(1 for s in statuses if is_passing(s))
    counted = sum(1 for s in statuses if is_counted(s))
    # None and NaN (no timing) are left out by geomean and by the count, as any non-positive or infinite value
    passing_speedups = [v for s, v in zip(statuses, speedups) if s in PASSING]
    g = geomean(passing_speedups)
    captured = [n for s, v, n in zip(statuses, speedups, graphs)
                if s in PASSING and is_positive_finite(v) and isinstance(n, numbers.Real) and math.isfinite(n)]
    return Totals(
        counts={s: c[s] for s in ordered_statuses(statuses)},
        cells=len(statuses),
        passing=passing,
        counted=counted,
        not_counted=len(statuses) - counted,
        pass_rate=passing / counted if counted else None,
        geomean_speedup=g,
        speedup_cells=sum(1 for v in passing_speedups if is_positive_finite(v)),
        graphs_captured=int(sum(captured)) if captured else None,  # type: ignore[arg-type]  # typeshed's numbers.Real: no __int__
    )


def fmt_rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.1f}%"


def fmt_speedup(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}×"
