"""Handing GPUs to cells: a cell holds one GPU per rank, cells of different sizes run side by side on one host,
first come first served, and a cell that needs more GPUs than the host has is refused before launch."""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
from pathlib import Path

import pytest
import yaml

from harness.launcher import RunOptions, plan, ranks, run_matrix
from harness.launcher.gpus import GpuPool
from harness.launcher.groups import Cancelled
from harness.outcome import Status
from harness.store import Store
from pcg_core import capabilities as capabilities_module
from pcg_core.capture.breakable import BreakableBackend
from pcg_core.capture.registry import CAPTURE_BACKENDS, register_capture_backend

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
plan_module = importlib.import_module("harness.launcher.plan")  # the module (the package's `plan` is its function)
for _name in ("test_gpus_hold", "test_ranks_allreduce_nccl"):
    if _name not in CAPTURE_BACKENDS.names():
        register_capture_backend(type(f"Planted_{_name}", (BreakableBackend,), {"name": _name}))


def _later(fn, *args) -> tuple[threading.Thread, list]:
    got: list = []
    t = threading.Thread(target=lambda: got.append(fn(*args)), daemon=True)
    t.start()
    return t, got


def test_a_2_gpu_and_a_1_gpu_cell_share_a_3_gpu_host():
    pool = GpuPool(range(3))
    two = pool.acquire(2)
    one = pool.acquire(1, timeout=1)  # the third GPU: no wait
    assert sorted(two + one) == [0, 1, 2]
    pool.release(two)
    assert sorted(pool.acquire(2, timeout=1)) == [0, 1]


def test_a_waiting_2_gpu_cell_is_not_overtaken_by_later_1_gpu_cells():
    pool = GpuPool(range(3))
    held = pool.acquire(2)  # GPUs 0, 1; one free
    waiter, got_two = _later(pool.acquire, 2)
    time.sleep(0.2)
    assert got_two == []  # one free GPU is not two
    late, got_one = _later(pool.acquire, 1)
    time.sleep(0.2)
    assert got_one == []  # the free GPU waits for the 2-GPU cell that asked first
    pool.release(held)
    waiter.join(5)
    late.join(5)
    assert len(got_two[0]) == 2 and len(got_one[0]) == 1 and not set(got_two[0]) & set(got_one[0])


def test_more_gpus_than_the_host_has_is_refused_and_closing_cancels_waiters():
    pool = GpuPool(range(3))
    with pytest.raises(ValueError, match="needs 16 GPUs; this host has 3"):
        pool.acquire(16)
    pool.acquire(3)
    errors: list = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(Cancelled, pool.acquire, 1)), daemon=True)
    t.start()
    time.sleep(0.1)
    pool.close()
    t.join(5)
    assert not t.is_alive() and errors
    busy = GpuPool([0])
    busy.acquire(1)
    with pytest.raises(TimeoutError):
        busy.acquire(1, timeout=0.05)


@pytest.fixture
def three_gpu_host(tmp_path, monkeypatch):
    """A planted worker, a host of 3 GPUs as the planner sees it, and parallel modes the runtime lacks let through
    (the refusal tested here is the GPU count's)."""
    monkeypatch.setattr(ranks, "WORKER", [str(HERE / "planted_rank_worker.py")])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PCG_TEST_FLAKY_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    real = plan_module.capabilities

    def caps():
        out = real()
        out["cuda_devices"] = 3
        return out

    monkeypatch.setattr(plan_module, "capabilities", caps)
    monkeypatch.setattr(capabilities_module, "parallel_unsupported_reason", lambda *a, **k: None)


def test_cells_of_different_sizes_run_side_by_side_and_a_16_gpu_cell_is_refused(tmp_path, three_gpu_host):
    matrix = tmp_path / "m.yaml"
    matrix.write_text(yaml.safe_dump({
        "name": "gpus",
        "defaults": {"device": "cuda", "dtype": "bfloat16", "max_tokens": 16, "max_new_tokens": 2, "timeout_s": 60},
        "axes": {"model": ["qwen3-0.6b:trim:1"], "graph": ["test_gpus_hold"], "parallel": ["tp2", "tp1", "tp16"]},
    }))
    p = plan(matrix, RunOptions())
    by_mode = {c.axes["parallel"]: c for c in p.cells}
    assert by_mode["tp16"].unsupported.startswith("needs 16 GPUs (tp16: one per rank, on one host), 3 visible")
    assert by_mode["tp2"].unsupported is None and by_mode["tp1"].unsupported is None
    with Store(str(tmp_path / "r.db")) as store:
        run_id = run_matrix(matrix, store, RunOptions(logs_dir=tmp_path / "logs", progress=False), planned=p)
        rows = {r.axes["parallel"]: r for r in store.results(run_id)}
    assert rows["tp16"].status == Status.UNSUPPORTED and rows["tp16"].metrics.process.gpus == 16  # what it would need
    assert rows["tp2"].status == Status.PASS, rows["tp2"].reason + rows["tp2"].log
    assert rows["tp1"].status == Status.PASS, rows["tp1"].reason + rows["tp1"].log
    two, one = json.loads(rows["tp2"].reason), json.loads(rows["tp1"].reason)  # rank 0's view of each
    assert (rows["tp2"].metrics.process.gpus, rows["tp1"].metrics.process.gpus) == (2, 1)
    assert len(two["CUDA_VISIBLE_DEVICES"].split(",")) == 2 and len(one["CUDA_VISIBLE_DEVICES"].split(",")) == 1
    assert not set(two["CUDA_VISIBLE_DEVICES"].split(",")) & set(one["CUDA_VISIBLE_DEVICES"].split(","))
    assert two["start"] < one["end"] and one["start"] < two["end"]  # side by side, not one after the other


@pytest.mark.gpu
@pytest.mark.skipif(__import__("torch").cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_two_ranks_all_reduce_over_nccl_each_on_its_gpu(tmp_path, monkeypatch):
    """On a host of 2+ GPUs: a tp2 cell holds two of them, and its ranks rendezvous over NCCL, one GPU each."""
    import torch

    monkeypatch.setattr(ranks, "WORKER", [str(HERE / "planted_rank_worker.py")])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PCG_TEST_FLAKY_DIR", str(tmp_path))
    matrix = tmp_path / "m.yaml"
    matrix.write_text(yaml.safe_dump({
        "name": "nccl",
        "defaults": {"device": "cuda", "dtype": "bfloat16", "max_tokens": 16, "max_new_tokens": 2, "timeout_s": 300},
        "axes": {"model": ["qwen3-0.6b:trim:1"], "graph": ["test_ranks_allreduce_nccl"], "parallel": ["tp2"]},
    }))
    p = plan(matrix, RunOptions())
    p.cells[0].unsupported = None  # the runtime's tp2 aside: the wiring is what is tested
    with Store(str(tmp_path / "r.db")) as store:
        run_id = run_matrix(matrix, store, RunOptions(logs_dir=tmp_path / "logs", progress=False, retry=False), planned=p)
        row = store.results(run_id)[0]
    assert row.status == Status.PASS, row.reason + row.log[-3000:]
    got = json.loads(row.reason)
    assert got["sum"] == 3.0 and got["backend"] == "nccl" and got["device_count"] == 2 and row.metrics.process.gpus == 2
    assert len(got["CUDA_VISIBLE_DEVICES"].split(",")) == 2 and torch.cuda.device_count() >= 2
