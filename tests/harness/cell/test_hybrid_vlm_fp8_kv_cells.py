"""kv_cache=fp8_e4m3 on the new architectures, tiny on the CPU. A VLM's vision tower has no KV cache: the
reference layer rounds K and V in its text model's attention only (before, it set the FP8 implementation on every
sub-model, and the vision attention, which has no scales, broke the layer: "not measured"). Qwen3-Next's scales
are its full-attention layers' (its linear ones have no KV cache). A cache that divides by the scale on write and
never multiplies back (graph = eager, both read it so) is caught by the reference layer on a VLM too."""

from __future__ import annotations

import pytest

import pcg_core.attention.kv_cache as kv_cache_module
from harness.cell import CellSpec, run_cell
from harness.cell.judge import reference as reference_module
from harness.cell.judge.kv_reference import text_only
from pcg_core.model.loader import build_config, read_config_file, shrink_config


def _cell(model: str, graph: str, quant: str = "none"):
    return run_cell(CellSpec(model=model, tiny=True, graph=graph, quant=quant, kv_cache="fp8_e4m3", max_tokens=16,
                             max_new_tokens=4))


def _passes(r) -> None:
    assert r.status == "pass", (r.status, r.reason)
    m = r.metrics
    assert m.settings.kv_cache == "fp8_e4m3" and m.quant.kv_scales == "calibrated"
    assert m.judge.reference.status == "pass" and "K/V rounded to FP8" in m.judge.reference.summary(), m.judge.reference.summary()


def test_text_only_targets_the_text_model_of_a_vlm(configs):
    vlm = build_config(shrink_config(read_config_file(configs / "Qwen__Qwen3-VL-30B-A3B-Instruct.json"), tiny=True))
    assert text_only(vlm, "fp8", "sdpa") == {"": "fp8", "text_config": "fp8", "vision_config": "sdpa"}
    text = build_config(shrink_config(read_config_file(configs / "Qwen__Qwen3-8B.json"), tiny=True))
    assert text_only(text, "fp8", "sdpa") == "fp8"


@pytest.mark.slow
@pytest.mark.parametrize("model, graph, quant", [("qwen3-vl-30b-a3b", "piecewise", "none"),
                                                 ("qwen2.5-vl-7b", "breakable", "fp8_block"),
                                                 ("qwen3-next-80b-a3b", "breakable", "none")])
def test_fp8_kv_cells_pass_with_the_reference_layer_measured(model, graph, quant):
    _passes(_cell(model, graph, quant))


@pytest.mark.slow
def test_rounding_on_every_sub_model_leaves_the_layer_unmeasured(monkeypatch):
    """The check above can fail: with the FP8 implementation set on the vision tower too, as before."""
    monkeypatch.setattr(reference_module, "text_only", lambda config, implementation, others: implementation)
    r = _cell("qwen2.5-vl-7b", "piecewise")
    assert r.metrics.judge.reference.status == "not_measured" and "pcg_ref_kv_scale" in r.metrics.judge.reference.summary()


@pytest.mark.slow
def test_a_scale_never_multiplied_back_is_caught_on_a_vlm(monkeypatch):
    monkeypatch.setattr(kv_cache_module, "dequantize_kv", lambda x, scale, dtype: x.float().to(dtype))
    r = _cell("qwen2.5-vl-7b", "piecewise")
    assert r.status == "fail_accuracy" and r.metrics.judge.reference.status == "fail", (r.status, r.reason)
