"""The FP8 KV cache (kv_cache="fp8_e4m3"): quantization, the scale tensors, every backend's read, the engine's
scales, calibration, and graph paths against eager."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from pcg_core import CaptureConfig, Engine, EngineConfig
from pcg_core.attention import KVCache, get_attention_backend
from pcg_core.attention.backend import AttentionBackend
from pcg_core.attention.kv_cache import FP8_MAX, check_kv_scales, dequantize_kv, quantize_kv
from pcg_core.capabilities import capabilities, kv_cache_unsupported_reason
from pcg_core.engine.kv_scales import calibrate_kv_scales, scales_from_cache, set_kv_scales
from pcg_core.errors import ConfigError
from pcg_helpers import GRAPH_BACKENDS, compare_outputs, tiny_model

PROMPTS = [[5, 17, 3, 99, 42, 7, 8], [11, 12, 13], [200, 1, 2, 3, 4]]


def _config(layers: int = 3) -> LlamaConfig:
    return LlamaConfig(hidden_size=48, num_attention_heads=6, num_key_value_heads=2, head_dim=8,
                       num_hidden_layers=layers, vocab_size=64)


def test_quantize_saturates_at_the_largest_e4m3_and_keeps_nan():
    scale = torch.tensor(0.5)
    x = torch.tensor([1000.0, -1000.0, 224.0, 0.1, float("nan")])
    q = dequantize_kv(quantize_kv(x, scale), scale, torch.float32)
    assert q[:3].tolist() == [FP8_MAX * 0.5, -FP8_MAX * 0.5, 224.0]
    assert abs(q[3] - 0.1) <= 0.1 * 2**-4 and torch.isnan(q[4])


def test_fp8_cache_rounds_trips_each_layer_with_its_own_scales():
    """Per layer and per K/V scales that differ by 50×, outliers, an odd width: each layer reads back within e4m3's
    relative step of what it wrote, and a layer read with another layer's scale would be 50× off."""
    cfg = _config()
    cache = KVCache(cfg, 32, torch.float32, torch.device("cpu"), page_size=4, kv_cache="fp8_e4m3")
    g = torch.Generator().manual_seed(0)
    scales = {i: (0.002 * (1 + 24 * i), 0.05 / (1 + i)) for i in range(3)}
    cache.set_scales(scales)
    slots = torch.tensor([3, 0, 17, 9, 31])
    for layer, (ks, vs) in scales.items():
        k = torch.randn(5, 2, 8, generator=g) * ks * 100
        k[2, 1, 3] = ks * 400  # an outlier near the top of the range
        v = torch.randn(5, 2, 8, generator=g) * vs * 50
        cache.write(layer, k, v, slots)
        keys, values = cache.read(layer)
        assert keys.dtype == torch.float32 and cache.k[layer].dtype == torch.float8_e4m3fn
        for got, want in ((keys[slots], k), (values[slots], v)):
            assert ((got - want).abs() <= want.abs() * 2**-4 + 1e-12).all()
        keys_sel, _ = cache.read(layer, torch.tensor([17, 3]))
        assert torch.equal(keys_sel, keys[[17, 3]])


def test_latent_cache_has_one_scale_and_values_are_its_first_columns():
    cfg = _config(2)
    cfg.kv_lora_rank, cfg.qk_rope_head_dim = 12, 4
    cache = KVCache(cfg, 8, torch.float32, torch.device("cpu"), kv_cache="fp8_e4m3")
    assert cache.v_scale is cache.k_scale
    cache.set_scales({0: (0.01, 0.01), 1: (0.02, 0.02)})
    row = torch.randn(3, 1, 16)
    cache.write(1, row, row[..., :12], torch.tensor([0, 1, 2]))
    keys, values = cache.read(1)
    assert values.shape[-1] == 12 and torch.equal(values, keys[..., :12])
    with pytest.raises(ConfigError, match="one scale per layer"):
        cache.set_scales({0: (0.01, 0.02), 1: (0.02, 0.02)})


