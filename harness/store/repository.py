"""The Store: the one way to write and read runs, cell results and model requests, for the harness and the
dashboard alike.

Every write commits before returning, so a cell's result survives the parent dying right after it; reads open
a fresh connection each time, so two Stores (or processes) on one database see each other's commits at once.
Cell results go in and come out as harness.outcome.CellRecord; runs and requests as typed rows (rows.py). The
dashboard's wide reads are `Store.views` (views.py), on the same engine.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from sqlalchemy import Connection, func, insert, inspect, or_, select, update
from sqlalchemy.exc import IntegrityError, ProgrammingError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from harness.outcome import CellRecord, Status
from harness.store.db import check_access, connect_error, default_db_url, dumps, make_engine, mask, normalize
from harness.store.rows import RequestOutcomeRow, RequestRow, RunRow
from harness.store.models import (
    PROVENANCE,
    REQUEST_STATUSES,
    RUN_STATUSES,
    Base,
    CellResult,
    ModelRequest,
    MatrixFile,
    RequestConfig,
    RequestOutcome,
    Run,
    RunAggregate,
    RunCounts,
    as_dict,
    final_attempt,
    first_recorded,
    utcnow,
)
from harness.store.views import RECORD_COLUMNS, Views, record_of, tally
from pcg_core.errors import ConfigError

REQUEST_KEYS = ("model", "revision", "config_hash", "architecture", "supported", "verdict", "status", "card_id")
_UNCHANGED: Any = object()
FINAL_RUN_STATUSES = ("finished", "interrupted")
MAX_ID = 2**63 - 1  # the largest id either database can store


class RunNotFound(KeyError):
    """A KeyError whose str() is the message itself (a plain KeyError would print it in quotes)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RequestNotFound(KeyError):
    """No model request with that id; str() is the message itself."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Store:
    """Runs and cell results in SQLite or PostgreSQL. Use one Store per process (do not share across fork)."""

    def __init__(self, url: str | None = None, read_only: bool = False) -> None:
        """`read_only`: for commands that only read; the database must exist already and nothing in it changes
        (no tables made, no counts filled in)."""
        self.url = url if url is not None else default_db_url()
        check_access(self.url, read_only)
        self._engine = make_engine(self.url, create=not read_only)
        try:
            if read_only:
                tables = set(inspect(self._engine).get_table_names())
            else:
                try:
                    Base.metadata.create_all(self._engine)
                except (IntegrityError, ProgrammingError):
                    Base.metadata.create_all(self._engine)  # another process created the tables at the same moment
        except SQLAlchemyError as e:
            self._engine.dispose()
            raise connect_error(self.url, e) from e
        if read_only and not {Run.__tablename__, CellResult.__tablename__} <= tables:
            self._engine.dispose()
            raise ConfigError(f"{mask(self.url)} is not a pcg results database (it has no runs table)")
        self._session = sessionmaker(self._engine, expire_on_commit=False)
        # a store older than the request outcomes and configs (added together) reads on without them
        self._request_tables = not read_only or RequestOutcome.__tablename__ in tables
        self.views = Views(self._engine, counted=not read_only or RunCounts.__tablename__ in tables,
                           aggregates=not read_only or RunAggregate.__tablename__ in tables, keep=not read_only)
        if not read_only:
            self._count_uncounted_runs()

    def __repr__(self) -> str:
        return f"Store({mask(self.url)!r})"

    @property
    def identity(self) -> str:
        """A short name for this database that two databases never share: its file or database name and a hash
        of its full location (password left out). Keeps the files of runs in two databases apart (log folders),
        where run ids alone would collide."""
        url = normalize(self.url)
        name = Path(url.database).stem if url.get_backend_name() == "sqlite" and url.database else (url.database or "db")
        digest = hashlib.sha256(url.render_as_string(hide_password=True).encode()).hexdigest()[:8]
        return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:40]}-{digest}"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.views.close()
        self._engine.dispose()

    # --- runs -----------------------------------------------------------------------------------------------

    def create_run(self, name: str, matrix: str, meta: Mapping[str, Any], trigger: str = "manual",
                   matrix_sha256: str | None = None) -> int:
        """Start a run in status "running"; `meta` holds the provenance columns (missing ones stay NULL);
        `matrix_sha256` the matrix file's content hash, which a resume compares."""
        with self._engine.begin() as conn:
            run_id = _insert_run(conn, name, matrix, meta, trigger, "running", utcnow(), None)
            if matrix_sha256 is not None:
                conn.execute(insert(MatrixFile).values(run_id=run_id, sha256=matrix_sha256))
            self._recount(conn, run_id)
        return run_id

    def runs_of_matrix(self, name: str, matrices: Sequence[str]) -> list[RunRow]:
        """Runs of this matrix name recorded under any of these matrix spellings (a resolved path and the
        spellings older runs used), newest first, each with its matrix file's `matrix_sha256` (None if unknown)."""
        q = (select(Run, MatrixFile.sha256).outerjoin(MatrixFile, MatrixFile.run_id == Run.id)
             .where(Run.name == name, Run.matrix.in_([str(m) for m in matrices])).order_by(Run.id.desc()))
        with self._session() as s:
            return [RunRow(**as_dict(run), matrix_sha256=sha) for run, sha in s.execute(q)]

    def import_run(self, name: str, matrix: str, meta: Mapping[str, Any], records: Sequence[CellRecord], *,
                   trigger: str = "manual", status: str = "finished", started_at: datetime | None = None,
                   finished_at: datetime | None = None) -> int:
        """A whole run at once (an upload, a benchmark's database) with its own times, in one transaction: all
        of it or, on an error, nothing. Times default to now; a run still "running" has no finish time."""
        if status not in RUN_STATUSES:
            raise ValueError(f"run status {status!r} is not one of {', '.join(RUN_STATUSES)}")
        if status == "running" and finished_at is not None:
            raise ValueError("a run still running has no finish time")
        values = _cell_values(records)
        started = started_at or utcnow()
        finished = None if status == "running" else finished_at or utcnow()
        with self._engine.begin() as conn:
            run_id = _insert_run(conn, name, matrix, meta, trigger, status, started, finished)
            self._upsert(conn, run_id, values)
            self._recount(conn, run_id)
        return run_id

    def finish_run(self, run_id: int, status: str = "finished") -> None:
        if status not in FINAL_RUN_STATUSES:
            raise ValueError(f"run status {status!r}: a run ends as one of {', '.join(FINAL_RUN_STATUSES)}")
        with self._engine.begin() as conn:
            found = conn.execute(update(Run).where(Run.id == run_id).values(status=status, finished_at=utcnow())).rowcount
            if found:
                self._recount(conn, run_id)
        if not found:
            raise RunNotFound(self._missing(run_id))

    def latest_run(self, name: str | None = None, matrix: str | None = None,
                   trigger: str | None = None) -> RunRow | None:
        """The newest run matching every filter given; None when there is none."""
        q = select(Run).order_by(Run.id.desc()).limit(1)
        if name is not None:
            q = q.where(Run.name == name)
        if matrix is not None:
            q = q.where(Run.matrix == str(matrix))
        if trigger is not None:
            q = q.where(Run.trigger == trigger)
        with self._session() as s:
            run = s.scalars(q).first()
            return RunRow.model_validate(run) if run is not None else None

    def run(self, run_ref: int | str) -> RunRow:
        """A run by id (int or digits) or "latest"; RunNotFound (a KeyError) says what exists instead."""
        if isinstance(run_ref, str) and run_ref.strip().lower() == "latest":
            found = self.latest_run()
            if found is None:
                raise RunNotFound(f"no runs in {mask(self.url)} yet, so there is no latest run")
            return found
        try:
            run_id = int(run_ref)
        except (TypeError, ValueError):
            raise RunNotFound(f"run reference {run_ref!r}: give a run id or 'latest'") from None
        if not 0 < run_id <= MAX_ID:  # no such row; and past 2**63 the database could not even compare it
            raise RunNotFound(self._missing(run_id))
        with self._session() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise RunNotFound(self._missing(run_id))
            return RunRow.model_validate(run)

    def runs(self, limit: int | None = None, name: str | None = None, trigger: str | None = None) -> list[RunRow]:
        """Runs, newest first (by id: creation order, immune to clock differences between hosts); optionally only
        those of a matrix name and a trigger."""
        q = select(Run).order_by(Run.id.desc()).limit(limit)
        if name is not None:
            q = q.where(Run.name == name)
        if trigger is not None:
            q = q.where(Run.trigger == trigger)
        with self._session() as s:
            return [RunRow.model_validate(r) for r in s.scalars(q)]

    # --- cell results ---------------------------------------------------------------------------------------

    def record_result(self, run_id: int, record: CellRecord) -> None:
        """Insert or replace (run_id, key, attempt), committed before returning."""
        self.record_results(run_id, [record])

    def record_results(self, run_id: int, records: Sequence[CellRecord]) -> None:
        """Insert or replace many records in one transaction: all of them or, on an error, none. For a
        (key, attempt) given twice the last wins."""
        values = _cell_values(records)
        if not values:
            self._require_run(run_id)
            return
        try:
            with self._engine.begin() as conn:
                self._upsert(conn, run_id, values)
                self._recount(conn, run_id)
        except IntegrityError:
            self._require_run(run_id)  # the only integrity failure left after the upsert is a missing run
            raise

    def results(self, run_id: int, all_attempts: bool = False) -> list[CellRecord]:
        """The final attempt of each cell, in the order cells were first recorded (a retried cell keeps its
        place); with `all_attempts`, every attempt in recording order."""
        self._require_run(run_id)
        q = select(*RECORD_COLUMNS, CellResult.log).where(CellResult.run_id == run_id)
        q = q.order_by(CellResult.id) if all_attempts else q.where(final_attempt()).order_by(first_recorded())
        with self._engine.connect() as conn:
            return [record_of(r._mapping) for r in conn.execute(q)]

    def final_states(self, run_id: int) -> dict[str, dict[str, Any]]:
        """Per key, its final attempt's key, axes, status, reason and attempt, without logs or metrics (up to
        200,000 characters each): what a resumed run reads to see which cells are done or owe a retry."""
        self._require_run(run_id)
        cols = (CellResult.key, CellResult.axes, CellResult.status, CellResult.reason, CellResult.attempt)
        q = select(*cols).where(CellResult.run_id == run_id, final_attempt()).order_by(first_recorded())
        with self._engine.connect() as conn:
            return {r.key: dict(r._mapping) for r in conn.execute(q)}

    # --- model requests -------------------------------------------------------------------------------------

    def record_request(self, row: dict[str, Any], config: dict[str, Any] | None = None) -> int:
        """Insert one model request (status "requested" unless given) and the config it asked about, committed
        before returning; its id. `queue_request` is the door for a user's request: it never adds a second row."""
        values = _request_values(row)
        with self._session.begin() as s:
            return _add_request(s, values, config)

    def queue_request(self, row: dict[str, Any], config: dict[str, Any] | None = None,
                      same_config: bool = False) -> tuple[int, bool]:
        """(id, True) for a model not queued yet, else (id of its earliest row, False) with that row given this
        analysis (config hash, architecture, support, verdict, the config, and the card when one is named) and
        its status and history kept: asking twice is one request. The same model is the same `model` at the same
        revision (None and "main" are one); with `same_config` (a local path, which may hold another model's
        config tomorrow) also the same config_hash."""
        values = _request_values(row)
        q = select(ModelRequest).where(ModelRequest.model == values["model"]).order_by(ModelRequest.id)
        if same_config:
            q = q.where(ModelRequest.config_hash == values["config_hash"])
        with self._session.begin() as s:
            req = next((r for r in s.scalars(q) if (r.revision or "main") == (values["revision"] or "main")), None)
            if req is None:
                return _add_request(s, values, config), True
            for k in ("config_hash", "architecture", "supported", "verdict"):
                setattr(req, k, values[k])
            req.card_id = values["card_id"] or req.card_id
            if config is not None:
                s.merge(RequestConfig(request_id=req.id, config=config))
            return req.id, False

    def request_config(self, request_id: int) -> dict[str, Any] | None:
        """The config.json request `request_id` asked about; None when none was kept (or the store predates it)."""
        if not self._request_tables:
            return None
        with self._session() as s:
            row = s.get(RequestConfig, int(request_id))
            return row.config if row is not None else None

    def request(self, request_id: int) -> RequestRow:
        with self._session() as s:
            req = self._request_row(s, request_id)
            return RequestRow.model_validate(req)

    def requests(self, limit: int | None = None, status: str | None = None) -> list[RequestRow]:
        """Model requests, newest first; optionally only those in `status`. Each has `outcome`: what the last run
        that judged it found, or None."""
        q = select(ModelRequest).order_by(ModelRequest.id.desc()).limit(limit)
        if status is not None:
            _check_request_status(status)
            q = q.where(ModelRequest.status == status)
        with self._session() as s:
            rows = [as_dict(r) for r in s.scalars(q)]
            latest: dict[int, RequestOutcomeRow] = {}
            if rows and self._request_tables:
                newest = (select(func.max(RequestOutcome.id))
                          .where(RequestOutcome.request_id.in_([r["id"] for r in rows]))
                          .group_by(RequestOutcome.request_id))
                for o in s.scalars(select(RequestOutcome).where(RequestOutcome.id.in_(newest))):
                    latest[o.request_id] = RequestOutcomeRow.model_validate(o)
        return [RequestRow(**r, outcome=latest.get(r["id"])) for r in rows]

    def record_request_outcome(self, request_id: int, run_id: int, status: str, reason: str = "",
                               counts: dict[str, int] | None = None) -> None:
        """What run `run_id` found for a request: the request moves to `status` and the finding is kept beside it,
        in one transaction."""
        _check_request_status(status)
        with self._session.begin() as s:
            req = self._request_row(s, request_id)
            req.status = status
            s.add(RequestOutcome(request_id=req.id, run_id=int(run_id), recorded_at=utcnow(), status=status,
                                 reason=reason, counts=dict(counts or {})))

    def request_outcomes(self, request_id: int) -> list[RequestOutcomeRow]:
        """Every run's finding for one request, oldest first."""
        if not self._request_tables:
            return []
        q = select(RequestOutcome).where(RequestOutcome.request_id == int(request_id)).order_by(RequestOutcome.id)
        with self._session() as s:
            return [RequestOutcomeRow.model_validate(o) for o in s.scalars(q)]

    def duplicate_requests(self, model: str | None, revision: str | None, config_hash: str | None) -> list[RequestRow]:
        """Earlier requests of the same model at the same revision (None and "main" are the same revision), or of
        the same config (equal config_hash), oldest first; each row gets `match`: the list of what matched.
        Pass model=None to match on the config alone (a local path says nothing about the model)."""
        conds = []
        if model is not None:
            conds.append(ModelRequest.model == model)
        if config_hash is not None:
            conds.append(ModelRequest.config_hash == config_hash)
        if not conds:
            return []
        with self._session() as s:
            rows = [as_dict(r) for r in s.scalars(select(ModelRequest).where(or_(*conds)).order_by(ModelRequest.id))]
        out = []
        for r in rows:
            match = []
            if model is not None and r["model"] == model and (r["revision"] or "main") == (revision or "main"):
                match.append("model+revision")
            if config_hash is not None and r["config_hash"] == config_hash:
                match.append("config_hash")
            if match:
                out.append(RequestRow(**r, match=match))
        return out

    def set_request_status(self, request_id: int, status: str, card_id: str | None = _UNCHANGED) -> None:
        """Move a request along requested → accepted → in_matrix → passing | failing | unsupported; optionally
        (re)link its card."""
        _check_request_status(status)
        with self._session.begin() as s:
            req = self._request_row(s, request_id)
            req.status = status
            if card_id is not _UNCHANGED:
                req.card_id = card_id

    # --- helpers --------------------------------------------------------------------------------------------

    def _request_row(self, s: Session, request_id: int) -> ModelRequest:
        req = s.get(ModelRequest, int(request_id))
        if req is None:
            raise RequestNotFound(f"no model request {request_id} in {mask(self.url)}; `pcgh requests` lists them")
        return req

    def _upsert(self, conn: Connection, run_id: int, values: list[dict[str, Any]]) -> None:
        if not values:
            return
        now = utcnow()
        rows = [{**v, "run_id": run_id, "recorded_at": now} for v in values]
        stmt = self._insert()(CellResult)
        replaced = {k: stmt.excluded[k] for k in rows[0] if k not in ("run_id", "key", "attempt")}
        conn.execute(stmt.on_conflict_do_update(index_elements=["run_id", "key", "attempt"], set_=replaced), rows)

    def _insert(self) -> Any:
        # The dialect's own insert (for ON CONFLICT), imported for the backend in use: PostgreSQL's package pulls in
        # asyncio and its async drivers' modules, a tenth of a second a SQLite reader never needs.
        insert: Callable[..., Any]
        if self._engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        return insert

    def _recount(self, conn: Connection, run_id: int) -> None:
        """Rewrite the run's RunCounts row and bump its revision, in the caller's transaction."""
        stmt = self._insert()(RunCounts).values(run_id=run_id, counts=dict(tally(conn, [run_id])[run_id]), revision=1)
        conn.execute(stmt.on_conflict_do_update(index_elements=["run_id"],
                                                set_={"counts": stmt.excluded.counts, "revision": RunCounts.revision + 1}))

    def _count_uncounted_runs(self) -> None:
        """Count the runs that have no RunCounts row: every run of a database made before that table existed
        (once, when a Store first opens it), or one written since by an older Store."""
        with self._engine.begin() as conn:
            missing = list(conn.execute(select(Run.id).outerjoin(RunCounts, RunCounts.run_id == Run.id)
                                        .where(RunCounts.run_id.is_(None))).scalars())
            if missing:
                rows = [{"run_id": r, "counts": dict(c), "revision": 1} for r, c in tally(conn, missing).items()]
                # Another process opening the same database may count them at the same moment.
                conn.execute(self._insert()(RunCounts).values(rows).on_conflict_do_nothing(index_elements=["run_id"]))

    def _require_run(self, run_id: int) -> None:
        with self._session() as s:
            if s.get(Run, run_id) is None:
                raise RunNotFound(self._missing(run_id))

    def _missing(self, run_id: object) -> str:
        newest = self.latest_run()
        where = f"no run {run_id} in {mask(self.url)}"
        return f"{where}; the newest is run {newest.id}" if newest else f"{where}; it has no runs yet"


