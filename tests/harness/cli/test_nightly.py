"""`pcgh nightly` end to end on the CPU: nightlies of the smoke matrix (filtered to one cell), a planted regression,
a planted flaky cell, planted eager-timing noise.

The faults come from a plugin (nightly_plant.py, through PCG_PLUGINS) that replaces the built-in piecewise and eager
backends and whose fault an environment variable turns on per run, so the cell key stays the same from night to
night, as a real regression's does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SMOKE = Path(__file__).resolve().parents[3] / "harness" / "configs" / "smoke.yaml"
ONE_CELL = ["--filter", "model=qwen3-0.6b:tiny", "--filter", "quant=none", "--filter", "attention=sdpa",
            "--filter", "graph=piecewise"]
KEY = "model=qwen3-0.6b:tiny|quant=none|attention=sdpa|parallel=tp1|graph=piecewise|compiler=eager"


@pytest.fixture
def nightly(tmp_path):
    db = f"sqlite:///{tmp_path / 'nightly.db'}"

    def run(plant: str = "", night: int = 0) -> tuple[int, dict, str]:
        env = {**os.environ, "PCG_PLUGINS": "nightly_plant", "PCG_NIGHTLY_PLANT": plant,
               "PCG_NIGHTLY_DIR": str(tmp_path), "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        out = tmp_path / f"night{night}"
        p = subprocess.run([sys.executable, "-m", "harness.cli", "nightly", str(SMOKE), *ONE_CELL, "--keep", "2",
                            "--window", "2", "--latency-threshold", "0.5", "--db", db, "--logs", str(tmp_path / "logs"),
                            "--out", str(out)], env=env, capture_output=True, text=True, timeout=900)
        assert p.returncode in (0, 1), p.stderr[-3000:]
        return p.returncode, json.loads((out / "nightly.json").read_text()), p.stdout

    return run


@pytest.mark.slow
def test_a_planted_regression_fails_the_night_naming_the_cell_and_flakiness_or_eager_noise_do_not(nightly):
    rc, v, _ = nightly("", 0)
    assert rc == 0 and not v["failed"] and v["history_runs"] == 0
    rc, v, out = nightly("eager_noise", 1)  # eager 0-20 ms slower per forward: speedups move, the night passes
    assert rc == 0 and not v["failed"] and not v["regressions"] and not v["slowdowns"], out
    rc, v, out = nightly("regress", 2)
    assert rc == 1 and [r["key"] for r in v["regressions"]] == [KEY], out
    assert v["regressions"][0]["status"] == "fail_accuracy" and "Regressions" in out and KEY in out
    rc, v, out = nightly("flaky", 3)  # fails in its first process, passes on the runner's retry
    assert rc == 0 and v["flaky"] == [KEY] and not v["regressions"], out
    rc, v, _ = nightly("regress", 4)  # the night before passed (flaky counts as passing) but the one before failed
    assert rc == 0 and v["known_failures"] == [KEY], v
