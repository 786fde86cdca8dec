"""load_model: the six seed architectures from their real configs, trimming, and the errors users see."""

from __future__ import annotations

import json

import pytest
import torch
from pcg_helpers import ARCH_NAMES, ARCHS, CONFIGS, config_path, tiny_model

from pcg_core import ConfigError, load_model
from pcg_core.attention import ATTN_IMPLEMENTATION
from pcg_core.errors import UnsupportedModel
from pcg_core.model import (
    SUPPORTED_ARCHITECTURES,
    build_config,
    check_supported,
    read_config_file,
    shrink_config,
    unsupported_reason,
)
from pcg_core.model.experts import EXPERTS_IMPLEMENTATION
from pcg_core.model.loader import PEAK_LOGIT_STD, TINY, TINY_MAX_EXPERTS, TINY_MAX_VOCAB


def test_config_files_are_present_and_real(configs):
    assert configs == CONFIGS
    for arch, (name, cls, _) in ARCHS.items():
        data = json.loads((CONFIGS / name).read_text())
        assert data["architectures"] == [cls], arch
    qwen2 = json.loads((CONFIGS / "Qwen__Qwen2.5-0.5B.json").read_text())
    assert (qwen2["model_type"], qwen2["hidden_size"], qwen2["num_hidden_layers"]) == ("qwen2", 896, 24)
    assert (qwen2["num_attention_heads"], qwen2["num_key_value_heads"], qwen2["intermediate_size"]) == (14, 2, 4864)
    assert (qwen2["vocab_size"], qwen2["rope_theta"], qwen2["tie_word_embeddings"]) == (151936, 1e6, True)


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_each_architecture_loads_tiny(arch):
    _, cls, moe = ARCHS[arch]
    real = read_config_file(config_path(arch))
    lm = tiny_model(arch, layers=None)
    model, cfg = lm.model, lm.config
    assert type(model).__name__ == cls
    assert cls in SUPPORTED_ARCHITECTURES
    assert lm.synthetic is True
    assert cfg.num_hidden_layers == 2 and len(model.get_decoder().layers) == 2  # tiny default
    assert cfg.hidden_size == TINY["hidden_size"] and cfg.num_attention_heads == TINY["num_attention_heads"]
    assert cfg.head_dim == TINY["head_dim"]
    # GQA is kept (all six real configs have fewer KV heads than query heads).
    assert real["num_key_value_heads"] < real["num_attention_heads"]
    assert cfg.num_key_value_heads == 2 < cfg.num_attention_heads
    assert cfg.vocab_size == min(real["vocab_size"], TINY_MAX_VOCAB)
    assert model.get_input_embeddings().weight.shape == (cfg.vocab_size, cfg.hidden_size)
    # Peaked (the default for synthetic weights): the head is its own tensor, scaled to a logit std of ~3 in fp32,
    # and untied for good, so a model rebuilt from the config keeps it; flat keeps the real config's tying.
    head, emb = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    assert cfg.tie_word_embeddings is False and head.data_ptr() != emb.data_ptr()
    assert abs(float(head.std()) * cfg.hidden_size**0.5 - PEAK_LOGIT_STD["float32"]) < 0.05
    flat = load_model(config_path(arch), tiny=True, peaked=False).config
    assert flat.tie_word_embeddings == real.get("tie_word_embeddings", False)
    # transformers' own module, with our attention op (and, for MoE, our expert path) plugged in.
    assert model.config._attn_implementation == ATTN_IMPLEMENTATION
    n_experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if moe:
        assert model.config._experts_implementation == EXPERTS_IMPLEMENTATION
        assert n_experts == min(real.get("num_experts") or real["num_local_experts"], TINY_MAX_EXPERTS)
        assert cfg.num_experts_per_tok == 2
    else:
        assert not n_experts
    assert not model.training
    assert all(not p.requires_grad for p in model.parameters())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    # The synthetic weights actually depend on the seed.
    other = tiny_model(arch, layers=None, seed=1)
    w0 = model.get_decoder().layers[0].self_attn.q_proj.weight
    w1 = other.model.get_decoder().layers[0].self_attn.q_proj.weight
    assert not torch.equal(w0, w1)
    assert torch.equal(w0, tiny_model(arch, layers=None).model.get_decoder().layers[0].self_attn.q_proj.weight)


@pytest.mark.parametrize("arch", ["llama", "qwen3-moe"])
@pytest.mark.parametrize("layers", [1, 3])
def test_layers_trims(arch, layers):
    lm = tiny_model(arch, layers=layers)
    assert lm.config.num_hidden_layers == layers
    assert len(lm.model.get_decoder().layers) == layers