def _insert_run(conn: Connection, name: str, matrix: str, meta: Mapping[str, Any], trigger: str, status: str,
                started_at: datetime, finished_at: datetime | None) -> int:
    unknown = sorted(set(meta) - set(PROVENANCE))
    if unknown:
        raise ValueError(f"unknown provenance keys {unknown}; allowed: {', '.join(PROVENANCE)}")
    provenance = {k: None if meta.get(k) is None else str(meta[k]) for k in PROVENANCE}
    result = conn.execute(insert(Run).values(name=name, matrix=str(matrix), trigger=trigger, status=status,
                                             started_at=started_at, finished_at=finished_at, **provenance))
    key = result.inserted_primary_key
    assert key is not None  # an INSERT of one row
    return int(key[0])


def _cell_values(records: Sequence[CellRecord]) -> list[dict[str, Any]]:
    """Each record's column values, the last of a (key, attempt) given twice; all checked before the database
    is touched. Metrics keep what was measured: fields still at their defaults (None, empty) are left out."""
    unique: dict[tuple[str, int], dict[str, Any]] = {}
    for r in records:
        if not isinstance(r, CellRecord):
            raise TypeError(f"record a harness.outcome.CellRecord, not {type(r).__name__}")
        unique[(r.key, r.attempt)] = {
            "key": r.key, "axes": dict(r.axes), "status": Status(r.status).value, "reason": _text(r.reason),
            "metrics": r.metrics.model_dump(mode="python", exclude_defaults=True), "log": _text(r.log),
            "duration_s": float(r.duration_s), "attempt": r.attempt}
    return list(unique.values())


