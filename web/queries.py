"""The dashboard's reads and writes: runs, requests and uploads through the Store; wide reads in one query each.

The Store is the harness's one way in and out, and everything it offers is used as is (runs, run, latest run,
creating runs, recording results, requests). What it does not offer, and a 10,000-cell matrix needs, lives
here as plain SQLAlchemy Core over the Store's own tables:

- only the final attempt of each cell, chosen in SQL (NOT EXISTS a later attempt; the unique index on
  (run_id, key, attempt) answers it), instead of every attempt shipped and sorted in Python;
- no log column: logs are up to 200,000 characters each and only the cell page shows one;
- only the metrics a page shows (speedup, capture seconds, pool bytes, token match; latency for the diff)
  extracted from the JSON on the database side: run_cell's metrics dict is ~1 kB, and decoding 10,000 of them
  costs more than the page.

Every function returns plain values (dicts, dataclasses), never ORM objects, like the Store does.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, Text, and_, cast, exists, func, null, select, update
from sqlalchemy.orm import aliased

from harness.store import Store
from harness.store.db import make_engine
from harness.store.models import CellResult, Run

REASON_CHARS = 400  # of a reason, enough for the one-line tooltips and tables; the cell page reads it whole
SHOWN_METRICS = ("capture_s", "graph_pool_bytes", "token_match")


@dataclass(slots=True)
class CellRow:
    """One cell's final attempt in one run, with just what the matrix, diff and run pages show."""

    key: str
    axes: dict[str, str]
    status: str
    reason: str
    speedups: dict[str, Any] | float | None  # metrics["speedup"] as stored: {tokens: x} or one number
    latencies: dict[str, Any] | None  # metrics["latency_ms"] as stored ({tokens: {"eager": ms, "graph": ms}}), if asked
    capture_s: float | None
    graph_pool_bytes: float | None
    token_match: float | None
    duration_s: float | None
    attempt: int

    def as_row(self) -> dict[str, Any]:
        """The row shape harness/reports reads (metrics cut to speedup and latency, all the diff uses)."""
        return {"key": self.key, "axes": self.axes, "status": self.status, "reason": self.reason,
                "metrics": {"speedup": self.speedups, "latency_ms": self.latencies}, "duration_s": self.duration_s,
                "attempt": self.attempt}


@dataclass
class HistoryRow:
    """One run's final attempt at one cell, for the cell page; `attempts` counts every attempt in that run."""

    run_id: int
    run_name: str
    started_at: datetime | None
    trigger: str
    status: str
    reason: str
    metrics: dict[str, Any]
    duration_s: float | None
    attempts: int
    axes: dict[str, str] = field(default_factory=dict)


def _final() -> Any:
    """WHERE clause: this row is the highest attempt of its (run, key)."""
    later = aliased(CellResult)
    return ~exists().where(and_(later.run_id == CellResult.run_id, later.key == CellResult.key,
                                later.attempt > CellResult.attempt))


def _float(text: str | None) -> float | None:
    """A JSON scalar extracted as text ("0.8", "NaN") as a float; None for anything not a number."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _speedups(text: str | None) -> Any:
    """metrics["speedup"] extracted as text: a JSON object or number; a bare string (what a JSON string
    extracts to) is kept as is, and the reports' speedup then ignores it."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _json_object(text: str | None) -> dict[str, Any] | None:
    """A JSON object extracted as text, parsed; None for anything else."""
    try:
        v = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


