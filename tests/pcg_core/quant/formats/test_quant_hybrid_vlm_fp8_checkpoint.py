"""The cards' FP8 checkpoints as they are on disk, tiny: Qwen/Qwen3-Next-80B-A3B-Instruct-FP8 and
Qwen/Qwen3-VL-30B-A3B-Instruct-FP8 (HF `fp8`: e4m3 weights, `weight_scale_inv` per 128×128 block stored in bf16,
one linear per expert and projection, sharded under model.safetensors.index.json).

Qwen3-Next's quantization_config keeps in 16 bits (modules_to_not_convert, listed per layer) every norm, the
router, the scalar shared_expert_gate and the Gated DeltaNet's in_proj_ba, conv1d, A_log, dt_bias and gated norm,
and its files carry the multi-token-prediction head (`mtp.*`, its linears FP8 too), which transformers' model has
no module for and skips (`_keys_to_ignore_on_load_unexpected`); the loader skips it likewise, and nothing else.
Qwen3-VL's lists every module of the vision tower (stored in bf16) and each layer's router. A scale missing or of
the wrong shape is an error naming the tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from harness.cards import CARDS_DIR
from pcg_core.errors import UnsupportedModel
from pcg_core.model.loader import build_config, load_model, read_config_file, shrink_config, synthetic_model
from pcg_core.quant import SCHEMES, quantized_modules, write_checkpoint
from pcg_core.quant.formats import checkpoint
from pcg_core.quant.formats.files import INDEX
from pcg_core.quant.layers.experts import is_experts
from pcg_core.quant.schemes.w8a8 import quantize_weight

SHARED = ("mlp.experts", "mlp.shared_expert.gate_proj", "mlp.shared_expert.up_proj", "mlp.shared_expert.down_proj")
NEXT_QUANTIZED = {f"model.layers.0.{n}" for n in ("linear_attn.in_proj_qkvz", "linear_attn.out_proj", *SHARED)} | {
    f"model.layers.1.{n}" for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", *SHARED)}
MTP_NOT_CONVERTED = ["mtp.fc", "mtp.layers.0.input_layernorm", "mtp.layers.0.mlp.gate", "mtp.layers.0.mlp.shared_expert_gate",
                     "mtp.layers.0.post_attention_layernorm", "mtp.layers.0.self_attn.k_norm",
                     "mtp.layers.0.self_attn.q_norm", "mtp.norm", "mtp.pre_fc_norm_embedding", "mtp.pre_fc_norm_hidden"]


def _model(config_file: str) -> tuple[torch.nn.Module, dict]:
    """Tiny, but with experts 128 wide as the releases' are (512, 768): gate and up block scales fuse only then."""
    data = shrink_config(read_config_file(CARDS_DIR / "configs" / config_file), tiny=True)
    (data.get("text_config") or data)["moe_intermediate_size"] = 128
    return synthetic_model(build_config(data), dtype=torch.bfloat16, device="cpu", seed=0, peaked=True), data


def next_not_converted(config) -> list[str]:
    """modules_to_not_convert as Qwen3-Next-80B-A3B-Instruct-FP8's config.json spells it, for these layers."""
    out = ["lm_head"]
    for i, kind in enumerate(config.layer_types):
        p = f"model.layers.{i}."
        out.append(p + "input_layernorm")
        if kind == "linear_attention":
            out += [p + f"linear_attn.{n}" for n in ("A_log", "conv1d", "dt_bias", "in_proj_ba", "norm")]
        out += [p + "mlp.gate", p + "mlp.shared_expert_gate", p + "post_attention_layernorm"]
        if kind == "full_attention":
            out += [p + "self_attn.k_norm", p + "self_attn.q_norm"]
    return out + MTP_NOT_CONVERTED


def _mtp_tensors(config) -> dict[str, torch.Tensor]:
    """Some of the MTP head's tensors as the checkpoint stores them: its fc and norms in bf16, its attention and
    experts in FP8 with their block scales, its router in bf16."""
    g = torch.Generator().manual_seed(1)
    h, heads, hd = config.hidden_size, config.num_attention_heads, config.head_dim
    out = {"mtp.fc.weight": torch.randn(h, 2 * h, generator=g).bfloat16(),
           "mtp.layers.0.mlp.gate.weight": torch.randn(config.num_experts, h, generator=g).bfloat16()}
    out |= {f"mtp.{n}.weight": torch.ones(h, dtype=torch.bfloat16) for n in ("norm", "pre_fc_norm_embedding",
                                                                               "pre_fc_norm_hidden")}
    for name, shape in (("layers.0.self_attn.q_proj", (2 * heads * hd, h)),
                        ("layers.0.mlp.experts.0.down_proj", (h, config.moe_intermediate_size))):
        q, s = quantize_weight(torch.randn(*shape, generator=g), SCHEMES["fp8_block"])
        out[f"mtp.{name}.weight"], out[f"mtp.{name}.weight_scale_inv"] = q, s.bfloat16()
    return out