def _text(value: Any) -> str:
    """Text both backends accept: PostgreSQL rejects NUL bytes and neither encodes lone surrogates."""
    text = "" if value is None else str(value)
    return text.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")


def _add_request(s: Session, values: dict[str, Any], config: dict[str, Any] | None) -> int:
    req = ModelRequest(created_at=utcnow(), **values)
    s.add(req)
    s.flush()
    if config is not None:
        s.add(RequestConfig(request_id=req.id, config=config))
    return req.id


def _check_request_status(status: str) -> None:
    if status not in REQUEST_STATUSES:
        raise ValueError(f"request status {status!r} is not one of {', '.join(REQUEST_STATUSES)}")


def _request_values(row: dict[str, Any]) -> dict[str, Any]:
    """Check a model-request row and fill defaults, so a bad row fails here with a message."""
    unknown = sorted(set(row) - set(REQUEST_KEYS))
    missing = [k for k in ("model", "config_hash", "architecture", "supported") if row.get(k) is None]
    if unknown or missing:
        raise ValueError(f"model request: unknown keys {unknown}, missing keys {missing}; keys are {', '.join(REQUEST_KEYS)}")
    status = row.get("status") or "requested"
    _check_request_status(status)
    verdict = dict(row.get("verdict") or {})
    dumps(verdict)  # not serialisable -> TypeError naming the type, before touching the database
    return {
        "model": _text(row["model"]),
        "revision": None if row.get("revision") is None else _text(row["revision"]),
        "config_hash": str(row["config_hash"]),
        "architecture": _text(row["architecture"]),
        "supported": bool(row["supported"]),
        "verdict": verdict,
        "status": status,
        "card_id": None if row.get("card_id") is None else str(row["card_id"]),
    }
