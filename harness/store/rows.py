"""What the Store hands out for runs and model requests: typed, frozen rows, never ORM objects or bare dicts.

A run or request crosses from the store to the CLI, the reports and the dashboard; one type per value means a
misspelt column is an AttributeError at the reader (and a type checker's error before that), where a dict's
`run.get("finshed_at")` was a silent None. Rows are built from the ORM objects inside the Store's session
(`from_attributes`); the extras a query joins in (a matrix file's hash, a request's latest outcome, what a
duplicate matched) are fields of their own.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harness.store.models import PROVENANCE


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True, extra="forbid")


class RunRow(_Row):
    """One run: its name and matrix, when it ran, the provenance of the machine it ran on, how it ended."""

    id: int
    name: str
    matrix: str
    started_at: datetime
    finished_at: datetime | None = None
    git_sha: str | None = None
    torch_version: str | None = None
    transformers_version: str | None = None
    cuda_version: str | None = None
    driver_version: str | None = None
    gpu_name: str | None = None
    host: str | None = None
    trigger: str = "manual"
    status: str = "running"
    matrix_sha256: str | None = None  # runs_of_matrix only: the matrix file's content hash (None: not known)

    @property
    def provenance(self) -> dict[str, str | None]:
        """The provenance columns (git sha, versions, GPU, host), by name."""
        return {k: getattr(self, k) for k in PROVENANCE}


class RequestOutcomeRow(_Row):
    """What one run found for a model request."""

    id: int
    request_id: int
    run_id: int
    recorded_at: datetime
    status: str
    reason: str = ""
    counts: dict[str, int] = Field(default_factory=dict)


class RequestRow(_Row):
    """A model request: the model asked about, the submit-time verdict, where it stands."""

    id: int
    created_at: datetime
    model: str
    revision: str | None = None
    config_hash: str
    architecture: str
    supported: bool
    verdict: dict[str, Any] = Field(default_factory=dict)
    status: str = "requested"
    card_id: str | None = None
    outcome: RequestOutcomeRow | None = None  # requests() only: the latest run's finding
    match: list[str] = Field(default_factory=list)  # duplicate_requests() only: "model+revision", "config_hash"
