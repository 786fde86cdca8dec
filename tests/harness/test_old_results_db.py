"""A results database written before the typed outcome still reads: `pcgh report` and `pcgh diff` over the
committed nightly store (two H200 runs, 504 cells each, untyped metrics) print what they printed then, byte for
byte, and every stored row validates as a CellRecord."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.reports import summary_markdown
from harness.store import Store

NIGHTLY = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "2026-11-29-h200" / "nightly"


@pytest.fixture
def old_db(tmp_path) -> str:
    db = tmp_path / "nightly.db"
    shutil.copy(NIGHTLY / "nightly.db", db)  # a copy: opening a store may add tables it lacks
    return str(db)


@pytest.mark.parametrize("run_id", [1, 2])
def test_report_of_an_old_run_is_unchanged(old_db, run_id):
    with Store(old_db) as store:
        records = store.results(run_id)
        text = summary_markdown(store.run(run_id), records)
    assert len(records) == 504 and sum(r.passed for r in records) == 21
    assert any(r.metrics.latency.speedup and r.metrics.latency.latency_ms and r.metrics.settings.device == "cuda" for r in records)
    assert text == (NIGHTLY / f"run{run_id}" / "summary.md").read_text(encoding="utf-8")


def test_diff_of_old_runs_is_unchanged(old_db, capsys):
    assert main(["diff", "1", "2", "--db", old_db]) == 0
    assert capsys.readouterr().out == (NIGHTLY / "diff_1_2.md").read_text()
