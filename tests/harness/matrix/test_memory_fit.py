"""Memory fit in the pre-check: weights + KV + graphs per GPU, divided as the parallel mode divides them, against
the GPU's memory; a cell that cannot fit is refused with the GPUs it needs. The nightly's cells carry their GPU
counts and all fit one 80 GiB GPU per rank."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from harness.cards import find_card
from harness.launcher import RunOptions
from harness.matrix import expand, load_matrix, precheck
from harness.matrix.fit import estimate, fit_reason, scaled, trimmed
from harness.shape.params import count
from harness.shape.structure import read_structure
from pcg_core.capabilities import capabilities

GIB = 2**30
NIGHTLY = Path(__file__).parents[3] / "harness" / "configs" / "nightly.yaml"


def test_the_weights_are_the_parameter_count_in_the_dtype_and_the_mode_divides_them():
    config = find_card("qwen3-8b").config
    total = count(config, read_structure(config, "x"), "x").total
    one = estimate(config, "tp1", "bfloat16", None, 4096)
    assert one.weights == pytest.approx(2 * total, rel=1e-6)  # tp1, bf16: every parameter, 2 bytes
    two = estimate(config, "tp2", "bfloat16", None, 4096)
    assert 0.49 < two.weights / one.weights < 0.51 and two.kv < one.kv and two.graphs < one.graphs
    assert estimate(config, "tp1-dp2", "bfloat16", None, 4096).weights == one.weights  # DP replicates
    assert estimate(config, "tp1", "bfloat16", "int4", 4096).weights < 0.4 * one.weights  # 4-bit linears (embeddings stay 16-bit)
    assert estimate(config, "tp1", "bfloat16", None, 4096, kv_cache="fp8_e4m3").kv == one.kv // 2


def test_expert_parallelism_divides_the_experts_only():
    config = trimmed(find_card("qwen3-30b-a3b").config, 4)
    one, ep = estimate(config, "tp1", "bfloat16", None, 1024), estimate(config, "ep4", "bfloat16", None, 1024)
    b = count(config, read_structure(config, "x"), "x").breakdown
    assert one.weights - ep.weights == pytest.approx(2 * b["experts"] * 3 / 4, rel=1e-6)


def test_a_model_too_big_for_its_gpus_needs_more_of_them():
    config = trimmed(find_card("kimi-k2").config, 4)  # 3 MoE layers of 384 experts: ~100 GiB of bf16 weights
    why = fit_reason(config, "tp1", "bfloat16", None, 4096, "auto", 80 * GIB)
    assert why.startswith("needs 2 GPUs: at tp1 ~") and "over the GPU's 80.0 GiB; tp2 would fit" in why
    assert fit_reason(config, "tp2", "bfloat16", None, 4096, "auto", 80 * GIB) is None
    assert fit_reason(config, "tp1", "bfloat16", "fp8", 4096, "auto", 80 * GIB) is None  # 8-bit experts fit one
    assert fit_reason(config, "tp1", "bfloat16", None, 4096, "auto", 141 * GIB) is None  # an H200 holds it
    whole = find_card("deepseek-v3").config
    assert fit_reason(whole, "tp1", "bfloat16", None, 4096, "auto", 80 * GIB).startswith("needs 32 GPUs")
    assert scaled("tp2-ep8", 2) == "tp4-ep8" and scaled("pp2", 4) == "tp4-pp2"


def _cell(tmp_path: Path, model: str, parallel: str = "tp1"):
    path = tmp_path / "m.yaml"
    path.write_text(f"name: f\ndefaults: {{device: cuda, dtype: bfloat16}}\naxes:\n  model: ['{model}']\n"
                    f"  graph: [piecewise]\n  parallel: [{parallel}]\n")
    return expand(load_matrix(path))[0]


def test_the_precheck_refuses_a_cell_that_cannot_fit_with_the_gpus_it_needs(tmp_path):
    caps = capabilities()
    caps.update(cuda_devices=8, cuda_memory_bytes=80 * GIB)
    why = precheck(_cell(tmp_path, "kimi-k2:trim:4"), caps, {})
    assert why is not None and why.startswith("needs 2 GPUs: at tp1"), why
    assert precheck(_cell(tmp_path, "kimi-k2:trim:2"), caps, {}) is None
    caps["cuda_memory_bytes"] = 141 * GIB
    assert precheck(_cell(tmp_path, "kimi-k2:trim:4"), caps, {}) is None
    del caps["cuda_memory_bytes"]  # a host whose GPU memory is unknown: no fit check
    assert precheck(_cell(tmp_path, "kimi-k2:trim:4"), caps, {}) is None


def test_the_nightly_fits_80_gib_gpus_and_its_parallel_cells_carry_their_gpu_counts(monkeypatch):
    plan_module = importlib.import_module("harness.launcher.plan")
    real = plan_module.capabilities

    def h100s():
        out = real()
        out.update(cuda_devices=8, cuda_memory_bytes=80 * GIB)
        return out

    monkeypatch.setattr(plan_module, "capabilities", h100s)
    cells = plan_module.plan(NIGHTLY, RunOptions()).cells
    assert not [c.key for c in cells if (c.unsupported or "").startswith("needs")]
    gpus = {c.axes["parallel"]: c.gpus for c in cells}
    assert gpus == {"tp1": 1, "tp2": 2, "tp2-ep2": 2, "pp2": 2, "dp2": 2, "ep2": 2, "tp2-pp2": 4, "pp2-ep2": 4,
                    "tp2-dp2": 4, "tp2-ep4": 4}