def as_number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class Queries:
    """Reads over one database; shares the Store's URL (and so its JSON encoding) but keeps its own engine."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.engine: Engine = make_engine(store.url)

    def close(self) -> None:
        self.engine.dispose()

    # --- runs -----------------------------------------------------------------------------------------------

    def status_counts(self, run_ids: list[int]) -> dict[int, Counter[str]]:
        """Final-attempt cells by status, per run, in one GROUP BY."""
        out: dict[int, Counter[str]] = {rid: Counter() for rid in run_ids}
        if not run_ids:
            return out
        q = (select(CellResult.run_id, CellResult.status, func.count())
             .where(CellResult.run_id.in_(run_ids), _final())
             .group_by(CellResult.run_id, CellResult.status))
        with self.engine.connect() as conn:
            for run_id, status, n in conn.execute(q):
                out[run_id][status] = n
        return out

    def newest_run(self, trigger: str) -> dict[str, Any] | None:
        """The newest run with this trigger (the Store filters by name and matrix only)."""
        q = select(Run).where(Run.trigger == trigger).order_by(Run.id.desc()).limit(1)
        with self.engine.connect() as conn:
            row = conn.execute(q).mappings().first()
        return dict(row) if row is not None else None

    def previous_run_id(self, run_id: int) -> int | None:
        """The run created just before this one, the natural base of a diff."""
        q = select(func.max(Run.id)).where(Run.id < run_id)
        with self.engine.connect() as conn:
            return conn.execute(q).scalar()

    def set_times(self, run_id: int, started_at: datetime | None, finished_at: datetime | None) -> None:
        """Keep an uploaded run's own start/finish times (the Store stamps creation and finishing with now)."""
        values = {k: v for k, v in (("started_at", started_at), ("finished_at", finished_at)) if v is not None}
        if values:
            with self.engine.begin() as conn:
                conn.execute(update(Run).where(Run.id == run_id).values(**values))

    # --- cells ----------------------------------------------------------------------------------------------

    def cells(self, run_id: int, latency: bool = False) -> list[CellRow]:
        """Every cell of a run (final attempts), in recording order, in one query without logs; with `latency`,
        also metrics["latency_ms"] (the diff compares graph latency; the other pages do without its cost).

        JSON comes back as text and is parsed with plain json.loads: the Store's deserializer also walks every
        value to turn "NaN" strings back into floats, which costs more than the parse and matters for neither
        axes (strings) nor speedups (a "NaN" string is left out of the geomean just as a NaN float is).
        """
        m = CellResult.metrics
        q = (select(CellResult.key, cast(CellResult.axes, Text), CellResult.status,
                    func.substr(CellResult.reason, 1, REASON_CHARS), m["speedup"].as_string(),
                    m["latency_ms"].as_string() if latency else null(),
                    *(m[name].as_string() for name in SHOWN_METRICS), CellResult.duration_s, CellResult.attempt)
             .where(CellResult.run_id == run_id, _final())
             .order_by(CellResult.id))
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        return [CellRow(key, json.loads(axes) if axes else {}, status, reason or "", _speedups(speedup),
                        _json_object(latency), _float(cap), _float(pool), _float(tm), dur, attempt)
                for key, axes, status, reason, speedup, latency, cap, pool, tm, dur, attempt in rows]

    def model_counts(self, run_id: int) -> dict[str, Counter[str]]:
        """Final-attempt cells by status per model-axis value ("card:variant") of one run, in one GROUP BY."""
        model = CellResult.axes["model"].as_string()
        q = (select(model, CellResult.status, func.count()).where(CellResult.run_id == run_id, _final())
             .group_by(model, CellResult.status))
        out: dict[str, Counter[str]] = {}
        with self.engine.connect() as conn:
            for m, status, n in conn.execute(q):
                out.setdefault(str(m), Counter())[status] = n
        return out

    def history(self, key: str) -> list[HistoryRow]:
        """The cell in every run that has it, oldest run first; one query over every attempt (retries are few)."""
        q = (select(CellResult.run_id, Run.name, Run.started_at, Run.trigger, CellResult.status, CellResult.reason,
                    CellResult.metrics, CellResult.duration_s, CellResult.attempt, CellResult.axes)
             .join(Run, Run.id == CellResult.run_id)
             .where(CellResult.key == key)
             .order_by(CellResult.run_id, CellResult.attempt))
        by_run: dict[int, HistoryRow] = {}
        with self.engine.connect() as conn:
            for run_id, name, started, trigger, status, reason, metrics, dur, attempt, axes in conn.execute(q):
                attempts = by_run[run_id].attempts + 1 if run_id in by_run else 1
                by_run[run_id] = HistoryRow(run_id, name, started, trigger, status, reason or "", metrics or {},
                                            dur, attempts, axes or {})
        return list(by_run.values())

    def log(self, run_id: int, key: str) -> str:
        """The final attempt's log: the one wide column, read for one cell only."""
        q = select(CellResult.log).where(CellResult.run_id == run_id, CellResult.key == key, _final())
        with self.engine.connect() as conn:
            return conn.execute(q).scalar() or ""

    # --- requests -------------------------------------------------------------------------------------------

    def requests(self) -> list[dict[str, Any]] | None:
        """The model-request queue from the Store, or None while this Store has no requests table yet."""
        read = getattr(self.store, "requests", None)
        return list(read()) if callable(read) else None
