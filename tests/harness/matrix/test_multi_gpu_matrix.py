"""harness/configs/multi_gpu.yaml, the parallel cells of issue 45: one matrix for hosts of 2, 4 and 8 GPUs — each
cell carries its GPU count, a cell that needs more GPUs than the host has is refused saying how many, nothing is
refused for memory on 80 GiB GPUs, and the runtime's own refusals (full with a pipeline or linear attention) are the
only others."""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path

import pytest

from harness.launcher import RunOptions

MATRIX = Path(__file__).parents[3] / "harness" / "configs" / "multi_gpu.yaml"
GIB = 2**30


def _plan(monkeypatch, gpus: int):
    plan_module = importlib.import_module("harness.launcher.plan")
    real = plan_module.capabilities

    def host():
        out = real()
        out.update(cuda_devices=gpus, cuda_memory_bytes=80 * GIB)
        return out

    monkeypatch.setattr(plan_module, "capabilities", host)
    return plan_module.plan(MATRIX, RunOptions()).cells


@pytest.mark.parametrize("gpus, launched", [(2, {2: 24}), (4, {2: 24, 4: 12}), (8, {2: 24, 4: 12, 8: 18})])
def test_the_host_s_gpus_decide_what_launches_and_the_rest_says_how_many_it_needs(monkeypatch, gpus, launched):
    cells = _plan(monkeypatch, gpus)
    assert Counter(c.gpus for c in cells if c.unsupported is None) == launched
    for c in cells:
        if c.unsupported is None:
            continue
        if c.gpus > gpus:
            assert c.unsupported.startswith(f"needs {c.gpus} GPUs"), (c.key, c.unsupported)
        else:  # what the runtime itself refuses, with its reason
            assert c.axes["graph"] == "full" and ("between graphs" in c.unsupported or "linear_attention" in c.unsupported), (
                c.key, c.unsupported)


def test_the_cells_users_ask_about_are_there(monkeypatch):
    cells = {(c.axes["model"].split(":")[0], c.axes["parallel"], c.axes["quant"]) for c in _plan(monkeypatch, 8)}
    for want in (("gpt-oss-120b", "tp2", "none"), ("qwen3-next-80b-a3b", "tp2", "none"), ("llama-3.1-8b", "tp2", "fp8_block"),
                 ("llama-3.1-8b", "tp2", "awq"), ("qwen3-30b-a3b", "tp2-ep2", "none"), ("qwen3-30b-a3b", "ep2", "none"),
                 ("llama-3.1-8b", "pp2", "none"), ("qwen3-30b-a3b", "dp2", "none"), ("qwen3-235b-a22b", "tp4", "none"),
                 ("gpt-oss-120b", "tp4", "none"), ("qwen3-235b-a22b", "tp8", "none"), ("deepseek-v3", "tp8-ep8", "none"),
                 ("kimi-k2", "tp8-ep8", "none"), ("grok-2", "tp8", "none")):
        assert want in cells, want
