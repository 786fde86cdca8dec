"""`pcgh cell` on checkpoints that declare an FP8 KV cache (ModelOpt FP8 in its legacy hf_quant_config.json, ModelOpt
NVFP4 in config.json, compressed-tensors on an MLA model), written by pcg's writers with calibrated k/v scales: they
load, pass like any cell, and the outcome records the scales as read, checked and not applied (the KV cache runs in
the model dtype); a checkpoint whose scales are broken ends the cell unsupported, naming the tensor."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.cards import CARDS_DIR
from harness.cell.run import run_cell
from harness.cell.spec import CellSpec
from harness.metrics import CellMetrics, CheckpointKvScales
from harness.outcome import CellRecord, Status
from pcg_core.config import CaptureConfig, EngineConfig
from pcg_core.engine import Engine
from pcg_core.model.loader import (
    build_config,
    read_config_file,
    shrink_config,
    synthetic_model,
)
from pcg_core.quant import (
    FP4_SCHEMES,
    SCHEMES,
    producer_kv_scales,
    record_input_absmax,
    write_checkpoint,
)

CONFIGS = {"qwen3": "Qwen__Qwen3-0.6B.json", "deepseek-v3": "deepseek-ai__DeepSeek-V3.json"}
CASES = {  # name: (model, format, scheme, legacy declaration, the cell's quant)
    "modelopt-fp8-legacy": ("qwen3", "modelopt", SCHEMES["fp8_per_tensor"], True, "fp8_per_tensor"),
    "modelopt-nvfp4": ("qwen3", "modelopt", FP4_SCHEMES["nvfp4"], False, "fp4"),
    "compressed-tensors-fp8-mla": ("deepseek-v3", "compressed-tensors", SCHEMES["fp8_per_token"], False, "fp8_per_token"),
}


def _write(tmp_path, case: str) -> dict[int, tuple[float, float]]:
    model_name, fmt, scheme, legacy, _ = CASES[case]
    data = shrink_config(read_config_file(CARDS_DIR / "configs" / CONFIGS[model_name]), tiny=True, layers=2)
    model = synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=0, peaked=True)
    ids = torch.randint(0, data["vocab_size"], (1, 24), generator=torch.Generator().manual_seed(3))
    kv = producer_kv_scales(model, ids)
    absmax = None
    if not getattr(scheme, "act_dynamic", True):  # static input scales: calibrated through pcg's engine
        engine = Engine(model, EngineConfig(device="cpu", dtype="float32", kv_slots=64,
                                            capture=CaptureConfig(backend="disabled", max_tokens=64)))
        with record_input_absmax(model) as absmax:
            engine.forward(engine.prefill_batch([ids[0].tolist()]))
    write_checkpoint(model, data, tmp_path, fmt, scheme, legacy=legacy, input_absmax=absmax, kv_scales=kv)
    return kv


@pytest.mark.slow
@pytest.mark.parametrize("case, graph", [("modelopt-fp8-legacy", "piecewise"), ("modelopt-nvfp4", "breakable"),
                                         ("compressed-tensors-fp8-mla", "piecewise")])
def test_checkpoints_declaring_an_fp8_kv_cache_pass_and_record_the_scales(case, graph, tmp_path):
    kv = _write(tmp_path, case)
    quant = CASES[case][4]
    out = run_cell(CellSpec(str(tmp_path), weights="real", quant=quant, graph=graph, max_tokens=64, max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    rec = out.metrics.quant.checkpoint_kv_scales
    assert rec is not None and rec.layers == 2 and rec.applied is False
    ks, vs = [k for k, _ in kv.values()], [v for _, v in kv.values()]
    assert rec.k_min == pytest.approx(min(ks), rel=1e-2) and rec.v_max == pytest.approx(max(vs), rel=1e-2)
    assert "declares an FP8 KV cache" in out.reason and "not applied" in out.reason
    # The record survives the store's round trip.
    back = CellRecord.read(json.loads(CellRecord.of("k", {a: "x" for a in ("model", "quant", "attention", "parallel",
                                                                          "graph", "compiler")}, out).model_dump_json()))
    assert back.metrics.quant.checkpoint_kv_scales == rec


@pytest.mark.slow
def test_a_broken_kv_scale_ends_the_cell_unsupported_naming_it(tmp_path):
    _write(tmp_path, "modelopt-nvfp4")
    f = tmp_path / "model.safetensors"
    t = load_file(f)
    t["model.layers.1.self_attn.v_proj.v_scale"] = torch.tensor(float("nan"))
    save_file(t, f)
    out = run_cell(CellSpec(str(tmp_path), weights="real", quant="fp4", graph="breakable", max_tokens=64, max_new_tokens=2))
    assert out.status == Status.UNSUPPORTED
    assert "model.layers.1.self_attn.v_proj.v_scale is nan" in out.reason and "model.safetensors" in out.reason


def test_rows_stored_before_the_field_still_read():
    assert CellMetrics.lenient({"quant_layers": 3}).quant.checkpoint_kv_scales is None
    odd = CellMetrics.lenient({"quant_layers": 3, "checkpoint_kv_scales": "yes"})  # a value of another shape: dropped
    assert odd.quant.quant_layers == 3 and odd.quant.checkpoint_kv_scales is None


def test_the_summary_says_what_was_read_and_whether_it_was_applied():
    rec = CheckpointKvScales(layers=2, k_min=0.0065, k_max=0.0067, v_min=0.0072, v_max=0.0075)
    line = rec.summary()
    assert "2 attention layers" in line and "k 0.0065–0.0067" in line and "not applied" in line
    assert "not applied" not in CheckpointKvScales(layers=2, applied=True).summary()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["modelopt-fp8-legacy", "compressed-tensors-fp8-mla"])
def test_an_fp8_kv_cache_cell_applies_the_checkpoints_scales(case, tmp_path):
    """kv_cache=fp8_e4m3 on a checkpoint that declares its scales: the cell runs on those (not calibrated ones),
    held to the reference like any FP8-cache cell, and the record says they were applied."""
    _write(tmp_path, case)
    out = run_cell(CellSpec(str(tmp_path), weights="real", quant=CASES[case][4], graph="piecewise", kv_cache="fp8_e4m3",
                            max_tokens=64, max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    assert out.metrics.quant.kv_scales == "checkpoint" and out.metrics.quant.checkpoint_kv_scales.applied is True
    assert "applied" in out.reason and "not applied" not in out.reason
