"""The dashboard's wide reads, on the Store's engine (`Store.views`): what a 10,000-cell page needs in one query.

Compared with Store.results these leave out what the pages never show at that scale: no log column (up to
200,000 characters each; `log` reads one), a reason cut to REASON_CHARS, and only the metrics the pages show
pulled out of the JSON by the database (decoding 10,000 full metrics dicts costs more than the page). The
final attempt of each cell is chosen in SQL by the Store's one rule (models.final_attempt). Cells come back
as CellRecords whose metrics hold only those fields; nothing here hands out ORM objects.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError
from sqlalchemy import ColumnElement, Connection, Engine, SQLColumnExpression, Text, and_, cast, func, literal_column, select
from sqlalchemy.exc import SQLAlchemyError

from harness.metrics import GROUP_OF
from harness.outcome import CellRecord, key_spellings
from harness.store.models import CellResult, Run, RunAggregate, RunCounts, final_attempt, first_recorded

T = TypeVar("T")
log = logging.getLogger(__name__)
_STATUSES: TypeAdapter[dict[str, str]] = TypeAdapter(dict[str, str])

REASON_CHARS = 400  # of a reason, enough for the one-line tooltips and tables; the cell page reads it whole
# besides speedup (and latency for a diff); graphs_captured tells a CPU run's timings from a graph speedup
SHOWN_METRICS = ("capture_s", "graph_pool_bytes", "token_match", "graphs_captured")
# The columns of a CellRecord, log aside: the Store adds it where a reader wants it.
RECORD_COLUMNS = (CellResult.key, CellResult.axes, CellResult.status, CellResult.reason, CellResult.metrics,
                  CellResult.duration_s, CellResult.attempt)


def record_of(row: Mapping[Any, Any]) -> CellRecord:
    """A stored row as a CellRecord. Metrics written before CellMetrics existed carry keys it no longer has
    (the axes) and token counts as strings: the first are ignored, the second read as ints; a value of the wrong
    shape is dropped (CellRecord.read), never the row."""
    return CellRecord.read({"key": row["key"], "axes": row["axes"], "status": row["status"], "reason": row["reason"] or "",
                            "metrics": row["metrics"] or {}, "duration_s": row["duration_s"] or 0.0,
                            "attempt": row["attempt"], "log": row.get("log") or ""})


def _parse(text: str) -> CellRecord:
    """A record the database built as JSON text; parsed in one go, and leniently only when that fails."""
    try:
        return CellRecord.model_validate_json(text)
    except ValidationError:
        return CellRecord.read(json.loads(text))


def tally(conn: Connection, run_ids: list[int]) -> dict[int, Counter[str]]:
    """Final-attempt cells by status, per run, counted in one GROUP BY: what RunCounts keeps precounted."""
    out: dict[int, Counter[str]] = {rid: Counter() for rid in run_ids}
    if run_ids:
        q = (select(CellResult.run_id, CellResult.status, func.count())
             .where(CellResult.run_id.in_(run_ids), final_attempt())
             .group_by(CellResult.run_id, CellResult.status))
        for run_id, status, n in conn.execute(q):
            out[run_id][status] = n
    return out


@dataclass(frozen=True)
class HistoryPoint:
    """One run's final attempt at one cell (log left out); `attempts` counts every attempt in that run."""

    run_id: int
    run_name: str
    started_at: datetime | None
    trigger: str
    attempts: int
    record: CellRecord


def _record_json(dialect: str, latency: bool) -> ColumnElement[str]:
    """SQL that builds a row's CellRecord as one JSON text, metrics cut to the shown ones (absent ones null).

    The database assembles it in C and pydantic parses it in Rust: no per-value json.loads in Python, which cost
    more than the rest of the matrix page. The Store's "NaN" strings stay strings; CellMetrics reads them as floats.
    """
    axes: SQLColumnExpression[Any]
    empty: SQLColumnExpression[Any]
    if dialect == "postgresql":
        build, axes, empty = func.json_build_object, CellResult.axes, literal_column("'{}'::json")
        path: Callable[[tuple[str, ...]], Any] = lambda keys: CellResult.metrics[keys]  # noqa: E731
    else:  # SQLite: json_extract's objects are JSON to json_object (its scalars are plain values)
        build, axes, empty = func.json_object, func.json(CellResult.axes), func.json("{}")
        path = lambda keys: func.json_extract(CellResult.metrics, "$." + ".".join(keys))  # noqa: E731

    def field(name: str) -> Any:  # in its group (rows since the groups), else at the top (rows from before)
        return func.coalesce(path((GROUP_OF[name], name)), path((name,)))
    # A missing scalar is null (None to CellMetrics); a missing per-token-count dict is {}, its default.
    metrics = [(name, field(name)) for name in SHOWN_METRICS]
    metrics += [(name, func.coalesce(field(name), empty)) for name in ("speedup", "latency_ms")[:2 if latency else 1]]

    def obj(pairs: list[tuple[str, Any]]) -> ColumnElement[str]:
        args: list[Any] = []
        for name, value in pairs:
            args += [literal_column(f"'{name}'"), value]
        return build(*args)

    return obj([("key", CellResult.key), ("axes", axes), ("status", CellResult.status),
                ("reason", func.coalesce(func.substr(CellResult.reason, 1, REASON_CHARS), "")),
                ("duration_s", func.coalesce(CellResult.duration_s, 0.0)),
                ("attempt", CellResult.attempt), ("metrics", obj(metrics))])


