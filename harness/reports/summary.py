"""summary.md: the page a person reads first after a run — can I trust it, did it pass, what broke, how fast.

Sections: provenance; result (pass rate over counted cells, geomean speedup over passing cells, counts by
status); worst cells (failing cells with their reasons, then the slowest passing speedups); cells left out of
the pass rate with their reasons grouped; the support matrices. Read from the results' rows (frame.result_rows),
not a frame: `pcgh report` prints this page, and pandas would be a third of its start-up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, cast

from harness.outcome import NOT_COUNTED, PASSING, CellRecord
from harness.reports.frame import result_rows, token_columns
from harness.reports.markdown import one_line, table
from harness.reports.matrices import LEGEND, PAIRS, SYMBOLS, pivot_row, support_grid
from harness.reports.run_info import fmt_duration, run_field, run_label, wall_time
from harness.store.rows import RunRow
from harness.reports.stats import fmt_rate, fmt_speedup, is_failing, totals

MAX_FAILING = 20  # failing cells listed in full; the rest are counted
MAX_SLOWEST = 5
MAX_EXAMPLES = 3  # cell keys shown per grouped reason
# Shown in this order; each explains why the cells are not held against the graph path.
NOT_COUNTED_TITLES = {
    "unsupported": ("Unsupported", "The model or setting is not supported here; not counted."),
    "eager_fail": ("Eager failures", "Eager itself failed, so the graph could not be judged; not counted."),
    "skipped": ("Skipped", "Not run; not counted."),
}
Rows = Sequence[Mapping[str, Any]]


def _number(v: Any) -> float | None:
    """A metric's value, None where there is none (missing, None, NaN), as the frame's NaN would have it."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def _provenance(run: RunRow | None, frame: Rows) -> str:
    def g(k: str) -> str:
        v = run_field(run, k)
        return "?" if v is None or v == "" else str(v)

    wt = wall_time(run)
    if wt is not None:
        duration = fmt_duration(wt)
    else:
        duration = "unfinished" if run is not None and run.finished_at is None else "n/a"
    times = [x for x in (_number(r["duration_s"]) for r in frame) if x is not None]
    if times:
        duration += f" (cells: {fmt_duration(math.fsum(times))} summed)"
    items = [("matrix", g("matrix")), ("status", g("status")), ("trigger", g("trigger")), ("git sha", g("git_sha")),
             ("torch", g("torch_version")), ("transformers", g("transformers_version")),
             ("CUDA / driver", f"{g('cuda_version')} / {g('driver_version')}"), ("GPU", g("gpu_name")),
             ("host", g("host")), ("started", g("started_at")), ("duration", duration)]
    return table(["", ""], items)


def _result(frame: Rows) -> str:
    t = totals(frame)
    if t.cells == 0:
        return "No cells in this run.\n\n**Pass rate: n/a** · **Geomean speedup: n/a**"
    rate = f"**Pass rate: {fmt_rate(t.pass_rate)}** ({t.passing} passing of {t.counted} counted"
    rate += f"; {t.not_counted} shown but not counted: {'/'.join(NOT_COUNTED)})" if t.not_counted else ")"
    speed = f"**Geomean speedup: {fmt_speedup(t.geomean_speedup)}**"
    if not t.speedup_measured:
        speed = (f"**Speedup: not measured on CPU** (no CUDA graphs are captured there; the {t.speedup_cells} passing "
                 "cell(s) with timings time eager against the uncaptured backend)")
    elif t.speedup_cells:
        speed += f" over {t.speedup_cells} passing cell(s) with timings"
    else:
        speed += " (no passing cell has timings)"
    counts = table(["status", "cells"], list(t.counts.items()))
    return f"{rate}\n\n{speed}\n\n{_reference(frame)}{counts}"


