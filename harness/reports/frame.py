"""A run's records as one flat table: every report reads this frame, so nested metrics are unpacked in one place.

Columns: key, one per axis, status, reason, duration_s, attempt, `speedup` (the geometric mean of the cell's
speedups over token counts), `speedup_<n>` per token count, `eager_ms_<n>` / `graph_ms_<n>` latencies, and
the scalar metrics of a CellMetrics. Metric columns are float, NaN where a cell has no value (a cell that
ended before measuring). The scalar columns are always present, so an empty run still yields a frame with
the same schema. `result_rows` are the same rows as plain dicts, for the readers that need no frame (the text
summary, the JSON): pandas (a third of a second to import) loads only where a frame is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from harness.metrics import SCALAR_METRICS, CellMetrics
from harness.outcome import AXES, CellRecord
from harness.reports.stats import geomean, is_positive_finite, natural_key

if TYPE_CHECKING:
    import pandas as pd

BASE_COLUMNS = ("key", *AXES, "status", "reason", "duration_s", "attempt")
# Families of per-token-count columns, "<prefix><n>".
TOKEN_COLUMN_PREFIXES = ("speedup_", "eager_ms_", "graph_ms_")


def cell_speedup(metrics: CellMetrics) -> float | None:
    """The cell's speedup: geomean over its token counts (None when nothing was timed)."""
    return geomean(metrics.latency.speedup.values())


def graph_latencies(metrics: CellMetrics) -> dict[str, float]:
    """The cell's graph latency (ms) per token count (as a string), measured ones only."""
    return timings(metrics.latency.graph_latencies())


def timings(per_count: Mapping[Any, Any]) -> dict[str, float]:
    """Per token count (as a string), the positive finite numbers only: a failed timing is no timing."""
    return {str(n): float(v) for n, v in per_count.items() if is_positive_finite(v)}


def flatten_metrics(metrics: CellMetrics) -> dict[str, float | None]:
    """One record's metrics as flat numeric columns."""
    out: dict[str, float | None] = {"speedup": cell_speedup(metrics)}
    out.update({f"speedup_{n}": v for n, v in metrics.latency.speedup.items()})
    for n, lat in metrics.latency.latency_ms.items():
        out[f"eager_ms_{n}"], out[f"graph_ms_{n}"] = lat.eager, lat.graph
    out.update({name: metrics.value(name) for name in SCALAR_METRICS})
    return out


def _token_columns(names: set[str]) -> list[str]:
    cols = []
    for prefix in TOKEN_COLUMN_PREFIXES:
        cols += sorted((c for c in names if c.startswith(prefix)), key=lambda c: natural_key(c[len(prefix):]))
    return cols


def result_rows(records: Sequence[CellRecord]) -> list[dict[str, Any]]:
    """The frame's rows as dicts, in input order; a metric a cell lacks is a missing key (None or NaN where the
    cell stored one), not a NaN column."""
    rows = []
    for r in records:
        row: dict[str, Any] = {"key": r.key, **{a: r.axes.get(a) for a in AXES}, "status": str(r.status),
                               "reason": r.reason, "duration_s": r.duration_s, "attempt": r.attempt}
        row.update(flatten_metrics(r.metrics))
        row["reference"] = r.metrics.judge.reference.status if r.metrics.judge.reference else None  # the judge's reference layer
        rows.append(row)
    return rows


def token_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-token-count columns of these rows, in the frame's order."""
    return _token_columns({k for row in rows for k in row} - set(BASE_COLUMNS) - set(SCALAR_METRICS))


def results_frame(records: Sequence[CellRecord]) -> pd.DataFrame:
    """One row per cell, in input order."""
    import pandas as pd

    rows = result_rows(records)
    token_cols = token_columns(rows)
    columns = [*BASE_COLUMNS, "speedup", *token_cols, *SCALAR_METRICS]
    df = pd.DataFrame.from_records(rows, columns=columns)
    numeric = ["duration_s", "speedup", *token_cols, *SCALAR_METRICS]
    df[numeric] = df[numeric].apply(pd.to_numeric, errors="coerce").astype("float64")
    df["attempt"] = pd.to_numeric(df["attempt"], errors="coerce").astype("Int64")
    for c in ("key", *AXES, "status", "reason"):  # object columns, missing as None (not str dtype's NaN)
        col = df[c].astype(object)
        df[c] = col.where(col.notna(), None)
    return df
