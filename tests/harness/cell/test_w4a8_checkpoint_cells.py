"""`pcgh cell` with W4A8 (int4 weights × int8 activations) and W4AFP8 (× FP8 activations): compressed-tensors
pack-quantized checkpoints written in the real format load into W4A8Linear (and Qwen3-MoE's per-expert tensors
into W4A8 experts) and run eager and under each capture backend, judged like any cell; synthetic weights
quantized in memory run the same way. Across the checkpoint cells each scheme meets every model and both capture
backends on Qwen3-MoE."""

from __future__ import annotations

import pytest
import torch

from harness.cards import CARDS_DIR
from harness.cell.run import run_cell
from harness.cell.spec import CellSpec
from harness.outcome import Status
from pcg_core.model.loader import build_config, read_config_file, shrink_config, synthetic_model
from pcg_core.quant.formats.checkpoint import write_checkpoint
from pcg_core.quant.schemes.int4 import INT4_SCHEMES

CONFIGS = {"llama": "meta-llama__Llama-3.1-8B-Instruct.json", "qwen3": "Qwen__Qwen3-0.6B.json",
           "qwen3-moe": "Qwen__Qwen3-30B-A3B.json"}
# The tiny MoE's 48-wide experts widened to widths the groups (32 and up) divide, as the int4 cells do
WIDEN = {"qwen3-moe": {"hidden_size": 128, "moe_intermediate_size": 128}}


@pytest.mark.slow
@pytest.mark.parametrize("quant, model, graph", [
    ("w4a8", "llama", "piecewise"), ("w4a8", "qwen3", "breakable"),
    ("w4afp8", "llama", "breakable"), ("w4afp8", "qwen3", "piecewise"),
    ("w4a8", "qwen3-moe", "piecewise"), ("w4a8", "qwen3-moe", "breakable"),
    ("w4afp8", "qwen3-moe", "piecewise"), ("w4afp8", "qwen3-moe", "breakable"),
])
def test_w4a8_checkpoint_cells_pass(quant, model, graph, tmp_path):
    data = shrink_config(read_config_file(CARDS_DIR / "configs" / CONFIGS[model]), tiny=True, layers=2)
    data |= WIDEN.get(model, {})
    float_model = synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True)
    write_checkpoint(float_model, data, tmp_path, "compressed-tensors", INT4_SCHEMES[quant])
    out = run_cell(CellSpec(str(tmp_path), weights="real", quant=quant, graph=graph, max_tokens=64, max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    # 7 linears per layer (MoE: 4 attention linears and the experts), 2 layers; lm_head stays in 16 bits
    assert out.metrics.quant.quant_layers == (10 if model == "qwen3-moe" else 14)
    other = "w4afp8" if quant == "w4a8" else "w4a8"
    wrong = run_cell(CellSpec(str(tmp_path), weights="real", quant=other, graph=graph, max_tokens=64, max_new_tokens=2))
    assert wrong.status == Status.UNSUPPORTED and quant in wrong.reason  # the checkpoint's scheme, not the asked one


@pytest.mark.slow
@pytest.mark.parametrize("quant, model, graph", [
    ("w4a8", "qwen3-0.6b", "piecewise"), ("w4afp8", "llama-3.1-8b", "breakable"),
    ("w4a8", "qwen3-30b-a3b", "breakable"), ("w4afp8", "qwen3-30b-a3b", "piecewise"),
])
def test_w4a8_synthetic_cells_pass(quant, model, graph):
    out = run_cell(CellSpec(model, tiny=True, layers=2, weights="synthetic", quant=quant, graph=graph, max_tokens=64,
                            max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    assert out.metrics.quant.quant_layers == (10 if model == "qwen3-30b-a3b" else 14)  # MoE: 4 attention linears, the experts


@pytest.mark.parametrize("fmt", ["pack-quantized", "int-quantized"])
def test_pcgh_request_verdicts_on_w4a8_checkpoints(fmt):
    """A compressed-tensors W4A8 checkpoint's quant verdict, in either layout: the dense model's and the MoE's both
    run (as w4afp8); int-quantized act-order is refused, saying where act-order is read."""
    import json

    from harness.request.analyze import analyze

    qc = {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                           "group_size": 128},
        "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "token"}}}}

    def verdict(config: str) -> dict:
        data = json.loads((CARDS_DIR / "configs" / config).read_text())
        return analyze(data | {"quantization_config": qc})["verdicts"]["quant"]

    dense = verdict(CONFIGS["qwen3"])
    assert dense["ok"] and "as w4afp8" in dense["reason"], dense
    moe = verdict("Qwen__Qwen3-30B-A3B.json")
    assert moe["ok"] and "as w4afp8" in moe["reason"], moe
    qc["config_groups"]["group_0"]["weights"]["actorder"] = "group"
    ordered = verdict(CONFIGS["qwen3"])
    assert ordered["ok"] is (fmt == "pack-quantized"), ordered
    assert fmt == "pack-quantized" or "act-order is read from pack-quantized" in ordered["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("quant, model, graph, sym", [
    ("w4a8", "qwen3-moe", "piecewise", True), ("w4afp8", "llama", "breakable", True), ("w4a8", "qwen3", "piecewise", False),
])
def test_int_quantized_checkpoint_cells_pass(quant, model, graph, sym, tmp_path):
    """The same schemes as llm-compressor writes them (compressed-tensors int-quantized: 4-bit values in int8),
    symmetric or with zero points, dense and MoE."""
    from pcg_core.quant.schemes.int4 import Int4Scheme

    data = shrink_config(read_config_file(CARDS_DIR / "configs" / CONFIGS[model]), tiny=True, layers=2)
    data |= WIDEN.get(model, {})
    float_model = synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True)
    base = INT4_SCHEMES[quant]
    scheme = Int4Scheme(base.name, base.group, sym=sym, act_order=False, description=base.description,
                        activations=base.activations)
    write_checkpoint(float_model, data, tmp_path, "compressed-tensors", scheme, ct_format="int-quantized")
    out = run_cell(CellSpec(str(tmp_path), weights="real", quant=quant, graph=graph, max_tokens=64, max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    assert out.metrics.quant.quant_layers == (10 if model == "qwen3-moe" else 14)