def test_set_scales_keeps_the_addresses_graphs_read():
    cache = KVCache(_config(), 8, torch.float32, torch.device("cpu"), kv_cache="fp8_e4m3")
    k_ptr, v_ptr = cache.k_scale.data_ptr(), cache.v_scale.data_ptr()
    cache.set_scales({i: (0.1 * (i + 1), 0.2) for i in range(3)})
    assert (cache.k_scale.data_ptr(), cache.v_scale.data_ptr()) == (k_ptr, v_ptr)
    assert cache.k_scale.tolist() == pytest.approx([0.1, 0.2, 0.3])


@pytest.mark.parametrize("scales, match", [
    ({0: (1.0, 1.0), 1: (1.0, 1.0)}, r"no KV scales for layer\(s\) \[2\]"),
    ({0: (1.0, 1.0), 1: (1.0, -1.0), 2: (1.0, 1.0)}, "positive and finite"),
    ({0: (1.0, 1.0), 1: (float("inf"), 1.0), 2: (1.0, 1.0)}, "positive and finite"),
    ({0: (1.0,), 1: (1.0, 1.0), 2: (1.0, 1.0)}, r"expected \(k_scale, v_scale\)"),
    ({"0": (1.0, 1.0)}, "layer keys must be non-negative ints"),
    ([1.0, 1.0], "expected a dict"),
])
def test_bad_scales_are_refused_naming_the_layer_and_the_fix(scales, match):
    with pytest.raises(ConfigError, match=match):
        check_kv_scales(scales, 3)


def test_scales_for_more_layers_than_a_trimmed_model_has_are_fine():
    check_kv_scales({i: (0.1, 0.1) for i in range(8)}, 3)


def test_unknown_kv_cache_is_refused():
    with pytest.raises(ConfigError, match="kv_cache 'fp8' is unknown; choose one of auto, fp8_e4m3"):
        EngineConfig(kv_cache="fp8")


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama").model


def test_engine_refuses_an_fp8_cache_without_scales(llama):
    with pytest.raises(ConfigError, match="needs per-layer K/V scales and the model has none"):
        Engine(llama, EngineConfig(kv_cache="fp8_e4m3", kv_slots=64))


def test_calibration_is_absmax_over_448_of_the_16_bit_cache(llama):
    engine = Engine(llama, EngineConfig(kv_slots=64))
    scales = calibrate_kv_scales(engine, PROMPTS, 3)
    for layer, (ks, vs) in scales.items():
        keys, values = engine.cache.read(layer)
        assert ks == pytest.approx(float(keys.abs().max()) / 448) and vs == pytest.approx(float(values.abs().max()) / 448)
    assert len({ks for ks, _ in scales.values()}) == len(scales)  # per layer, not one for all
    with pytest.raises(ValueError, match="16-bit"):
        scales_from_cache(KVCache(llama.config, 8, torch.float32, torch.device("cpu"), kv_cache="fp8_e4m3"))


def _outputs(model, backend: str, attention: str, kv: str = "fp8_e4m3"):
    e = Engine(model, EngineConfig(kv_slots=512, attention=attention, kv_cache=kv,
                                   capture=CaptureConfig(backend=backend, max_tokens=16)))
    return e, e.generate(PROMPTS, 4, prompt_logprobs=True)


@pytest.fixture(scope="module")
def calibrated(llama):
    set_kv_scales(llama, calibrate_kv_scales(Engine(llama, EngineConfig(kv_slots=64)), PROMPTS, 4))
    return llama


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_graph_paths_match_eager_bitwise_and_differ_from_16_bit(calibrated, backend, attention):
    e, got = _outputs(calibrated, backend, attention)
    _, eager = _outputs(calibrated, "disabled", attention)
    _, wide = _outputs(calibrated, "disabled", attention, kv="auto")
    assert compare_outputs(eager, got, 1e-4) == []
    batch = e.prefill_batch(PROMPTS)  # 15 tokens: bucket 16
    assert torch.equal(e.forward(batch).clone(), e.forward(batch, eager=True))  # bitwise at the same padding
    assert e.cache.k[0].dtype == torch.float8_e4m3fn
    assert e.cache.k_scale[0] == pytest.approx(calibrated.pcg_kv_scales[0][0])  # loaded after capture
    diff = max(abs(a - b) for x, y in zip(eager, wide) for a, b in zip(x.prompt_logprobs, y.prompt_logprobs))
    assert 0 < diff < 1.0  # FP8's rounding shows, within what e4m3 with calibrated scales costs


