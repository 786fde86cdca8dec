"""What a run was run on: the fields a reader needs to trust or reproduce a result, and its wall time."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from harness.store.models import PROVENANCE

# Run fields, in the order reports show them.
FIELDS = ("id", "name", "matrix", "status", "trigger", *PROVENANCE, "started_at", "finished_at")


def _as_datetime(v: Any) -> datetime | None:
    if isinstance(v, datetime):
        return v
    if isinstance(v, str):
        try:
            return datetime.fromisoformat(v)
        except ValueError:
            return None
    return None


def wall_time(run: Mapping[str, Any]) -> timedelta | None:
    """finished_at - started_at; None while the run is unfinished or the times cannot be compared."""
    start, end = _as_datetime(run.get("started_at")), _as_datetime(run.get("finished_at"))
    if start is None or end is None:
        return None
    try:
        return end - start
    except TypeError:  # one naive, one aware
        return None


def fmt_duration(d: timedelta | float | None) -> str:
    """1h 02m 03s, 4m 05s or 6.2s."""
    if d is None:
        return "n/a"
    s = d.total_seconds() if isinstance(d, timedelta) else float(d)
    if s < 60:
        return f"{s:.1f}s"
    h, rem = divmod(int(round(s)), 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def run_label(run: Mapping[str, Any] | None) -> str:
    """'nightly-2025-01-01 (#12)'."""
    if not run:
        return "unnamed run"
    name, rid = run.get("name") or "unnamed run", run.get("id")
    return f"{name} (#{rid})" if rid is not None else str(name)
