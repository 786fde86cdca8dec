"""`pcgh cell` with the fp4 scheme: NVFP4 checkpoints written in the real formats (ModelOpt in config.json and in its
legacy hf_quant_config.json, compressed-tensors nvfp4-pack-quantized) load into Fp4Linear and run eager and under
each capture backend, judged like any cell — Qwen3-MoE's per-expert NVFP4 tensors too; a synthetic model is quantized
in memory; a card without an fp4 checkpoint is unsupported before any weight is built."""

from __future__ import annotations

import pytest
import torch

from harness.cards import CARDS_DIR
from harness.cell.run import run_cell
from harness.cell.spec import CellSpec
from harness.outcome import Status
from pcg_core.model.loader import build_config, read_config_file, shrink_config, synthetic_model
from pcg_core.quant import FP4_SCHEMES, write_checkpoint

CONFIGS = {"llama": "meta-llama__Llama-3.1-8B-Instruct.json", "qwen3": "Qwen__Qwen3-0.6B.json",
           "qwen3-moe": "Qwen__Qwen3-30B-A3B.json"}
WIDEN = {"qwen3-moe": {"moe_intermediate_size": 64}}  # the tiny MoE's 48-wide experts: a whole number of blocks of 16 (and of 32)
FORMATS = {"modelopt": ("modelopt", False), "modelopt-legacy": ("modelopt", True),
           "compressed-tensors": ("compressed-tensors", False)}


@pytest.mark.slow
@pytest.mark.parametrize("fmt, model, graph", [
    ("modelopt", "llama", "piecewise"), ("compressed-tensors", "llama", "breakable"),
    ("compressed-tensors", "qwen3", "piecewise"), ("modelopt-legacy", "qwen3", "breakable"),
    ("modelopt", "qwen3-moe", "piecewise"), ("compressed-tensors", "qwen3-moe", "breakable"),
])
def test_fp4_checkpoint_cells_pass(fmt, model, graph, tmp_path):
    data = shrink_config(read_config_file(CARDS_DIR / "configs" / CONFIGS[model]), tiny=True, layers=2)
    data |= WIDEN.get(model, {})
    float_model = synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True)
    fmt_name, legacy = FORMATS[fmt]
    write_checkpoint(float_model, data, tmp_path, fmt_name, FP4_SCHEMES["nvfp4"], legacy=legacy)
    out = run_cell(CellSpec(str(tmp_path), weights="real", quant="fp4", graph=graph, max_tokens=64, max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    # 7 linears per layer (MoE: 4 attention linears and the experts), 2 layers; lm_head stays in 16 bits
    assert out.metrics.quant.quant_layers == (10 if model == "qwen3-moe" else 14)
    wrong = run_cell(CellSpec(str(tmp_path), weights="real", quant="gptq", graph=graph, max_tokens=64, max_new_tokens=2))
    assert wrong.status == Status.UNSUPPORTED and "fp4" in wrong.reason  # the checkpoint's scheme, not the asked one


def test_a_synthetic_fp4_cell_passes():
    out = run_cell(CellSpec("llama-3.1-8b", tiny=True, quant="fp4", graph="piecewise", max_tokens=64, max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    assert out.metrics.quant.quant_layers == 14 and out.metrics.quant.quant_logprob_diff > 0


def test_fp4_cells_refuse_what_they_cannot_run_yet_before_loading():
    real = run_cell(CellSpec("llama-3.1-8b", weights="real", quant="fp4"))
    assert real.status == Status.UNSUPPORTED and "declares no nvfp4 checkpoint" in real.reason
    moe = run_cell(CellSpec("qwen3-30b-a3b", weights="real", quant="fp4"))  # MoE checkpoints are read (above)
    assert moe.status == Status.UNSUPPORTED and "declares no nvfp4 checkpoint" in moe.reason
    assert moe.metrics.quant.quant_layers is None  # stopped before quantizing anything


@pytest.mark.slow
def test_gpt_oss_mxfp4_checkpoint_cell_passes(tmp_path):
    """gpt-oss in its own format (experts in MXFP4 blocks, linears 16-bit), loaded and judged like any cell."""
    data = shrink_config(read_config_file(CARDS_DIR / "configs" / "openai__gpt-oss-120b.json"), tiny=True, layers=2)
    float_model = synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True)
    write_checkpoint(float_model, data, tmp_path, "mxfp4", FP4_SCHEMES["mxfp4"])
    out = run_cell(CellSpec(str(tmp_path), weights="real", quant="mxfp4", graph="breakable", max_tokens=64,
                            max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    assert out.metrics.quant.quant_layers == 2  # the two layers' experts; every linear stays 16-bit