def _reference(frame: Rows) -> str:
    """The reference layer's verdicts (is eager right?), where the run's cells recorded one."""
    seen = [r["reference"] for r in frame if r.get("reference")]
    if not seen:
        return ""
    counts = {s: seen.count(s) for s in ("pass", "fail", "not_measured") if s in seen}
    words = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items())
    return f"**Reference layer** (eager against transformers and the kernels' reference math): {words}\n\n"


def _per_token(row: Mapping[str, Any], token_cols: list[str]) -> str:
    cols = [c for c in token_cols if c.startswith("speedup_") and _number(row.get(c)) is not None]
    return ", ".join(f"{c[len('speedup_'):]}: {_number(row[c]):.2f}×" for c in cols)


def _worst(frame: Rows) -> str:
    failing = [r for r in frame if is_failing(r["status"])]
    parts = [f"### Failing ({len(failing)})"]
    if failing:
        shown = failing[:MAX_FAILING]
        parts.append(table(["cell", "status", "reason"],
                           [(r["key"], r["status"], one_line(r["reason"]) or "—") for r in shown]))
        if len(failing) > MAX_FAILING:
            parts.append(f"… and {len(failing) - MAX_FAILING} more (see report.json).")
    else:
        parts.append("None.")
    timed = [r for r in frame if r["status"] in PASSING and _number(r.get("speedup")) is not None]
    slow = sorted(timed, key=lambda r: cast(float, _number(r["speedup"])))[:MAX_SLOWEST]  # never None: filtered above  # stable: ties in run order
    parts.append(f"### Slowest speedups (passing cells, lowest {MAX_SLOWEST})")
    if slow:
        token_cols = token_columns(frame)
        rows = [(r["key"], r["status"], fmt_speedup(_number(r["speedup"])), _per_token(r, token_cols)) for r in slow]
        parts.append(table(["cell", "status", "speedup", "per token count"], rows))
    else:
        parts.append("No passing cell has timings.")
    return "\n\n".join(parts)


def _not_counted(frame: Rows) -> str:
    parts = []
    for status in [*NOT_COUNTED_TITLES, *(s for s in NOT_COUNTED if s not in NOT_COUNTED_TITLES)]:
        sub = [r for r in frame if r["status"] == status]
        if not sub:
            continue
        groups: dict[str, list[str]] = {}
        for r in sub:
            groups.setdefault(one_line(r["reason"]) or "(no reason given)", []).append(str(r["key"]))
        lines = []
        for reason, keys in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            more = f", … +{len(keys) - MAX_EXAMPLES}" if len(keys) > MAX_EXAMPLES else ""
            lines.append(f"- {len(keys)} × {reason} — e.g. {', '.join(keys[:MAX_EXAMPLES])}{more}")
        title, why = NOT_COUNTED_TITLES.get(status, (status, "Not counted."))
        parts.append(f"## {title} ({len(sub)})\n\n{why}\n\n" + "\n".join(lines))
    return "\n\n".join(parts)


def _matrices(frame: Rows) -> str:
    parts = ["## Support matrices", LEGEND]
    for row_axis, col_axis in PAIRS:  # the pivots of matrices.support_matrices, printed without a frame
        index, columns, symbols = support_grid((pivot_row(row_axis, r[row_axis], r.get("engine")), r[col_axis], r["status"])
                                               for r in frame)
        parts.append(f"### {row_axis} × {col_axis}")
        rows = [(i, *(symbols.get((i, c), SYMBOLS["untested"]) for c in columns)) for i in index]
        parts.append(table([row_axis, *columns], rows) if index and columns else "No cells.")
    return "\n\n".join(parts)


def summary_markdown(run: RunRow | None, rows: Sequence[CellRecord]) -> str:
    """The whole summary page as Markdown."""
    frame = result_rows(rows)
    sections = [f"# pcg compatibility run: {run_label(run)}", _provenance(run, frame), "## Result", _result(frame),
                "## Worst cells", _worst(frame), _not_counted(frame), _matrices(frame)]
    return "\n\n".join(s for s in sections if s) + "\n"
