"""The run as plain JSON: what a dashboard or a later diff reads without pandas or the store.

Per cell it keeps the axes, status, reason, timings and the raw metrics; not the log (logs can be megabytes
and live in the store). Values are made JSON-native: datetimes as ISO 8601, NaN/inf as null, tuples as lists,
so json.loads(json.dumps(d)) == d.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from typing import Any

from harness.outcome import CellRecord
from harness.reports.frame import cell_speedup, result_rows
from harness.reports.run_info import FIELDS, run_field, wall_time
from harness.store.rows import RunRow
from harness.reports.stats import totals

SCHEMA_VERSION = 3  # 2: cells' metrics are CellMetrics (typed; only what was measured); 3: grouped by producer


def jsonable(v: Any) -> Any:
    """v as JSON-native values only."""
    if v is None or isinstance(v, (bool, str, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if isinstance(v, timedelta):
        return v.total_seconds()
    if isinstance(v, Mapping):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [jsonable(x) for x in v]
    if hasattr(v, "item"):  # numpy / pandas scalars
        return jsonable(v.item())
    return str(v)


def run_dict(run: RunRow | None) -> dict[str, Any]:
    """The run's provenance fields (all of FIELDS, None where there is no run) and its wall time in seconds."""
    d = {f: jsonable(run_field(run, f)) for f in FIELDS}
    wt = wall_time(run)
    d["wall_s"] = wt.total_seconds() if wt is not None else None
    return d


def cell_dict(record: CellRecord) -> dict[str, Any]:
    return jsonable({
        "key": record.key, "axes": dict(record.axes), "status": str(record.status), "reason": record.reason,
        "duration_s": record.duration_s, "attempt": record.attempt, "speedup": cell_speedup(record.metrics),
        "metrics": record.metrics.model_dump(mode="python", exclude_defaults=True),  # measured ones, as stored
    })


def report_dict(run: RunRow | None, rows: Sequence[CellRecord]) -> dict[str, Any]:
    """Provenance, counts by status, pass rate (null when nothing is counted), geomean speedup, cells."""
    t = totals(result_rows(rows))
    return jsonable({
        "schema": SCHEMA_VERSION,
        "run": run_dict(run),
        "cells_total": t.cells,
        "counts": t.counts,
        "passing": t.passing,
        "counted": t.counted,
        "not_counted": t.not_counted,
        "pass_rate": t.pass_rate,
        "geomean_speedup": t.geomean_speedup,
        "geomean_speedup_cells": t.speedup_cells,
        "cells": [cell_dict(r) for r in rows],
    })