def test_sdpa_and_flex_read_the_same_fp8_cache(calibrated):
    _, a = _outputs(calibrated, "disabled", "sdpa")
    _, b = _outputs(calibrated, "disabled", "flex")
    for x, y in zip(a, b):
        assert x.output_ids == y.output_ids
        assert max(abs(p - q) for p, q in zip(x.prompt_logprobs, y.prompt_logprobs)) < 1e-4


def test_a_backend_that_reads_the_cache_itself_is_refused_an_fp8_cache():
    class OwnReader(AttentionBackend):
        name = "own_reader"

        def forward(self, q, k, v, out, params, md):
            raise AssertionError

    cache = KVCache(_config(), 8, torch.float32, torch.device("cpu"), kv_cache="fp8_e4m3")
    with pytest.raises(ConfigError, match="does not declare kv_cache 'fp8_e4m3'"):
        OwnReader(cache, 8)
    OwnReader(KVCache(_config(), 8, torch.float32, torch.device("cpu")), 8)  # a 16-bit one is fine


def test_the_capability_table_says_who_reads_an_fp8_cache():
    caps = capabilities()
    assert set(caps["kv_cache"]) == {"auto", "fp8_e4m3"}
    for name in ("sdpa", "flex", "varlen"):
        assert caps["attention_backends"][name]["kv_cache"] == {"auto": None, "fp8_e4m3": None}
        assert get_attention_backend(name).kv_cache_reason("fp8_e4m3") is None
    assert kv_cache_unsupported_reason("fp8_e4m3", "sdpa") is None
    assert "not supported by the runtime yet" in kv_cache_unsupported_reason("int8", "sdpa")
    table = {"plugin": {"kv_cache": {"auto": None, "fp8_e4m3": "it reads the cache itself"}}}
    assert kv_cache_unsupported_reason("fp8_e4m3", "plugin", table) == "it reads the cache itself"


@pytest.fixture(scope="module")
def trimmed_bf16():
    from pcg_core import load_model
    from pcg_helpers import config_path

    lm = load_model(config_path("qwen3"), tiny=False, layers=4, dtype=torch.bfloat16, device="cuda")
    engine = Engine(lm.model, EngineConfig(device="cuda", dtype="bfloat16", kv_slots=2048))
    set_kv_scales(lm.model, calibrate_kv_scales(engine, [list(range(7, 300)), list(range(40, 90))], 4))
    return lm


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graph", GRAPH_BACKENDS)
@pytest.mark.parametrize("attention", ["sdpa", "flex", "varlen"])
def test_gpu_fp8_kv_replay_bitwise_equal_to_eager_at_the_same_padding(trimmed_bf16, attention, graph):
    """CUDA graphs over an FP8 cache: the scales loaded after capture reach every replay (the graph reads the scale
    tensors), prefill and decode, bitwise as eager at the same padding."""
    from pcg_core.engine.schedule import decode_batch
    from pcg_helpers import prompts_of

    engine = Engine(trimmed_bf16.model, EngineConfig(device="cuda", dtype="bfloat16", attention=attention, kv_slots=8192,
                                                     kv_cache="fp8_e4m3", capture=CaptureConfig(backend=graph, max_tokens=256)))
    assert float(engine.cache.k_scale[0]) == pytest.approx(trimmed_bf16.model.pcg_kv_scales[0][0])
    for i, lengths in enumerate([[5, 17, 30], [200], [3] * 40, [1, 2, 250]]):
        prompts = prompts_of(lengths, trimmed_bf16.config.vocab_size, seed=i)
        batch, seq_slots, _ = engine.pack_prompts(prompts, 4)
        got, want = engine.forward(batch).clone(), engine.forward(batch, eager=True)
        assert torch.equal(got, want), (attention, graph, lengths, float((got.float() - want.float()).abs().max()))
        dec = decode_batch([(s, 1, len(p)) for s, p in enumerate(prompts)], seq_slots)
        got, want = engine.forward(dec, decode=True).clone(), engine.forward(dec, eager=True)
        assert torch.equal(got, want), (attention, graph, "decode", lengths)
