"""The README's first command: `pcgh run quick.yaml`, a first look in a couple of minutes — every capture backend on a
dense model, a MoE and MLA, flex beside sdpa, one 8-bit scheme; every cell passes and the summary says how long it
took and where to look next."""

from __future__ import annotations

import re
from pathlib import Path

from harness.cli import main
from harness.store import Store

ROOT = Path(__file__).parents[2]
QUICK = ROOT / "harness" / "configs" / "quick.yaml"


def test_the_readme_runs_the_quick_matrix_first():
    readme = (ROOT / "README.md").read_text()
    assert 'pip install -e ".[all]" && pcgh run harness/configs/quick.yaml --jobs 2' in readme


def test_the_quick_matrix_passes_and_says_how_long_it_took(tmp_path, capsys):
    db = str(tmp_path / "quick.db")
    assert main(["run", str(QUICK), "--db", db, "--jobs", "2", "--logs", str(tmp_path / "logs")]) == 0
    out = capsys.readouterr().out
    with Store(db) as store:
        rows = store.results(store.run("latest")["id"])
    assert len(rows) == 13 and all(r.passed for r in rows), [(r.key, r.status, r.reason) for r in rows if not r.passed]
    assert {r.axes["graph"] for r in rows} == {"piecewise", "breakable", "full"}
    assert {r.axes["model"] for r in rows} == {"qwen3-0.6b:tiny", "qwen3-30b-a3b:tiny", "deepseek-v3:tiny"}
    assert re.search(r"run 1 \(quick, finished in \d+ min \d\d s\): 13 cells, 13 pass", out), out
    assert "full report: pcgh report 1" in out and "dashboard: pcgh serve" in out
