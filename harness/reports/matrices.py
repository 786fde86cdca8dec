"""Support matrices: which model works with which quant / attention / parallel / graph setting, at a glance.

One pivot per axis pair, models down, the other axis across; each entry is a symbol:

    ✅ pass    ⚠ pass_flaky    ❌ failing (counted, not passing: fail_*, timeout, oom, eager_nondeterministic)
    ❗ eager_fail (eager itself broke: not the graph's fault, not counted)
    ➖ unsupported or skipped    ❓ untested (the combination is not in the run)

The other axes vary inside one entry, so several cells aggregate into it: any failing → ❌; else any flaky → ⚠;
else any pass → ✅ (a pass next to unsupported siblings still shows the pair works); else any eager_fail → ❗;
else ➖. Rows and columns are naturally sorted so the CSVs of two runs line up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from harness.outcome import CellRecord
from harness.reports.frame import results_frame
from harness.reports.stats import natural_key, status_class

if TYPE_CHECKING:
    import pandas as pd

PAIRS: tuple[tuple[str, str], ...] = (("model", "quant"), ("model", "attention"), ("model", "parallel"),
                                      ("model", "graph"))
SYMBOLS = {"pass": "✅", "flaky": "⚠", "fail": "❌", "eager_fail": "❗", "not_run": "➖", "untested": "❓"}
# First class present wins.
PRECEDENCE = ("fail", "flaky", "pass", "eager_fail", "not_run")
LEGEND = ("✅ pass · ⚠ pass_flaky · ❌ failing · ❗ eager_fail (not counted) · ➖ unsupported/skipped · "
          "❓ untested")


def aggregate_symbol(statuses: Iterable[str]) -> str:
    """The symbol for one matrix entry from the statuses of all cells that fall into it."""
    classes = {status_class(s) for s in statuses}
    for c in PRECEDENCE:
        if c in classes:
            return SYMBOLS[c]
    return SYMBOLS["untested"]


def pair_name(row_axis: str, col_axis: str) -> str:
    """'model_x_graph': the dict key, and the CSV's name is support_<this>.csv."""
    return f"{row_axis}_x_{col_axis}"


def pivot_row(axis: str, value: Any, engine: Any) -> Any:
    """A row's label: a model whose cells ran on another engine than pcg's (SGLang) is a row of its own,
    `model [sglang]`, so that its verdicts never mix with pcg's in an entry."""
    return f"{value} [{engine}]" if axis == "model" and engine not in (None, "pcg") else value


def support_grid(cells: Iterable[tuple[Any, Any, str]]) -> tuple[list[str], list[str], dict[tuple[str, str], str]]:
    """(row values, column values, symbol per pair that occurs) from (row value, column value, status) triples,
    values as text, naturally sorted: the pivot without pandas (the text summary prints it as is)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r, c, s in cells:
        groups.setdefault((str(r), str(c)), []).append(s)
    index = sorted({r for r, _ in groups}, key=natural_key)
    columns = sorted({c for _, c in groups}, key=natural_key)
    return index, columns, {pair: aggregate_symbol(statuses) for pair, statuses in groups.items()}


def support_matrix(frame: pd.DataFrame, row_axis: str, col_axis: str) -> pd.DataFrame:
    """One pivot of symbols; ❓ where the combination never occurs."""
    import pandas as pd

    rows = [pivot_row(row_axis, v, e) for v, e in zip(frame[row_axis], frame["engine"])]
    index, columns, symbols = support_grid(zip(rows, frame[col_axis], frame["status"]) if len(frame) else ())
    out = pd.DataFrame(SYMBOLS["untested"], index=pd.Index(index, name=row_axis, dtype=object),
                       columns=pd.Index(columns, name=col_axis, dtype=object), dtype=object)
    for (r, c), symbol in symbols.items():
        out.loc[r, c] = symbol
    return out


def support_matrices(rows: Sequence[CellRecord] | pd.DataFrame) -> dict[str, pd.DataFrame]:
    """{"model_x_quant": pivot, ...} for every pair in PAIRS; takes rows or a results frame."""
    frame = results_frame(rows) if isinstance(rows, Sequence) else rows
    return {pair_name(a, b): support_matrix(frame, a, b) for a, b in PAIRS}