def test_layers_is_at_most_the_models_depth_and_must_be_positive():
    data = read_config_file(config_path("qwen3"))  # 28 layers
    with pytest.raises(ConfigError, match="layers 1000: the model has 28 decoder layers") as too_many:
        shrink_config(data, layers=1000)  # a typo, not a trim: never silently cut to 28
    assert too_many.value.field == "layers"
    assert shrink_config(data, layers=28)["num_hidden_layers"] == 28
    assert shrink_config(data, layers=5)["num_hidden_layers"] == 5
    assert data["num_hidden_layers"] == 28  # the input is not mutated
    with pytest.raises(ConfigError, match="layers must be positive, got 0") as e:
        load_model(config_path("qwen3"), tiny=True, layers=0)
    assert e.value.field == "layers" and "--" not in str(e.value)


def test_shrink_keeps_real_widths_when_not_tiny_and_trims_per_layer_lists():
    data = read_config_file(config_path("qwen3-moe"))
    d = shrink_config(dict(data, mlp_only_layers=[0, 5, 40]), layers=6)
    assert d["hidden_size"] == 2048 and d["num_experts"] == 128 and d["vocab_size"] == 151936
    assert d["num_hidden_layers"] == 6 and d["max_window_layers"] == 6
    assert d["mlp_only_layers"] == [0, 5]
    lt = shrink_config({"model_type": "qwen2", "num_hidden_layers": 4, "layer_types": ["a", "b", "c", "d"]}, layers=2)
    assert lt["layer_types"] == ["a", "b"]


def test_load_model_accepts_a_dict_and_a_directory(tmp_path):
    data = read_config_file(config_path("qwen3"))
    assert type(load_model(data, tiny=True).model).__name__ == "Qwen3ForCausalLM"
    (tmp_path / "config.json").write_text(json.dumps(data))
    lm = load_model(str(tmp_path), tiny=True)
    assert type(lm.model).__name__ == "Qwen3ForCausalLM" and lm.synthetic


# Unsupported architectures: real transformers model types whose architecture pcg does not run yet (OLMo-2: Qwen3's
# config read as OLMo-2's; transformers builds it, pcg's table lacks it).
OLMO2 = {**json.loads((CONFIGS / "Qwen__Qwen3-0.6B.json").read_text()), "architectures": ["Olmo2ForCausalLM"],
         "model_type": "olmo2"}


@pytest.mark.parametrize("data, arch", [(OLMO2, "Olmo2ForCausalLM")])
@pytest.mark.parametrize("as_file", [False, True])
def test_unsupported_architecture_raises_unsupported_model(tmp_path, data, arch, as_file):
    spec = data
    if as_file:
        spec = tmp_path / "config.json"
        spec.write_text(json.dumps(data))
    with pytest.raises(UnsupportedModel) as e:
        load_model(spec, tiny=True)
    assert arch in str(e.value)
    assert "not supported" in str(e.value)
    assert isinstance(e.value, ConfigError)  # callers that catch ConfigError also catch this


def test_check_supported_and_reasons():
    for arch in ARCH_NAMES:
        cfg = build_config(read_config_file(config_path(arch)))
        assert unsupported_reason(cfg) is None
        check_supported(cfg)
    cfg = build_config(OLMO2)
    assert "Olmo2ForCausalLM" in unsupported_reason(cfg)
    with pytest.raises(UnsupportedModel, match="Olmo2ForCausalLM"):
        check_supported(cfg)
    # No `architectures` key: the architecture is looked up from the model type.
    no_arch = {k: v for k, v in read_config_file(config_path("mixtral")).items() if k != "architectures"}
    assert unsupported_reason(build_config(no_arch)) is None
    no_arch_olmo = {k: v for k, v in OLMO2.items() if k != "architectures"}
    assert "Olmo2ForCausalLM" in unsupported_reason(build_config(no_arch_olmo))


def test_non_json_file_is_a_config_error(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"model_type": "llama",\n  oops\n')
    with pytest.raises(ConfigError, match="not valid JSON") as e:
        load_model(p, tiny=True)
    assert str(p) in str(e.value)
    p.write_text("[1, 2, 3]")
    with pytest.raises(ConfigError, match="JSON object"):
        load_model(p, tiny=True)


def test_missing_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        load_model(str(tmp_path), tiny=True)  # an empty directory
    with pytest.raises(ConfigError, match="not a directory, a config.json file or a hub id") as e:
        load_model(str(tmp_path / "missing.json"), tiny=True)
    assert e.value.field == "spec" and "model card" not in str(e.value)  # cards are the harness's word


def test_missing_model_type_is_a_config_error(tmp_path):
    data = {k: v for k, v in read_config_file(config_path("llama")).items() if k != "model_type"}
    with pytest.raises(ConfigError, match="no model_type"):
        load_model(data, tiny=True)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="no model_type") as e:
        load_model(p, tiny=True)
    assert str(p) in str(e.value)


