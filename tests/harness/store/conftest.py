"""Store tests run against each backend through tests/conftest.py's `db_url` (SQLite, PostgreSQL)."""

from __future__ import annotations


import pytest

AXES = {"model": "qwen3-0.6b:tiny", "quant": "none", "attention": "sdpa", "parallel": "tp1", "graph": "piecewise", "compiler": "eager",
        "kv_cache": "auto", "engine": "pcg"}


@pytest.fixture
def axes() -> dict[str, str]:
    return dict(AXES)