def _as_released(path: Path, extra: dict[str, torch.Tensor]) -> None:
    """The written shards as the release has them: block scales in bf16, `extra` (the MTP head) in the last shard,
    the index naming every tensor."""
    index = json.loads((path / INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()))
    for i, shard in enumerate(shards):
        tensors = {k: (v.bfloat16() if k.endswith("weight_scale_inv") else v) for k, v in load_file(path / shard).items()}
        if i == len(shards) - 1:
            tensors |= extra
            index["weight_map"] |= {k: shard for k in extra}
        save_file(tensors, path / shard, metadata={"format": "pt"})
    (path / INDEX).write_text(json.dumps(index, indent=1))


def write_qwen3_next_fp8(path: Path) -> torch.nn.Module:
    """A tiny Qwen3-Next FP8 checkpoint in the release's layout; returns the bf16 model it was quantized from."""
    model, data = _model("Qwen__Qwen3-Next-80B-A3B-Instruct.json")
    write_checkpoint(model, data, path, "fp8", SCHEMES["fp8_block"], ignore=tuple(next_not_converted(model.config)),
                     shards=3)
    _as_released(path, _mtp_tensors(model.config))
    return model


def _drop(path: Path, key: str) -> None:
    index = json.loads((path / INDEX).read_text())
    shard = index["weight_map"].pop(key)
    tensors = load_file(path / shard)
    del tensors[key]
    save_file(tensors, path / shard, metadata={"format": "pt"})
    (path / INDEX).write_text(json.dumps(index, indent=1))