class Views:
    """Reads over one database for the dashboard; built by the Store on its engine."""

    def __init__(self, engine: Engine, counted: bool = True, aggregates: bool = True, keep: bool = True) -> None:
        """`counted`: the database has the RunCounts table, `aggregates` the RunAggregate one (a read-only Store over
        an older database may lack either); `keep`: aggregates computed here may be written (not read-only)."""
        self._engine = engine
        self._counted = counted
        self._aggregates = aggregates and counted
        self._keep_writes = keep
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._writer_lock = threading.Lock()  # request threads hand aggregates to the one writer concurrently

    @property
    def engine(self) -> Engine:
        return self._engine

    def status_counts(self, run_ids: list[int]) -> dict[int, Counter[str]]:
        """Final-attempt cells by status, per run: the Store's precounted RunCounts rows, and a count for a run
        that has none (one written by a Store older than that table)."""
        out: dict[int, Counter[str]] = {}
        if not run_ids:
            return out
        with self._engine.connect() as conn:
            q = select(RunCounts.run_id, RunCounts.counts).where(RunCounts.run_id.in_(run_ids))
            for run_id, counts in conn.execute(q) if self._counted else ():
                out[run_id] = Counter({str(s): int(n) for s, n in (counts or {}).items()})
            out.update(tally(conn, [r for r in run_ids if r not in out]))
        return {r: out[r] for r in run_ids}

    def derived(self, name: str, run_ids: list[int], build: Callable[[], T], *params: Hashable,
                stored: TypeAdapter[T] | None = None) -> T:
        """What `build` computes from these runs' cells (a support summary, a diff): computed here each time, or
        with `stored` (an aggregate of one run, no params) read from the store when kept at the run's revision; a
        caching subclass (web.cache.KeptViews) keeps it in memory per the runs' revisions too, so it is exact."""
        if stored is not None:
            if len(run_ids) != 1 or params:
                raise ValueError(f"{name}: a stored aggregate is one run's, without parameters")
            return self.stored(name, run_ids[0], stored, build)
        return build()

    def stored(self, name: str, run_id: int, adapter: TypeAdapter[T], build: Callable[[], T]) -> T:
        """Run `run_id`'s aggregate `name`: read back from run_aggregates where it was kept at the run's current
        revision, else built here and handed to a background writer to keep (a read never waits on a write lock:
        an upload may hold SQLite's for seconds). A payload `adapter` cannot read (kept by another version of the
        type) is built again."""
        if not self._aggregates:
            return build()
        q = (select(RunCounts.revision, RunAggregate.revision, RunAggregate.payload).select_from(RunCounts)
             .outerjoin(RunAggregate, and_(RunAggregate.run_id == RunCounts.run_id, RunAggregate.name == name))
             .where(RunCounts.run_id == run_id))
        with self._engine.connect() as conn:
            row = conn.execute(q).first()
        if row is None:  # a run with no RunCounts row (written by an older Store): no revision to key it on
            return build()
        current, kept, payload = row
        if kept == current and payload is not None:
            try:
                return adapter.validate_json(payload)
            except ValidationError:
                log.info("run %s's kept %s no longer reads as %s: building it again", run_id, name, adapter)
        value = build()  # the revision was read before the build: a write meanwhile makes the kept row a miss
        if self._keep_writes:
            self._keep(run_id, name, int(current), adapter.dump_json(value).decode())
        return value

    def _keep(self, run_id: int, name: str, revision: int, payload: str) -> None:
        with self._writer_lock:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="pcg-aggregates")
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._writer.submit(self._write_aggregate, run_id, name, revision, payload))

    def _write_aggregate(self, run_id: int, name: str, revision: int, payload: str) -> None:
        insert: Callable[..., Any]  # the dialect's own, for ON CONFLICT
        if self._engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        stmt = insert(RunAggregate).values(run_id=run_id, name=name, revision=revision, payload=payload)
        stmt = stmt.on_conflict_do_update(index_elements=["run_id", "name"],
                                          set_={"revision": stmt.excluded.revision, "payload": stmt.excluded.payload})
        try:
            with self._engine.begin() as conn:
                conn.execute(stmt)
        except SQLAlchemyError as e:  # kept or not, the reader already has its value: the next one builds it again
            log.warning("run %s's %s not kept: %s", run_id, name, e)

    def flush(self) -> None:
        """Wait until every aggregate handed to the background writer is written (tests; a clean shutdown)."""
        with self._writer_lock:
            pending, self._pending = self._pending, []
        for f in pending:
            f.result()

    def close(self) -> None:
        """Write what is pending, then stop the writer (the Store closes its views before its engine)."""
        self.flush()
        with self._writer_lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown()

    @property
    def flags(self) -> dict[str, bool]:
        """The keyword arguments that build Views with the same reach over this database (a subclass over it)."""
        return {"counted": self._counted, "aggregates": self._aggregates, "keep": self._keep_writes}

    def revisions(self, run_ids: list[int]) -> dict[int, int]:
        """How many writes each run has had (RunCounts.revision; 0 when it has no row): a cache of a run's cells
        is current while this is unchanged."""
        if not run_ids or not self._counted:
            return dict.fromkeys(run_ids, 0)
        with self._engine.connect() as conn:
            found = dict(conn.execute(select(RunCounts.run_id, RunCounts.revision).where(RunCounts.run_id.in_(run_ids))).all())
        return {r: int(found.get(r, 0)) for r in run_ids}

    def version(self) -> tuple[int, int, int]:
        """Changes with every write of runs or cells through a Store (run count, newest run, sum of revisions):
        what a cache of pages built from them is keyed on. Model requests are not in it."""
        q = select(func.count(), func.coalesce(func.max(RunCounts.run_id), 0), func.coalesce(func.sum(RunCounts.revision), 0))
        with self._engine.connect() as conn:
            n, newest, revisions = conn.execute(q).one()
        return int(n), int(newest), int(revisions)

    def statuses(self, run_id: int) -> dict[str, str]:
        """Each cell's final status in one run, by key: what a history strip needs, without the rest of the row."""
        q = select(CellResult.key, CellResult.status).where(CellResult.run_id == run_id, final_attempt())

        def build() -> dict[str, str]:
            with self._engine.connect() as conn:
                return {k: s for k, s in conn.execute(q)}

        return self.stored("statuses", run_id, _STATUSES, build)

    def model_counts(self, run_id: int) -> dict[str, dict[str, int]]:
        """Final-attempt cells by status (a Counter) per model-axis value ("card:variant") of one run, in one GROUP BY."""
        model = CellResult.axes["model"].as_string()
        q = (select(model, CellResult.status, func.count()).where(CellResult.run_id == run_id, final_attempt())
             .group_by(model, CellResult.status))
        out: dict[str, dict[str, int]] = {}
        with self._engine.connect() as conn:
            for m, status, n in conn.execute(q):
                out.setdefault(str(m), Counter())[status] = n
        return out

    def previous_run_id(self, run_id: int) -> int | None:
        """The run created just before this one, the natural base of a diff."""
        with self._engine.connect() as conn:
            return conn.execute(select(func.max(Run.id)).where(Run.id < run_id)).scalar()

    def runs_before(self, run_id: int, n: int) -> list[int]:
        """Up to n runs of the same name created before this one, oldest first: a history strip's runs."""
        name = select(Run.name).where(Run.id == run_id).scalar_subquery()
        q = select(Run.id).where(Run.name == name, Run.id < run_id).order_by(Run.id.desc()).limit(n)
        with self._engine.connect() as conn:
            return sorted(conn.execute(q).scalars())

    def cells(self, run_id: int, latency: bool = False) -> list[CellRecord]:
        """Every cell of a run (final attempts, in the order first recorded), without logs, with metrics cut to
        speedup and SHOWN_METRICS; with `latency` also latency_ms (the diff compares graph latency; the other
        pages do without its cost)."""
        q = (select(cast(_record_json(self._engine.dialect.name, latency), Text))
             .where(CellResult.run_id == run_id, final_attempt())
             .order_by(first_recorded()))
        with self._engine.connect() as conn:
            texts = conn.execute(q).scalars().all()
        return [_parse(t) for t in texts]

    def history(self, key: str) -> list[HistoryPoint]:
        """The cell in every run that has it, oldest run first, with full metrics and no log; one query over
        every attempt (retries are few)."""
        q = (select(CellResult.run_id, Run.name, Run.started_at, Run.trigger, *RECORD_COLUMNS)
             .join(Run, Run.id == CellResult.run_id)
             .where(CellResult.key.in_(key_spellings(key)))  # stored under an older spelling too (quant=fp4)
             .order_by(CellResult.run_id, CellResult.attempt))
        rows: dict[int, tuple[Any, int]] = {}
        with self._engine.connect() as conn:
            for r in conn.execute(q):
                rows[r.run_id] = (r, rows[r.run_id][1] + 1 if r.run_id in rows else 1)
        return [HistoryPoint(r.run_id, r.name, r.started_at, r.trigger, n, record_of(r._mapping))
                for r, n in rows.values()]

    def log(self, run_id: int, key: str) -> str:
        """The final attempt's log: the one wide column, read for one cell only."""
        q = select(CellResult.log).where(CellResult.run_id == run_id, CellResult.key == key, final_attempt())
        with self._engine.connect() as conn:
            return conn.execute(q).scalar() or ""
