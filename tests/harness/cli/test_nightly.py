"""`pcgh nightly` end to end on the CPU: nightlies of a one-cell matrix, a planted regression, a planted flaky cell.

The cell's capture backend comes from a plugin (nightly_plant.py, through PCG_PLUGINS) whose fault an environment
variable turns on per run, so the cell key stays the same from night to night, as a real regression's does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
MATRIX = """
name: nightly-probe
defaults: {device: cpu, dtype: float32, max_tokens: 16, max_new_tokens: 2, timeout_s: 300}
axes:
  model: [qwen3-0.6b:tiny]
  graph: [nightly_probe]
nightly: {keep: 2, window: 2, latency_threshold: 0.5}
"""


@pytest.fixture
def nightly(tmp_path):
    matrix = tmp_path / "nightly-probe.yaml"
    matrix.write_text(MATRIX)
    db = f"sqlite:///{tmp_path / 'nightly.db'}"

    def run(plant: str = "", night: int = 0) -> tuple[int, dict, str]:
        env = {**os.environ, "PCG_PLUGINS": "nightly_plant", "PCG_NIGHTLY_PLANT": plant,
               "PCG_NIGHTLY_DIR": str(tmp_path), "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        out = tmp_path / f"night{night}"
        p = subprocess.run([sys.executable, "-m", "harness.cli", "nightly", str(matrix), "--db", db, "--logs",
                            str(tmp_path / "logs"), "--out", str(out)], env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode in (0, 1), p.stderr[-3000:]
        return p.returncode, json.loads((out / "nightly.json").read_text()), p.stdout

    return run


def test_a_planted_regression_fails_the_night_naming_the_cell_and_a_flaky_one_does_not(nightly):
    rc, v, _ = nightly("", 0)
    assert rc == 0 and not v["failed"] and v["history_runs"] == 0
    rc, v, out = nightly("regress", 1)
    key = "model=qwen3-0.6b:tiny|quant=none|attention=sdpa|parallel=tp1|graph=nightly_probe|compiler=eager"
    assert rc == 1 and [r["key"] for r in v["regressions"]] == [key], out
    assert v["regressions"][0]["status"] == "fail_accuracy" and "Regressions" in out and key in out
    rc, v, out = nightly("flaky", 2)  # fails in its first process, passes on the runner's retry
    assert rc == 0 and v["flaky"] == [key] and not v["regressions"], out
    rc, v, _ = nightly("regress", 3)  # the night before passed (flaky counts as passing) but the one before failed
    assert rc == 0 and v["known_failures"] == [key], v
