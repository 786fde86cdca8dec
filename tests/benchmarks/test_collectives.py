"""benchmarks/collectives.py on a CPU world of one: every backend's replay bitwise equal to eager with the model
sharded (each rowwise layer through pcg::all_reduce_), the unsharded floor beside them, the table printed. A
subprocess: the benchmark makes a process group of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_collectives_benchmark_runs_on_a_world_of_one(tmp_path):
    out = tmp_path / "c.json"
    run = subprocess.run([sys.executable, "benchmarks/collectives.py", "--model", "harness/models/configs/Qwen__Qwen3-0.6B.json",
                          "--tiny", "--layers", "2", "--dtype", "float32", "--device", "cpu", "--attention", "sdpa",
                          "--tokens", "8,32", "--repeat", "2", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1", **_env()})
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert list(result["rows"]) == ["full, unsharded", "piecewise", "breakable", "full"]
    assert result["ranks"] == 1 and result["all_reduces"] == 4  # 2 layers: o_proj and down_proj each
    for name in ("piecewise", "breakable", "full"):
        assert all(result["rows"][name]["bitwise_equal_eager"].values()), name
    assert "| piecewise |" in run.stdout and "× full (captured)" in run.stdout


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.pop("WORLD_SIZE", None)
    return env
