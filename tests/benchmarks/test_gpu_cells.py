"""benchmarks/gpu_cells.sh on the CPU, one tiny cell: the outcome gathered, and the compile caches carried from one
device call to the next — unpacked from a carried .whl/compile-cache.*, packed small at the end (Triton's text IRs
left behind, the binaries, metadata and PTX kept), as a file the device can return."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNEL = {"cubin": b"\x7fELF" * 512, "json": b'{"name": "k"}', "ptx": b".version 8.7\n" * 40, "llir": b"define void @k\n" * 900,
          "ttir": b"tt.func @k\n" * 90, "ttgir": b"ttg.func @k\n" * 90, "source": b"@triton.jit\n" * 20}


@pytest.mark.slow
def test_one_cell_on_the_cpu_and_the_compile_caches_carried_between_calls(tmp_path):
    work = tmp_path / "checkout"  # what travels: the packages, the scripts, a .whl holding only the last call's caches
    work.mkdir()
    for name in ("benchmarks", "harness", "pcg_core"):
        (work / name).symlink_to(ROOT / name)
    (work / ".whl").mkdir()
    seed = tmp_path / "seed" / "triton" / "AAAA"
    seed.mkdir(parents=True)
    for ext, data in KERNEL.items():
        (seed / f"k.{ext}").write_bytes(data)
    with tarfile.open(work / ".whl" / "compile-cache.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "seed" / "triton", arcname="./triton")
    (work / "list.txt").write_text("# one tiny cell\nqwen3-0.6b:tiny sdpa piecewise eager none 64\n")
    cache, out = tmp_path / "cache", tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PCG_COMPILE_CACHE": str(cache), "DEVICE": "cpu", "NAME": "t",
           "CELL_JOBS": "1", "LIST_TIMEOUT": "400"}
    run = subprocess.run(["bash", "benchmarks/gpu_cells.sh", "list.txt"], cwd=work, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    outcome = json.loads((out / "t.jsonl").read_text().splitlines()[0])
    assert outcome["spec"]["model"] == "qwen3-0.6b" and outcome["status"] == "pass", outcome.get("reason")
    marks = [line.split()[1] for line in (out / "t.err").read_text().splitlines() if line.startswith("PCG-PHASE ")]
    assert marks == list(outcome["metrics"]["process"]["phase_s"])  # the cell's log: when each phase began
    assert (cache / "triton" / "AAAA" / "k.llir").exists()  # the carried cache was unpacked where the kernels look
    pack = out / "compile-cache.tar.xz"
    assert "compile cache (.)" in run.stdout and pack.stat().st_size <= 15 * 2**20
    with tarfile.open(pack) as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"k.cubin", "k.json", "k.ptx"} <= names and not names & {"k.llir", "k.ttir", "k.ttgir", "k.source"}


@pytest.mark.parametrize("cold", [False, True])
def test_gpu_env_seeds_the_compile_cache_unless_told_to_start_cold(tmp_path, cold):
    """gpu_env.sh unpacks a carried cache where the kernels look; NO_CACHE_SEED=1 (gpu_speed.sh: issue 38 times the
    ladder built cold) leaves the cache empty."""
    (tmp_path / ".whl").mkdir()
    (tmp_path / "seed" / "triton").mkdir(parents=True)
    (tmp_path / "seed" / "triton" / "k.cubin").write_bytes(KERNEL["cubin"])
    with tarfile.open(tmp_path / ".whl" / "compile-cache.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "seed" / "triton", arcname="./triton")
    cache = tmp_path / "cache"
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PCG_COMPILE_CACHE": str(cache),
           **({"NO_CACHE_SEED": "1"} if cold else {})}
    run = subprocess.run(["bash", "-c", f"source {ROOT}/benchmarks/gpu_env.sh"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert (cache / "triton").is_dir(), run.stderr[-2000:]
    assert (cache / "triton" / "k.cubin").exists() is not cold


def test_gpu_speed_starts_cold():
    """gpu_speed.sh's own cache and no seed, set before gpu_env.sh is sourced."""
    text = (ROOT / "benchmarks" / "gpu_speed.sh").read_text()
    cold = text.index("NO_CACHE_SEED=1")
    assert "PCG_COMPILE_CACHE=" in text[:cold + 20] and cold < text.index("gpu_env.sh\"\n")
