"""A run's rows as one flat table: every report reads this frame, so nested metrics are unpacked in one place.

Columns: key, one per axis, status, reason, duration_s, attempt, `speedup` (the geometric mean of the cell's
speedups over token counts), `speedup_<n>` per token count, `eager_ms_<n>` / `graph_ms_<n>` latencies, and
the scalar metrics of harness.cell.run_cell. Metric columns are float, NaN where a cell has no value (a cell
that failed before timing has an empty or partial metrics dict). The scalar columns are always present, so
an empty run still yields a frame with the same schema.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from harness.axes import AXES
from harness.reports.stats import geomean, is_positive_finite, natural_key

Row = Mapping[str, Any]

BASE_COLUMNS = ("key", *AXES, "status", "reason", "duration_s", "attempt")
# run_cell's scalar numbers, in the order a reader scans them.
SCALAR_METRICS = ("token_match", "max_prompt_logprob_diff", "max_output_logprob_diff", "capture_s", "compile_s",
                  "trace_s", "graph_pool_bytes", "pieces", "graphs_captured", "eager_fallbacks")
# Families of per-token-count columns, "<prefix><n>".
TOKEN_COLUMN_PREFIXES = ("speedup_", "eager_ms_", "graph_ms_", "latency_ms_")


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    return float(v)


def cell_speedup(metrics: Mapping[str, Any] | None) -> float | None:
    """The cell's speedup: geomean over token counts (or the number itself if stored as one number)."""
    sp = (metrics or {}).get("speedup")
    if isinstance(sp, Mapping):
        return geomean(_number(v) for v in sp.values())
    v = _number(sp)
    return v if v is not None and math.isfinite(v) and v > 0 else None


def graph_latencies(metrics: Mapping[str, Any] | None) -> dict[str, float]:
    """The cell's graph latency (ms) per token count, from run_cell's {"8": {"eager": ms, "graph": ms}}."""
    lat = (metrics or {}).get("latency_ms")
    if not isinstance(lat, Mapping):
        return {}
    return timings({n: v.get("graph") for n, v in lat.items() if isinstance(v, Mapping)})


def timings(per_count: Mapping[Any, Any]) -> dict[str, float]:
    """Per token count (as a string), the positive finite numbers only: a failed timing is no timing."""
    return {str(n): float(v) for n, v in per_count.items() if is_positive_finite(v)}


def flatten_metrics(metrics: Mapping[str, Any] | None) -> dict[str, float | None]:
    """One row's metrics as flat numeric columns."""
    metrics = metrics or {}
    out: dict[str, float | None] = {"speedup": cell_speedup(metrics)}
    sp = metrics.get("speedup")
    if isinstance(sp, Mapping):
        out.update({f"speedup_{n}": _number(v) for n, v in sp.items()})
    lat = metrics.get("latency_ms")
    if isinstance(lat, Mapping):
        for n, v in lat.items():
            if isinstance(v, Mapping):  # run_cell: {"8": {"eager": ms, "graph": ms}}
                out.update({f"{side}_ms_{n}": _number(ms) for side, ms in v.items() if side in ("eager", "graph")})
            else:
                out[f"latency_ms_{n}"] = _number(v)
    out.update({name: _number(metrics.get(name)) for name in SCALAR_METRICS})
    return out


def _token_columns(names: set[str]) -> list[str]:
    cols = []
    for prefix in TOKEN_COLUMN_PREFIXES:
        cols += sorted((c for c in names if c.startswith(prefix)), key=lambda c: natural_key(c[len(prefix):]))
    return cols


def results_frame(rows: Sequence[Row]) -> pd.DataFrame:
    """One row per cell, in input order."""
    records = []
    for r in rows:
        axes = r.get("axes") or {}
        rec: dict[str, Any] = {"key": r.get("key"), **{a: axes.get(a) for a in AXES},
                               "status": r.get("status") or "", "reason": r.get("reason") or "",
                               "duration_s": _number(r.get("duration_s")), "attempt": r.get("attempt")}
        rec.update(flatten_metrics(r.get("metrics")))
        records.append(rec)
    token_cols = _token_columns({k for rec in records for k in rec} - set(BASE_COLUMNS) - set(SCALAR_METRICS))
    columns = [*BASE_COLUMNS, "speedup", *token_cols, *SCALAR_METRICS]
    df = pd.DataFrame.from_records(records, columns=columns)
    numeric = ["duration_s", "speedup", *token_cols, *SCALAR_METRICS]
    df[numeric] = df[numeric].apply(pd.to_numeric, errors="coerce").astype("float64")
    df["attempt"] = pd.to_numeric(df["attempt"], errors="coerce").astype("Int64")
    for c in ("key", *AXES, "status", "reason"):  # object columns, missing as None (not str dtype's NaN)
        col = df[c].astype(object)
        df[c] = col.where(col.notna(), None)
    return df