def _replace(path: Path, key: str, value: torch.Tensor) -> None:
    shard = json.loads((path / INDEX).read_text())["weight_map"][key]
    tensors = load_file(path / shard)
    tensors[key] = value
    save_file(tensors, path / shard, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def next_fp8(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("qwen3_next_fp8")
    return path, write_qwen3_next_fp8(path)


def test_the_release_layout_is_what_was_written(next_fp8):
    path, _ = next_fp8
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "fp8" and qc["weight_block_size"] == [128, 128] and qc["fmt"] == "e4m3"
    assert "model.layers.0.linear_attn.in_proj_ba" in qc["modules_to_not_convert"] and "mtp.fc" in qc["modules_to_not_convert"]
    weight_map = json.loads((path / INDEX).read_text())["weight_map"]
    assert len(set(weight_map.values())) == 3
    tensors = {}
    for shard in set(weight_map.values()):
        tensors |= load_file(path / shard)
    assert tensors["model.layers.0.linear_attn.in_proj_qkvz.weight"].dtype == torch.float8_e4m3fn
    assert tensors["model.layers.0.linear_attn.in_proj_qkvz.weight_scale_inv"].dtype == torch.bfloat16
    assert tensors["model.layers.1.mlp.experts.7.gate_proj.weight"].dtype == torch.float8_e4m3fn
    assert tensors["model.layers.0.linear_attn.in_proj_ba.weight"].dtype == torch.bfloat16
    assert tensors["mtp.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn


def test_qwen3_next_fp8_checkpoint_loads_with_mtp_ignored(next_fp8):
    path, float_model = next_fp8
    model = load_model(str(path), weights="real", dtype=torch.float32).model
    assert set(quantized_modules(model)) == NEXT_QUANTIZED
    assert set(quantized_modules(model).values()) == {"fp8_block"}
    for name in ("model.layers.0.linear_attn.in_proj_ba", "model.layers.1.mlp.shared_expert_gate", "lm_head"):
        got = model.get_submodule(name)
        assert type(got) is torch.nn.Linear
        assert torch.equal(got.weight, float_model.get_submodule(name).weight.float())
    assert torch.equal(model.model.layers[0].linear_attn.A_log, float_model.model.layers[0].linear_attn.A_log.float())
    assert not any(n.startswith("mtp") for n, _ in model.named_modules())


def test_mtp_is_skipped_by_transformers_own_rule_and_nothing_else(next_fp8, monkeypatch, tmp_path):
    """Without transformers' `_keys_to_ignore_on_load_unexpected` the MTP tensors are refused by name; and a tensor
    that is neither the model's nor `mtp.*` is refused with it."""
    path, _ = next_fp8
    monkeypatch.setattr(checkpoint, "unexpected_ok", lambda model: ())
    with pytest.raises(UnsupportedModel, match=r"tensors the model does not use, e\.g\. mtp\."):
        load_model(str(path), weights="real", dtype=torch.float32)
    monkeypatch.undo()
    copy = tmp_path / "stray"
    write_qwen3_next_fp8(copy)
    _as_released(copy, {"model.layers.0.linear_attn.in_proj_extra.weight": torch.zeros(4, 4, dtype=torch.bfloat16)})
    with pytest.raises(UnsupportedModel, match=r"model\.layers\.0\.linear_attn\.in_proj_extra\.weight"):
        load_model(str(copy), weights="real", dtype=torch.float32)


@pytest.mark.parametrize("key, fault", [
    ("model.layers.0.linear_attn.in_proj_qkvz.weight_scale_inv", "missing"),
    ("model.layers.0.linear_attn.in_proj_qkvz.weight_scale_inv", "transposed"),
    ("model.layers.1.mlp.experts.3.up_proj.weight_scale_inv", "missing"),
    ("model.layers.0.mlp.experts.5.down_proj.weight_scale_inv", "a row too many"),
    ("model.layers.1.self_attn.o_proj.weight_scale_inv", "a row too many"),
])
def test_a_wrong_or_missing_scale_names_the_tensor(tmp_path, key, fault):
    write_qwen3_next_fp8(tmp_path)
    if fault == "missing":
        _drop(tmp_path, key)
    else:
        shard = json.loads((tmp_path / INDEX).read_text())["weight_map"][key]
        scale = load_file(tmp_path / shard)[key]
        _replace(tmp_path, key, scale.t().contiguous() if fault == "transposed" else torch.cat([scale, scale]))
    with pytest.raises(UnsupportedModel, match=key.replace(".", r"\.")):
        load_model(str(tmp_path), weights="real", dtype=torch.float32)


def vl_not_converted(model: torch.nn.Module) -> list[str]:
    """modules_to_not_convert as Qwen3-VL-30B-A3B-Instruct-FP8 spells it: the head, every vision module, each
    layer's router."""
    text = model.config.get_text_config()
    visual = [n for n, m in model.named_modules() if n.startswith("model.visual.") and not list(m.children())]
    return ["lm_head", *visual, *(f"model.language_model.layers.{i}.mlp.gate" for i in range(text.num_hidden_layers))]


@pytest.fixture(scope="module")
def vl_fp8(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("qwen3_vl_fp8")
    model, data = _model("Qwen__Qwen3-VL-30B-A3B-Instruct.json")
    write_checkpoint(model, data, path, "fp8", SCHEMES["fp8_block"], ignore=tuple(vl_not_converted(model)), shards=2)
    _as_released(path, {})
    return path, model


def test_qwen3_vl_fp8_checkpoint_loads_with_the_vision_tower_16bit(vl_fp8):
    """The loader reads a VLM's depth from its nested text config (get_text_config; the top-level config has no
    num_hidden_layers): before, loading any quantized VLM checkpoint raised AttributeError."""
    path, float_model = vl_fp8
    model = load_model(str(path), weights="real", dtype=torch.float32).model
    text = {n for n, m in model.named_modules() if n.startswith("model.language_model.layers.")
            and (n.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) or is_experts(m))}
    assert set(quantized_modules(model)) == text and len(text) == 10
    visual = [n for n, m in model.named_modules() if n.startswith("model.visual.") and type(m) is torch.nn.Linear]
    assert visual
    for name in visual:
        assert torch.equal(model.get_submodule(name).weight, float_model.get_submodule(name).weight.float()), name


def test_a_trimmed_vlm_checkpoint_skips_the_layers_past_those_kept(vl_fp8):
    path, _ = vl_fp8
    model = load_model(str(path), weights="real", layers=1, dtype=torch.float32).model
    assert len(model.model.language_model.layers) == 1
    assert set(quantized_modules(model)) == {f"model.language_model.layers.0.{n}" for n in
                                             ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                              "self_attn.o_proj", "mlp.experts")}


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint,graph", [("next_fp8", "piecewise"), ("vl_fp8", "breakable")])
def test_a_release_format_fp8_checkpoint_cell_passes(checkpoint, graph, request):
    """`pcgh cell` on each release-format checkpoint: real weights, fp8_block, the reference layer measured, every
    linear the checkpoint quantizes counted (Qwen3-Next's set; Qwen3-VL-MoE's 4 attention linears + experts × 2)."""
    from harness.cell import CellSpec, run_cell

    path, _ = request.getfixturevalue(checkpoint)
    r = run_cell(CellSpec(str(path), weights="real", quant="fp8_block", graph=graph, max_tokens=16, max_new_tokens=4))
    assert r.status == "pass", (r.status, r.reason)
    quantized = len(NEXT_QUANTIZED) if checkpoint == "next_fp8" else 10
    assert r.metrics.quant.quant_layers == quantized and r.metrics.judge.reference.status == "pass"


def test_a_trim_past_the_first_full_attention_layer_is_refused_for_real_weights(next_fp8):
    """Synthetic weights trimmed to 1 layer get a full-attention one (a hybrid keeps one); the checkpoint's layer 0
    is a Gated DeltaNet layer, so real weights trimmed so are refused naming the smallest trim, not loaded wrong."""
    from pcg_core.errors import ConfigError

    path, _ = next_fp8
    with pytest.raises(ConfigError, match=r"layers 1 would make layer 0 \(a linear_attention layer.*keep at least 2"):
        load_model(str(path), weights="real", layers=1, dtype=torch.float32)
    assert len(load_model(str(path), weights="real", layers=2, dtype=torch.float32).model.model.layers) == 2