def test_unknown_model_type_is_a_config_error(tmp_path):
    # A config published with remote code only and no alias to a transformers type (Kimi-K2's kimi_k2 has one).
    remote = {
        "architectures": ["KimiLinearForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_kimi.KimiLinearConfig"},
        "model_type": "kimi_linear_remote",
        "hidden_size": 2304,
        "num_hidden_layers": 27,
        "vocab_size": 163840,
    }
    p = tmp_path / "config.json"
    p.write_text(json.dumps(remote))
    with pytest.raises(ConfigError) as e:
        load_model(p, tiny=True)
    msg = str(e.value)
    assert "'kimi_linear_remote'" in msg and "KimiLinearForCausalLM" in msg and "remote code" in msg


def test_kimi_k2_loads_as_deepseek_v3_without_remote_code(tmp_path):
    data = json.loads((CONFIGS / "moonshotai__Kimi-K2-Instruct.json").read_text())
    assert data["model_type"] == "kimi_k2" and "auto_map" in data
    (tmp_path / "config.json").write_text(json.dumps(data))
    lm = load_model(str(tmp_path), tiny=True)
    assert type(lm.model).__name__ == "DeepseekV3ForCausalLM" and lm.config.model_type == "deepseek_v3"
    assert data["model_type"] == "kimi_k2"  # the caller's data is left as it was


@pytest.mark.parametrize(
    "change",
    [
        {"num_attention_heads": 5},  # 4096 is not a multiple of 5
        {"hidden_size": "big"},  # wrong type
        {"layer_types": ["full_attention"]},  # 1 layer type for 32 layers
        {"rope_scaling": {"rope_type": "linear"}},  # linear RoPE without its factor
    ],
    ids=["heads", "hidden_size_type", "layer_types", "rope"],
)
def test_config_rejected_by_transformers_is_a_config_error(change):
    # build_config promises "transformers rejects this <type> config: ..." as a ConfigError; transformers 5
    # validates configs as strict dataclasses, so whatever it raises for a bad value must be wrapped.
    data = dict(read_config_file(config_path("llama")), **change)
    with pytest.raises(ConfigError, match="transformers rejects this llama config"):
        build_config(data, where="cfg.json")


def test_bad_weights_argument_is_a_config_error():
    with pytest.raises(ConfigError, match="auto, real or synthetic") as e:
        load_model(config_path("qwen3"), tiny=True, weights="fp8")
    assert e.value.field == "weights"
    with pytest.raises(ConfigError, match="tiny shrinks widths, so it needs synthetic weights; use weights 'synthetic'") as e:
        load_model(config_path("qwen3"), tiny=True, weights="real")
    assert e.value.field == "tiny" and "--" not in str(e.value)
    with pytest.raises(ConfigError, match="no safetensors weights; use weights 'synthetic'") as e:
        load_model(config_path("qwen3"), weights="real", layers=1)
    assert e.value.field == "weights" and "--" not in str(e.value)


def test_offline_hub_miss_says_the_hub_cannot_be_reached(monkeypatch):
    # What huggingface_hub raises when the file is not cached and the hub cannot be reached (offline, or no
    # network as in CI). The user must be told that, not that the model "has no config.json".
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(*args, **kwargs):
        raise LocalEntryNotFoundError("cannot find the requested files in the disk cache; outgoing traffic is disabled")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(ConfigError) as e:
        load_model("some-org/some-model", tiny=True)
    msg = str(e.value)
    assert "some-org/some-model" in msg
    assert "local cache" in msg and "cannot be reached" in msg, msg


def _save_tiny_checkpoint(tmp_path, arch="llama", layers=2):
    lm = tiny_model(arch, layers=layers)
    lm.model.save_pretrained(tmp_path)
    return lm


def test_real_weights_load_from_a_local_checkpoint(tmp_path):
    # The real-weights path, on a checkpoint we write ourselves (nothing is downloaded).
    src = _save_tiny_checkpoint(tmp_path)
    lm = load_model(str(tmp_path))  # weights="auto": the directory has safetensors
    assert lm.synthetic is False
    assert lm.model.config._attn_implementation == ATTN_IMPLEMENTATION
    ref = src.model.state_dict()
    got = lm.model.state_dict()
    assert ref.keys() == got.keys()
    for k in ref:
        assert torch.equal(ref[k], got[k]), k
    trimmed = load_model(str(tmp_path), layers=1, weights="real")
    assert len(trimmed.model.get_decoder().layers) == 1
    assert torch.equal(
        trimmed.model.get_decoder().layers[0].mlp.down_proj.weight, src.model.get_decoder().layers[0].mlp.down_proj.weight
    )


def test_declared_quantization_over_16_bit_files_is_refused(tmp_path):
    # A config that declares a quantization its files do not hold is refused, not loaded either way
    # (tests/pcg_core/quant/schemes/test_quant.py covers the quantized checkpoints themselves).
    _save_tiny_checkpoint(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModel, match="no linear layer's weight is stored in 8 bits"):
        load_model(str(tmp_path), weights="real")
