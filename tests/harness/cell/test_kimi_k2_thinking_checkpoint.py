"""Kimi-K2-Thinking's checkpoint layout at tiny widths: the card's quantization_config (compressed-tensors
pack-quantized int4, symmetric, group 32; attention, shared experts, the dense first layer's MLP and lm_head left
16-bit by its `re:` ignore list) declared verbatim over files our writer packs in that layout, loaded with the
routed experts alone in int4, and judged like any cell. A checkpoint whose files pack a layer that list leaves
16-bit is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from harness.cards import find_card
from harness.cell.run import run_cell
from harness.cell.spec import CellSpec
from harness.outcome import Status
from pcg_core.errors import UnsupportedModel
from pcg_core.model.loader import (
    build_config,
    load_model,
    shrink_config,
    synthetic_model,
)
from pcg_core.quant import Int4Scheme, detect, quantized_modules, write_checkpoint

CARD = find_card("kimi-k2-thinking")
DECLARED = CARD.config["quantization_config"]
# The card's scheme at its own group: symmetric int4, group 32, no act-order (actorder null), 16-bit activations.
SCHEME = Int4Scheme("gptq", 32, sym=True, act_order=False, description="Kimi-K2-Thinking's experts")


def _write(out: Path, ignore: tuple[str, ...]) -> tuple[Path, dict]:
    """A 2-layer tiny K2-Thinking (layer 0 dense, layer 1 routed + shared experts), experts widened to 64 so the
    declared group of 32 divides every expert width, written by our compressed-tensors writer with `ignore`, its
    config.json then declaring the card's quantization_config exactly as the hub checkpoint does. Returns the
    folder and the quantization_config our writer declared for it."""
    data = shrink_config(CARD.config, tiny=True, layers=2) | {"moe_intermediate_size": 64}
    data.pop("quantization_config")
    model = synthetic_model(build_config(data), dtype=torch.float32, device="cpu", seed=3, peaked=True)
    write_checkpoint(model, data, out, "compressed-tensors", SCHEME, ignore=ignore)
    cfg = json.loads((out / "config.json").read_text())
    written = cfg["quantization_config"]
    # what our writer declares for this layout is the card's block on every key it writes
    assert written["config_groups"]["group_0"]["weights"]["group_size"] == 32
    for key in ("quant_method", "format", "quantization_status", "kv_cache_scheme"):
        assert written[key] == DECLARED[key], key
    ours, theirs = written["config_groups"]["group_0"], DECLARED["config_groups"]["group_0"]
    assert ours["targets"] == theirs["targets"] and ours["input_activations"] is theirs["input_activations"] is None
    assert {k: theirs["weights"][k] for k in ours["weights"]} == ours["weights"]
    cfg["quantization_config"] = DECLARED  # the card's block verbatim (observer and all), as the hub's config holds it
    (out / "config.json").write_text(json.dumps(cfg))
    return out, written


@pytest.fixture(scope="module")
def k2_thinking(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out, written = _write(tmp_path_factory.mktemp("k2t"), tuple(DECLARED["ignore"]))
    assert written["ignore"] == DECLARED["ignore"]  # the writer kept exactly the layers the card's list names
    return out


def test_the_files_hold_the_routed_experts_packed_and_everything_the_ignore_list_names_in_16_bits(k2_thinking):
    with safe_open(k2_thinking / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        dtypes = {k: f.get_slice(k).get_dtype() for k in keys}
    packed = {k for k in keys if k.endswith(".weight_packed")}
    assert packed and all(".mlp.experts." in k and k.startswith("model.layers.1.") for k in packed)
    assert len(packed) == 8 * 3 and all(dtypes[k] == "I32" for k in packed)  # 8 tiny experts × gate, up, down
    assert not any(k.endswith("weight_zero_point") for k in keys)  # symmetric: no zero points on disk
    for kept in ("lm_head.weight", "model.layers.0.self_attn.q_a_proj.weight", "model.layers.1.self_attn.kv_b_proj.weight",
                 "model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.shared_experts.down_proj.weight"):
        assert dtypes[kept] == "F32", kept
    spec = detect(json.loads((k2_thinking / "config.json").read_text()))
    assert (spec.format, spec.scheme.name, spec.scheme.group, spec.scheme.sym) == ("compressed-tensors", "gptq", 32, True)


def test_it_loads_with_the_routed_experts_alone_in_int4(k2_thinking):
    lm = load_model(str(k2_thinking), weights="real", dtype=torch.float32)
    assert quantized_modules(lm.model) == {"model.layers.1.mlp.experts": "gptq"}


@pytest.mark.slow
def test_a_cell_of_it_passes(k2_thinking):
    out = run_cell(CellSpec(str(k2_thinking), weights="real", quant="gptq", graph="full", max_tokens=64,
                            max_new_tokens=2))
    assert out.status == Status.PASS, out.reason
    assert out.metrics.quant.quant_layers == 1


def test_files_that_pack_a_layer_the_ignore_list_keeps_16_bit_are_refused_by_name(tmp_path):
    """The planted fault: a producer that also packed attention, the shared experts and the dense MLP (ignoring
    lm_head alone) under the card's declaration. Read as declared, those layers are 16-bit; the loader names the
    first packed one and the list instead of quietly running them in int4."""
    # q_b_proj and kv_b_proj (K = 48 and 32 at tiny widths) stay 16-bit so the group of 32 divides every packed width
    bad, _ = _write(tmp_path, ("lm_head", "q_b_proj", "kv_b_proj"))
    with pytest.raises(UnsupportedModel, match=r"model\.layers\.0\.self_attn\.q_a_proj\.weight_packed is packed in 4 bits "
                                               r"but config\.json quantization_config lists model\.layers\.0\.self_attn"
                                               r"\.q_a_proj as not quantized"):
        load_model(str(bad), weights="real", dtype=torch.float32)

