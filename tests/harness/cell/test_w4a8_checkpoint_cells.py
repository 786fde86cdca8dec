"""`pcgh cell` with W4A8 (int4 weights × int8 activations) and W4AFP8 (× FP8 activations): compressed-tensors
pack-quantized checkpoints written in the real format load into W4A8Linear and run eager and under each capture
backend, judged like any cell; synthetic weights quantized in memory run the same way; MoE is refused by name."""

from __future__ import annotations

import pytest
import torch

from harness.cards import CARDS_DIR
from harness.cell.run import run_cell
from harness.cell.spec import CellSpec
from harness.outcome import Status
from pcg_core.model.loader import build_config, read_config_file, shrink_config, synthetic_model
from pcg_core.quant.checkpoint import write_checkpoint
from pcg_core.quant.int4 import INT4_SCHEMES

CONFIGS = {"llama": "meta-llama__Llama-3.1-8B-Instruct.json", "qwen3": "Qwen__Qwen3-0.6B.json"}


@pytest.mark.slow
@pytest.mark.parametrize("quant, model, graph", [
    ("w4a8", "llama", "piecewise"), ("w4a8", "qwen3", "breakable"),
    ("w4afp8", "llama", "breakable"), ("w4afp8", "qwen3", "piecewise"),
])
def test_w4a8_checkpoint_cells_pass(quant, model, graph, tmp_path):
    data = shrink_config(read_config_file(CARDS_DIR / "configs" / CONFIGS[model]), tiny=True, layers=2)
    float_model = synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True)
    write_checkpoint(float_model, data, tmp_path, "compressed-tensors", INT4_SCHEMES[quant])
    out = run_cell(CellSpec(str(tmp_path), weights="real", quant=quant, graph=graph, max_tokens=64, max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    assert out.metrics.quant_layers == 14  # 7 linears per layer, 2 layers; lm_head stays in 16 bits
    other = "w4afp8" if quant == "w4a8" else "w4a8"
    wrong = run_cell(CellSpec(str(tmp_path), weights="real", quant=other, graph=graph, max_tokens=64, max_new_tokens=2))
    assert wrong.status == Status.UNSUPPORTED and quant in wrong.reason  # the checkpoint's scheme, not the asked one


@pytest.mark.slow
@pytest.mark.parametrize("quant, model, graph", [
    ("w4a8", "qwen3-0.6b", "piecewise"), ("w4afp8", "llama-3.1-8b", "breakable"),
])
def test_w4a8_synthetic_cells_pass(quant, model, graph):
    out = run_cell(CellSpec(model, tiny=True, layers=2, weights="synthetic", quant=quant, graph=graph, max_tokens=64,
                            max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    assert out.metrics.quant_layers == 14


def test_w4a8_moe_cells_are_refused_by_name():
    out = run_cell(CellSpec("qwen3-30b-a3b", tiny=True, weights="synthetic", quant="w4a8", max_tokens=32, max_new_tokens=2))
    assert out.status == Status.UNSUPPORTED and "W4A8 MoE experts" in out.reason, out.reason


def test_pcgh_request_verdicts_on_w4a8_checkpoints():
    """A compressed-tensors W4A8 checkpoint's quant verdict: the dense model's runs (as w4a8), the MoE's is refused."""
    import json

    from harness.request.analyze import analyze

    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                           "group_size": 128},
        "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": True, "strategy": "token"}}}}

    def verdict(config: str) -> dict:
        data = json.loads((CARDS_DIR / "configs" / config).read_text())
        return analyze(data | {"quantization_config": qc})["verdicts"]["quant"]

    dense = verdict(CONFIGS["qwen3"])
    assert dense["ok"] and "as w4afp8" in dense["reason"], dense
    moe = verdict("Qwen__Qwen3-30B-A3B.json")
    assert not moe["ok"] and "W4A8 MoE experts" in moe["reason"], moe
