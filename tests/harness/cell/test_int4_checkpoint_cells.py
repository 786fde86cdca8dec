"""`pcgh cell` on int4 checkpoints written in the real formats (AWQ gemm, GPTQ v1 with act-order, compressed-tensors
pack-quantized with zero points): the loader's int4 linears run eager and under each capture backend, judged like
any cell; across the pairs every format meets both models and both capture backends."""

from __future__ import annotations

import pytest
import torch

from harness.cards import CARDS_DIR
from harness.cell.run import run_cell
from harness.cell.spec import CellSpec
from harness.outcome import Status
from pcg_core.model.loader import build_config, read_config_file, shrink_config, synthetic_model
from pcg_core.quant import INT4_SCHEMES, Int4Scheme, write_checkpoint

CONFIGS = {"llama": "meta-llama__Llama-3.1-8B-Instruct.json", "qwen3": "Qwen__Qwen3-0.6B.json",
           "qwen3-moe": "Qwen__Qwen3-30B-A3B.json"}
# The tiny MoE's 48-wide experts widened to widths the formats' groups (32 and up) divide
WIDEN = {"qwen3-moe": {"hidden_size": 128, "moe_intermediate_size": 128}}
FORMATS = {
    "awq": ("awq", INT4_SCHEMES["awq"]),
    "gptq": ("gptq", INT4_SCHEMES["gptq"]),  # symmetric, act-order: g_idx on disk, the activation permuted
    "compressed-tensors": ("compressed-tensors", Int4Scheme("gptq", 128, sym=False, act_order=False, description="")),
}


@pytest.mark.slow
@pytest.mark.parametrize("fmt, model, graph", [
    ("awq", "llama", "piecewise"), ("awq", "qwen3", "breakable"),
    ("gptq", "llama", "breakable"), ("gptq", "qwen3", "piecewise"),
    ("compressed-tensors", "llama", "piecewise"), ("compressed-tensors", "qwen3", "breakable"),
    ("awq", "qwen3-moe", "piecewise"), ("gptq", "qwen3-moe", "breakable"),
    ("compressed-tensors", "qwen3-moe", "piecewise"),
])
def test_int4_checkpoint_cells_pass(fmt, model, graph, tmp_path):
    data = shrink_config(read_config_file(CARDS_DIR / "configs" / CONFIGS[model]), tiny=True, layers=2)
    data |= WIDEN.get(model, {})
    float_model = synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True)
    fmt_name, scheme = FORMATS[fmt]
    write_checkpoint(float_model, data, tmp_path, fmt_name, scheme)
    out = run_cell(CellSpec(str(tmp_path), weights="real", quant=scheme.name, graph=graph, max_tokens=64, max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    # 7 linears per layer (MoE: 4 attention linears and the experts), 2 layers; lm_head stays in 16 bits
    assert out.metrics.quant.quant_layers == (10 if model == "qwen3-moe" else 14)
    other = "awq" if scheme.name == "gptq" else "gptq"
    wrong = run_cell(CellSpec(str(tmp_path), weights="real", quant=other, graph=graph, max_tokens=64, max_new_tokens=2))
    assert wrong.status == Status.UNSUPPORTED and scheme.name in wrong.reason  # the checkpoint's scheme, not the asked one
