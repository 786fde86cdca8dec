"""Hand-made rows and runs for the report tests."""

from __future__ import annotations

from datetime import datetime, UTC
from typing import Any
from collections.abc import Callable

import pytest

from harness.outcome import CellRecord
from harness.store.rows import RunRow

BASE_AXES = {"model": "qwen3-0.6b:tiny", "quant": "none", "attention": "sdpa", "parallel": "tp1",
             "graph": "piecewise", "compiler": "eager"}


def make_row(key: str, status: str = "pass", speedup: dict[str, float] | None = None, reason: str = "",
             metrics: dict[str, Any] | None = None, **axes: str) -> CellRecord:
    m = dict(metrics or {})
    if speedup is not None:
        m["speedup"] = speedup
    return CellRecord(key=key, axes={**BASE_AXES, **axes}, status=status, reason=reason, metrics=m,
                      log="a log line\n", duration_s=10.0, attempt=1)


@pytest.fixture
def row() -> Callable[..., CellRecord]:
    """row(key, status="pass", speedup={"8": 2.0}, reason="", metrics={}, **axes)."""
    return make_row


@pytest.fixture
def run() -> RunRow:
    return RunRow(**{"id": 7, "name": "nightly-0101", "matrix": "smoke", "git_sha": "0123abcd", "torch_version": "2.11.0",
            "transformers_version": "5.17.0", "cuda_version": "12.8", "driver_version": "570.86", "gpu_name": "NVIDIA H200",
            "host": "gpu-01", "trigger": "nightly", "status": "finished",
            "started_at": datetime(2025, 1, 1, 2, 0, 0, tzinfo=UTC),
            "finished_at": datetime(2025, 1, 1, 3, 2, 3, tzinfo=UTC)})
