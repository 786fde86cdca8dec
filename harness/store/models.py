"""The tables of the results store: one row per harness run, one row per cell attempt, one row per model request.

Only generic SQLAlchemy types are used (JSON, DateTime, Text...) so the same models work on SQLite (a file
per developer) and PostgreSQL (shared by CI and the nightly runs).
"""

from __future__ import annotations

from datetime import datetime, UTC
from typing import Any

from sqlalchemy import (JSON, Boolean, ColumnElement, DateTime, Float, ForeignKey, Integer, String, Text,
                        UniqueConstraint, and_, exists, select)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, aliased, mapped_column
from sqlalchemy.types import TypeDecorator

RUN_STATUSES = ("running", "finished", "interrupted")
# A model request's life: asked for (its card written or linked), or accepted on the dashboard (the next nightly
# writes its card), its card put into a nightly's matrix, then what that nightly found: passing, failing, or
# unsupported (the runtime refused every cell; the reason is kept).
REQUEST_STATUSES = ("requested", "accepted", "in_matrix", "passing", "failing", "unsupported")
PROVENANCE = ("git_sha", "torch_version", "transformers_version", "cuda_version", "driver_version", "gpu_name", "host")


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that always comes back timezone-aware in UTC.

    SQLite has no time zones: SQLAlchemy would drop the offset on the way in and return naive datetimes.
    We store UTC on both backends and attach UTC on the way out, so callers never see a naive datetime.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one (datetime.now(timezone.utc))")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    pass


class Run(Base):
    """One invocation of a matrix, with the provenance needed to compare it with another run later."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String)
    matrix: Mapped[str] = mapped_column(String)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    git_sha: Mapped[str | None] = mapped_column(String)
    torch_version: Mapped[str | None] = mapped_column(String)
    transformers_version: Mapped[str | None] = mapped_column(String)
    cuda_version: Mapped[str | None] = mapped_column(String)
    driver_version: Mapped[str | None] = mapped_column(String)
    gpu_name: Mapped[str | None] = mapped_column(String)
    host: Mapped[str | None] = mapped_column(String)
    trigger: Mapped[str] = mapped_column(String, default="manual")
    status: Mapped[str] = mapped_column(String, default="running")


class CellResult(Base):
    """One attempt at one cell. A retried cell has attempt 1 and attempt 2; readers usually want the last."""

    __tablename__ = "cell_results"
    __table_args__ = (UniqueConstraint("run_id", "key", "attempt", name="uq_cell_results_run_key_attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(String, index=True)
    axes: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String)
    reason: Mapped[str] = mapped_column(Text, default="")
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    log: Mapped[str] = mapped_column(Text, default="")
    duration_s: Mapped[float] = mapped_column(Float, default=0.0)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RunCounts(Base):
    """A run's final-attempt cells by status, rewritten in the same transaction as every write of its cells, so
    listing 30 runs of 10,000 cells reads 30 rows instead of recounting 300,000. `revision` goes up with every
    write to the run (cells or its own row): a reader that keeps a run's cells keys them on it."""

    __tablename__ = "run_counts"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    counts: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)
    revision: Mapped[int] = mapped_column(Integer, default=0)


class RunAggregate(Base):
    """A dashboard aggregate of one run (its support summary, its cells' statuses for the history strips, its
    counts per model) as JSON, with the run revision it was computed at: computed once per revision by whichever
    reader needs it first and kept here, so a restarted or second server process reads one row instead of
    recomputing it from 10,000 cells. Stale the moment RunCounts.revision moves past it."""

    __tablename__ = "run_aggregates"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    revision: Mapped[int] = mapped_column(Integer)
    payload: Mapped[str] = mapped_column(Text)


class MatrixFile(Base):
    """The content hash of the matrix file a run started from (`pcgh run` records it; an upload has none), so a
    resume can say the file changed since. A table of its own, not a column of runs: a database made before it
    existed still reads, with nothing to migrate."""

    __tablename__ = "run_matrix_files"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64))


class ModelRequest(Base):
    """One `pcgh request`: which model (hub id or local path, revision, config hash) and what the analysis said.

    `verdict` holds the whole request report (harness.request.schema.RequestReport: features, quantization,
    sizes, per-axis verdicts); architecture and supported are copied out of it so they can be filtered on.
    """

    __tablename__ = "model_requests"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    model: Mapped[str] = mapped_column(String, index=True)
    revision: Mapped[str | None] = mapped_column(String)
    config_hash: Mapped[str] = mapped_column(String(64), index=True)
    architecture: Mapped[str] = mapped_column(String)
    supported: Mapped[bool] = mapped_column(Boolean)
    verdict: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String, default="requested")
    card_id: Mapped[str | None] = mapped_column(String)


class RequestConfig(Base):
    """The config.json a request asked about, kept so that a request accepted on the dashboard can get its card
    written by the next nightly. Apart from the request's row: listings never carry it."""

    __tablename__ = "request_configs"

    request_id: Mapped[int] = mapped_column(ForeignKey("model_requests.id", ondelete="CASCADE"), primary_key=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)


class RequestOutcome(Base):
    """What one run (a nightly) found for a model request: the status it moved the request to, why, and its cells
    by status. A table of its own, not columns of model_requests: a database made before it existed still reads."""

    __tablename__ = "request_outcomes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    request_id: Mapped[int] = mapped_column(ForeignKey("model_requests.id", ondelete="CASCADE"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    status: Mapped[str] = mapped_column(String)
    reason: Mapped[str] = mapped_column(Text, default="")
    counts: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)


def final_attempt() -> ColumnElement[bool]:
    """WHERE clause: this row is the highest attempt of its (run, key). The one final-attempt rule: every reader
    of "a run's cells" (the Store, the dashboard's views, a resume) filters with it; the unique index on
    (run_id, key, attempt) answers it."""
    later = aliased(CellResult)
    return ~exists().where(and_(later.run_id == CellResult.run_id, later.key == CellResult.key,
                                later.attempt > CellResult.attempt))


def first_recorded() -> ColumnElement[int]:
    """ORDER BY for final attempts: where the key was first recorded (the row of its lowest attempt, attempts
    being recorded in order), so a retried cell keeps its place. Written as ORDER BY attempt LIMIT 1 so that the
    unique index on (run_id, key, attempt) answers it: SQLite plans min(id) over the run_id index instead,
    which took 42 s for a 10,000-cell run in a 300,000-row store (this: 0.05 s)."""
    first = aliased(CellResult)
    return (select(first.id).where(first.run_id == CellResult.run_id, first.key == CellResult.key)
            .order_by(first.attempt).limit(1).scalar_subquery())


def as_dict(obj: Base) -> dict[str, Any]:
    """A row's columns by name, read inside the session (rows.py's types are built from them or from the object)."""
    return {c.name: getattr(obj, c.name) for c in obj.__table__.columns}
