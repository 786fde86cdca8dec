"""The paged KV cache of a hybrid model: Qwen3-Next's Gated DeltaNet layers (3 of 4) keep a recurrent state and no
KV cache, so K/V are allocated for its full-attention layers only, still indexed by decoder layer; its memory is
the full-attention layers' count times one layer's, and an FP8 cache needs scales for those layers only."""

import pytest
import torch

from pcg_core import CaptureConfig, Engine, EngineConfig, load_model
from pcg_core.attention.kv_cache import KVCache, attention_layers
from pcg_core.errors import ConfigError
from pcg_core.model.loader import build_config, read_config_file, shrink_config

CONFIG = "Qwen__Qwen3-Next-80B-A3B-Instruct.json"
SLOTS = 64


def _config(configs, layers: int):
    return build_config(shrink_config(read_config_file(configs / CONFIG), tiny=True, layers=layers))


def _per_layer_bytes(config, store_bytes: int = 4) -> int:
    return 2 * (SLOTS + 1) * config.num_key_value_heads * config.head_dim * store_bytes  # K and V, pad slot included


@pytest.mark.parametrize("layers, full", [(2, (1,)), (4, (3,)), (8, (3, 7))])
def test_kv_is_allocated_for_the_full_attention_layers_only(configs, layers, full):
    config = _config(configs, layers)
    assert attention_layers(config) == full
    cache = KVCache(config, SLOTS, torch.float32, torch.device("cpu"))
    assert [i for i, k in enumerate(cache.k) if k is not None] == list(full)  # indexed by decoder layer
    assert cache.nbytes == len(full) * _per_layer_bytes(config)
    assert cache.bytes_per_token == len(full) * 2 * config.num_key_value_heads * config.head_dim * 4


def test_a_model_without_linear_layers_keeps_every_layer(configs):
    config = build_config(shrink_config(read_config_file(configs / "Qwen__Qwen3-8B.json"), tiny=True, layers=3))
    cache = KVCache(config, SLOTS, torch.float32, torch.device("cpu"))
    assert attention_layers(config) == (0, 1, 2) and all(k is not None for k in cache.k)


def test_a_linear_layer_has_no_kv_to_write_or_read(configs):
    cache = KVCache(_config(configs, 4), SLOTS, torch.float32, torch.device("cpu"))
    k = torch.randn(2, cache.k[3].shape[1], cache.k[3].shape[2])
    slots = torch.tensor([5, 9])
    cache.write(3, k, -k, slots)
    keys, values = cache.read(3, slots)
    assert torch.equal(keys, k) and torch.equal(values, -k)
    with pytest.raises(ValueError, match="layer 0 is a linear-attention layer"):
        cache.read(0)


def test_fp8_scales_are_needed_for_the_full_attention_layers_only(configs):
    cache = KVCache(_config(configs, 8), SLOTS, torch.float32, torch.device("cpu"), kv_cache="fp8_e4m3")
    cache.set_scales({3: (0.5, 0.25), 7: (2.0, 4.0)})
    assert cache.k_scale.tolist() == [1, 1, 1, 0.5, 1, 1, 1, 2.0] and cache.v_scale[7] == 4.0
    with pytest.raises(ConfigError, match=r"no KV scales for layer\(s\) \[7\]"):
        cache.set_scales({3: (0.5, 0.25)})


def test_the_engine_runs_on_the_smaller_cache(configs):
    """Prefill and decode through the engine's cache (its attention layer writes to index 3 of 4, not 0)."""
    lm = load_model(configs / CONFIG, tiny=True, layers=4)
    engine = Engine(lm.model, EngineConfig(capture=CaptureConfig(backend="disabled", max_tokens=32), kv_slots=SLOTS))
    assert engine.cache.nbytes == _per_layer_bytes(lm.config.get_text_config())
    out = engine.generate([[5, 6, 7, 8, 9], [3, 4]], 3, top_k=1)
    assert [len(o.output_ids) for o in out] == [3, 3]
    assert engine.cache.k[3].abs().sum() > 0
