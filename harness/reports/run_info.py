"""What a run was run on: the fields a reader needs to trust or reproduce a result, and its wall time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from harness.store.models import PROVENANCE
from harness.store.rows import RunRow

# Run fields, in the order reports show them.
FIELDS = ("id", "name", "matrix", "status", "trigger", *PROVENANCE, "started_at", "finished_at")


def wall_time(run: RunRow | None) -> timedelta | None:
    """finished_at - started_at; None while the run is unfinished (or there is no run)."""
    if run is None or run.finished_at is None:
        return None
    return run.finished_at - run.started_at


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


def run_label(run: RunRow | None) -> str:
    """'nightly-2025-01-01 (#12)'."""
    return f"{run.name or 'unnamed run'} (#{run.id})" if run is not None else "unnamed run"


def run_field(run: RunRow | None, name: str) -> Any:
    """One of FIELDS of the run; None where there is no run."""
    return getattr(run, name) if run is not None else None
