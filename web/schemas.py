"""The JSON API's shapes: responses (what /docs shows and clients rely on) and uploads (checked before any write).

An uploaded cell is a harness.outcome.CellRecord, checked by that type as the Store checks what it records, so
a bad row in a 10,000-row upload is a 422 naming it before anything is written. A run's fields are the Store's
columns: RunOut is built from its provenance list, so a new provenance column shows up here by itself.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from harness.outcome import CellRecord
from harness.store.models import PROVENANCE
from web.upload_checks import MODEL_ID_MAX, check_cell, check_not_future, check_text, check_tree


class _Run(BaseModel):
    id: int
    name: str
    matrix: str
    status: str
    trigger: str


if TYPE_CHECKING:  # what a type checker sees of it: a _Run (its provenance fields are made at run time)
    RunOut = _Run
else:
    RunOut = create_model("RunOut", __base__=_Run, **{f: (str | None, None) for f in PROVENANCE},
                          started_at=(datetime | None, None), finished_at=(datetime | None, None))


class RunSummaryOut(BaseModel):
    run: RunOut
    cells: int
    counts: dict[str, int] = Field(description="final-attempt cells by status")
    passing: int
    counted: int = Field(description="cells counted against the pass rate (all but eager_fail, unsupported, skipped)")
    pass_rate: float | None = Field(description="passing / counted; null when nothing is counted")
    wall_s: float | None


class FreshnessOut(BaseModel):
    newest_nightly_id: int | None
    age_s: float | None
    stale: bool = Field(description="the newest nightly run is older than a day")
    message: str


class RunsOut(BaseModel):
    freshness: FreshnessOut
    runs: list[RunSummaryOut]


class FailingCellOut(BaseModel):
    key: str
    status: str
    reason: str


class RunDetailOut(RunSummaryOut):
    geomean_speedup: float | None
    speedup_cells: int
    failing_total: int
    failing: list[FailingCellOut] = Field(description="the first failing cells, in recording order")
    previous_id: int | None


class MatrixCellOut(BaseModel):
    key: str
    axes: dict[str, str]
    status: str
    label: str
    speedup: float | None
    reason: str
    capture_s: float | None
    graph_pool_bytes: float | None
    token_match: float | None


class ColumnOut(BaseModel):
    group: str
    config: dict[str, str]


class MatrixOut(BaseModel):
    run: RunOut
    group: str
    filters: dict[str, list[str]]
    options: dict[str, list[str]] = Field(description="every value of each axis and status in the run")
    total: int
    shown: int
    hidden: int = Field(description="cells left out by unsupported=hide")
    counts: dict[str, int] = Field(description="shown cells by status")
    models: list[str]
    columns: list[ColumnOut]
    cells: list[MatrixCellOut]


class TallyOut(BaseModel):
    passing: int
    failing: int = Field(description="counted and not passing: the graph path's fault")
    eager_fail: int = Field(description="failed in eager too: the model's fault, not counted")
    not_supported: int = Field(description="not launched: unsupported or skipped")
    launched: int
    pass_rate: float | None = Field(description="passing / (passing + failing); null when nothing is counted")


class AxisValueOut(BaseModel):
    value: str
    tally: TallyOut


class ReasonGroupOut(BaseModel):
    reason: str = Field(description="the first cell's reason, one line; the group's others differ at most in numbers")
    cells: int
    statuses: list[str]
    shared: dict[str, str] = Field(description="axis values every cell of the group has (axes the run varies)")


class SupportOut(BaseModel):
    run: RunOut
    tally: TallyOut
    by_axis: dict[str, list[AxisValueOut]]
    failing: list[ReasonGroupOut] = Field(description="the largest groups of failing cells by reason")
    failing_groups: int
    not_supported: list[ReasonGroupOut] = Field(description="the largest groups of not-supported cells by reason")
    not_supported_groups: int


class HistoryPointOut(BaseModel):
    run_id: int
    run_name: str
    started_at: datetime | None
    trigger: str
    status: str
    reason: str
    attempts: int
    speedup: float | None
    speedups: dict[str, float | None]
    capture_s: float | None
    graph_pool_bytes: float | None


class CellOut(BaseModel):
    key: str
    axes: dict[str, str]
    run_id: int
    status: str
    reason: str
    metrics: dict[str, Any]
    log: str
    flips: int
    flaky: bool
    repro: str
    history: list[HistoryPointOut]


class StatusChangeOut(BaseModel):
    key: str
    axes: dict[str, Any]
    base_status: str
    head_status: str
    reason: str


class SpeedupChangeOut(BaseModel):
    key: str
    axes: dict[str, Any]
    base: float
    head: float
    rel_change: float


class LatencyChangeOut(BaseModel):
    key: str
    axes: dict[str, Any]
    base_ms: float
    head_ms: float
    rel_change: float = Field(description="head / base - 1: positive is slower")


class DiffOut(BaseModel):
    base: RunOut
    head: RunOut
    has_regression: bool
    new_failures: list[StatusChangeOut]
    fixes: list[StatusChangeOut]
    flips: list[StatusChangeOut]
    speedup_changes: list[SpeedupChangeOut]
    latency_changes: list[LatencyChangeOut] = Field(description="graph latency changes beyond the threshold, slower first")
    added: list[str]
    removed: list[str]
    speedup_threshold: float
    markdown: str = Field(description="the same diff as `pcgh diff` prints")


class RequestOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: int | str
    created_at: datetime | None = None
    model: str
    revision: str | None = None
    architecture: str | None = None
    supported: bool | None = None
    verdict: dict[str, Any] | str | None = Field(None, description="the request report (pcgh request --json)")
    status: str | None = Field(None, description="requested, accepted, in_matrix, passing, failing or unsupported")
    outcome: dict[str, Any] | None = Field(None, description="what the last nightly that ran its cells found: "
                                           "run_id, status, reason, counts")
    card_id: str | None = None
    matrix_cells: int = Field(0, description="cells of card_id in the latest run")
    matrix_passing: int = 0
    matrix_counted: int = 0


class RequestsOut(BaseModel):
    requests: list[RequestOut]


# --- uploads ------------------------------------------------------------------------------------------------


class RunIn(BaseModel):
    """A whole run: provenance, its cell results, and optionally its own start and finish times."""

    name: str = Field(min_length=1, max_length=200)
    matrix: str = Field(max_length=1000)
    trigger: str = Field(default="manual", max_length=100)
    status: Literal["finished", "interrupted", "running"] = "finished"
    provenance: dict[str, str | None] = Field(default_factory=dict, description=f"keys among {', '.join(PROVENANCE)}")
    started_at: datetime | None = None
    finished_at: datetime | None = None
    results: list[CellRecord] = Field(default_factory=list)

    @field_validator("provenance")
    @classmethod
    def _known_provenance(cls, v: dict[str, str | None]) -> dict[str, str | None]:
        unknown = sorted(set(v) - set(PROVENANCE))
        if unknown:
            raise ValueError(f"unknown provenance keys {unknown}; allowed: {', '.join(PROVENANCE)}")
        for value in v.values():
            cls._text(value or "")
        return v

    @field_validator("started_at", "finished_at")
    @classmethod
    def _aware(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            raise ValueError("give a time zone (e.g. 2026-01-01T02:00:00Z)")
        return v

    @field_validator("name", "matrix", "trigger")
    @classmethod
    def _text(cls, v: str) -> str:
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("not valid text (a lone surrogate)") from None
        return v

    @model_validator(mode="after")
    def _finished_if_timed(self) -> RunIn:
        if self.status == "running" and self.finished_at is not None:
            raise ValueError("a run still running has no finished_at")
        if self.started_at and self.finished_at and self.finished_at < self.started_at:
            raise ValueError(f"finished_at {self.finished_at.isoformat()} is before started_at {self.started_at.isoformat()}")
        check_not_future("started_at", self.started_at)
        check_not_future("finished_at", self.finished_at)  # a future one would turn the staleness banner off
        return self

    @model_validator(mode="after")
    def _as_a_run_records_it(self) -> RunIn:
        """Each cell as `pcgh run` would have recorded it (web.upload_checks): one bad row refuses the upload."""
        for name, value in self.provenance.items():
            check_text(f"provenance.{name}", value or "")
        for i, record in enumerate(self.results):
            check_cell(record, f"results[{i}]")
        return self


class RunCreatedOut(BaseModel):
    id: int
    cells: int
    url: str


class RequestIn(BaseModel):
    """The request report of `pcgh request --json` (harness.request.schema.RequestReport, which checks it in
    full); only its headline fields are spelled out here."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1, max_length=MODEL_ID_MAX,
                       description="hub id, e.g. Qwen/Qwen3-0.6B, or the local path asked about")
    revision: str | None = None
    config_hash: str
    architecture: str
    supported: bool

    @model_validator(mode="after")
    def _storable(self) -> RequestIn:
        """All of it, extra fields and the config included, text UTF-8 can store, of bounded length, with finite
        numbers: it is kept whole and served on /requests."""
        check_tree(self.model_dump(), "body")
        return self


class RequestCreatedOut(BaseModel):
    id: int
    status: str
    url: str
