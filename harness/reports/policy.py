"""The nightly's verdict: which changes fail the night and which are only reported.

Measured on the H200: eager prefill timing swings 0.57–2.04× between two runs of the same code, while graph
latency stays within ±10% for 94% of points. So:
- **regression** (fails the night): a cell failing tonight that passed in every one of the last `keep` nightlies
  it ran in (at least one). A cell that was failing already, or is new, is a known failure: listed, not gating.
- **flaky** (recorded, never failing): a cell that failed and passed on the runner's retry (`pass_flaky`).
- **slowdown** (fails the night): a cell's graph latency (geomean over the token counts all the runs timed) whose
  median over the newest `window` nightlies, tonight included, exceeds the median over the `window` before them
  by more than `latency_threshold`. One noisy night moves one value of a median, not the median; a real
  slowdown has to last ⌈window/2⌉ nights to fail one, and fails every night after until it is fixed.
- eager-speedup changes against the last nightly: in the diff, never gating.
Statuses that do not fail a run (unsupported, skipped, eager_fail) never count as regressions either.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from harness.outcome import CellRecord, canonical_key
from harness.reports.frame import graph_latencies
from harness.reports.markdown import one_line, table
from harness.reports.stats import geomean, is_failing, is_passing, natural_key


@dataclass(frozen=True)
class Policy:
    """The thresholds and windows (matrix file `nightly:` block or `pcgh nightly` flags)."""

    keep: int = 3  # a regression passed in each of the last `keep` nightlies it ran in
    window: int = 3  # nightlies per median for the latency trend
    latency_threshold: float = 0.15  # relative graph-latency growth of the median that fails the night

    def __post_init__(self) -> None:
        if self.keep < 1 or self.window < 1 or not 0 <= self.latency_threshold <= 100:
            raise ValueError(f"nightly policy needs keep ≥ 1, window ≥ 1 and 0 ≤ latency_threshold ≤ 100, got {self}")


@dataclass(frozen=True)
class Regression:
    key: str
    status: str
    reason: str
    passed_in: int  # how many of the last nightlies it passed in (all it ran in)


@dataclass(frozen=True)
class Slowdown:
    key: str
    before_ms: float  # median geomean graph latency of the older window
    now_ms: float  # of the newest window, tonight included

    @property
    def rel_change(self) -> float:
        return self.now_ms / self.before_ms - 1


@dataclass
class NightlyVerdict:
    policy: Policy
    history_runs: int  # earlier nightlies of this matrix the verdict looked at
    regressions: list[Regression] = field(default_factory=list)
    slowdowns: list[Slowdown] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)
    known_failures: list[str] = field(default_factory=list)  # failing tonight, and not a regression

    @property
    def failed(self) -> bool:
        return bool(self.regressions or self.slowdowns)




def _slowdown(key: str, nights: list[CellRecord | None], policy: Policy) -> Slowdown | None:
    """nights: this cell's record per nightly, tonight first. Needs two full windows of passing, timed nights."""
    w = policy.window
    recent = nights[: 2 * w]
    if len(recent) < 2 * w or any(r is None or not is_passing(str(r.status)) for r in recent):
        return None
    latencies = [graph_latencies(r.metrics) for r in recent if r is not None]  # none is: checked above
    counts = set.intersection(*(set(lat) for lat in latencies))  # the token counts every night timed
    if not counts:
        return None
    values = cast(list[float], [geomean(lat[n] for n in counts) for lat in latencies])  # positive timings: never None
    now, before = statistics.median(values[:w]), statistics.median(values[w:])
    return Slowdown(key, before, now) if now > before * (1 + policy.latency_threshold) else None


def judge_night(tonight: Sequence[CellRecord], history: Sequence[Sequence[CellRecord]], policy: Policy = Policy()) -> NightlyVerdict:
    """The verdict on tonight's records against earlier nightlies of the same matrix (`history`, newest first,
    one final record per cell each, as the store hands them out)."""
    past = [{canonical_key(r.key): r for r in run} for run in history]  # an old spelling (quant=fp4) meets today's
    v = NightlyVerdict(policy, len(past))
    for r in sorted(tonight, key=lambda r: natural_key(r.key)):
        status = str(r.status)
        if status == "pass_flaky":
            v.flaky.append(r.key)
        ck = canonical_key(r.key)
        if is_failing(status):
            earlier = [run[ck] for run in past if ck in run][: policy.keep]
            if earlier and all(is_passing(str(e.status)) for e in earlier):
                v.regressions.append(Regression(r.key, status, r.reason, len(earlier)))
            else:
                v.known_failures.append(r.key)
            continue
        if (s := _slowdown(r.key, [r, *(run.get(ck) for run in past)], policy)) is not None:
            v.slowdowns.append(s)
    v.slowdowns.sort(key=lambda s: -s.rel_change)
    return v


def verdict_markdown(v: NightlyVerdict, records: Mapping[str, CellRecord] | None = None) -> str:
    """The verdict as Markdown: the gate first, then what is only reported."""
    p = v.policy
    head = ("**The night fails**" if v.failed else "**The night passes**") + (
        f": {len(v.regressions)} regression(s), {len(v.slowdowns)} slowdown(s)" if v.failed else "")
    parts = ["# Nightly verdict", head,
             f"Policy: a regression passed in each of the last {p.keep} nightlies it ran in; a slowdown is the median "
             f"graph latency of the newest {p.window} nightlies over the {p.window} before them beyond "
             f"+{100 * p.latency_threshold:.0f}%. Looked at {v.history_runs} earlier nightlies."]
    if v.regressions:
        parts += ["## Regressions", table(["cell", "status", "passed before in", "reason"],
                                          [(r.key, r.status, r.passed_in, one_line(r.reason) or "—") for r in v.regressions])]
    if v.slowdowns:
        parts += ["## Slowdowns", table(["cell", "before (median)", "now (median)", "change"],
                                        [(s.key, f"{s.before_ms:.3f} ms", f"{s.now_ms:.3f} ms", f"{100 * s.rel_change:+.1f}%")
                                         for s in v.slowdowns])]
    if v.flaky:
        parts += [f"## Flaky ({len(v.flaky)}): failed, then passed on retry — recorded, not failing",
                  "\n".join(f"- {k}" for k in v.flaky)]
    if v.known_failures:
        rows = [(k, str(records[k].status) if records and k in records else "", one_line(records[k].reason) if records and k in records else "")
                for k in v.known_failures]
        parts += [f"## Known failures ({len(v.known_failures)}): failing before too, or new — not gating",
                  table(["cell", "status", "reason"], rows)]
    return "\n\n".join(parts) + "\n"
