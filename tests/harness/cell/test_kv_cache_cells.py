"""kv_cache=fp8_e4m3 cells on the CPU, and the judge against the FP8 KV-cache faults serving engines shipped.

vLLM #50881 and its kin: an FP8 KV cache right in eager and wrong under CUDA graphs. Two planted faults of that class:
- stale scale: the graph path uses the KV scales as they were when the engine was captured (the engine loads them
  after capture, so that value is the placeholder 1), eager the current ones — caught by graph vs eager;
- scale applied on write but not on read: K and V are divided by the scale going in and never multiplied back —
  graph = eager (both read it so), caught by the reference layer (transformers' forward with K/V rounded to FP8).
The whole grid (4 architectures × 3 capture backends × the CPU's attention backends) is slow; a corner runs always.
"""

from __future__ import annotations

import pytest

import pcg_core.attention.kv_cache as kv_cache_module
from harness.cell import CellSpec, run_cell
from pcg_core.attention.kv_cache import KVCache
from pcg_core.forward_context import CaptureMode, get_forward_context

MODELS = ("llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b")  # dense, MoE, MLA, sinks + window
GRAPHS = ("piecewise", "breakable", "full")
CPU_ATTENTION = ("sdpa", "flex")  # varlen is CUDA only


def _cell(model: str = "llama-3.1-8b", graph: str = "piecewise", attention: str = "sdpa", **kw):
    return run_cell(CellSpec(model=model, tiny=True, graph=graph, attention=attention, kv_cache="fp8_e4m3",
                             max_tokens=64, max_new_tokens=4, **kw))


def _passes(r) -> None:
    assert r.status == "pass", (r.status, r.reason)
    m = r.metrics
    assert m.settings.kv_cache == "fp8_e4m3" and m.quant.kv_scales == "calibrated"
    assert m.judge.reference.status == "pass" and m.judge.reference.kv_cache == "fp8_e4m3", m.judge.reference.summary()
    assert "K/V rounded to FP8" in m.judge.reference.summary()


def test_an_fp8_kv_cell_passes_and_says_how_it_was_judged():
    r = _cell()
    _passes(r)
    m = r.metrics
    assert m.memory.kv_bytes_per_token == 2 * 2 * 32  # tiny Llama: 2 layers × (K, V) × 32 values, one byte each (fp32: 4×)


@pytest.mark.slow
@pytest.mark.parametrize("attention", CPU_ATTENTION)
@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("model", MODELS)
def test_fp8_kv_cells_pass_on_every_architecture_backend_and_capture(model, graph, attention):
    _passes(_cell(model, graph, attention))


@pytest.mark.slow
def test_mla_fp8_kv_cell_passes_under_full_capture():
    _passes(_cell("deepseek-v3", "full", "flex"))


def _plant_stale_scale(monkeypatch) -> None:
    """The graph path reads the scales the cache held when the engine was built and captured (1, before the engine
    loads the real ones), as a graph that baked in a Python float at capture would; eager reads the current ones."""
    real_init, real_write, real_read = KVCache.__init__, KVCache.write, KVCache.read

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self._at_capture = (self.k_scale.clone(), self.v_scale.clone())

    def replaying() -> bool:
        try:
            return get_forward_context().mode is CaptureMode.REPLAY
        except RuntimeError:  # outside any forward (calibration reads the cache)
            return False

    def stale(real):
        def method(self, *args, **kwargs):
            if not replaying():
                return real(self, *args, **kwargs)
            now = self.k_scale, self.v_scale
            self.k_scale, self.v_scale = self._at_capture
            try:
                return real(self, *args, **kwargs)
            finally:
                self.k_scale, self.v_scale = now

        return method

    monkeypatch.setattr(KVCache, "__init__", init)
    monkeypatch.setattr(KVCache, "write", stale(real_write))
    monkeypatch.setattr(KVCache, "read", stale(real_read))


def _plant_no_scale_on_read(monkeypatch) -> None:
    """Dequantization forgets the scale: codes read back as they are (K/scale, V/scale), in eager and graph alike."""
    monkeypatch.setattr(kv_cache_module, "dequantize_kv", lambda x, scale, dtype: x.float().to(dtype))


def _plant_truncating_quantizer(monkeypatch) -> None:
    """K/V rounded toward zero instead of to nearest (a cast path that truncates): every value off by up to one
    FP8 step, half of them, in eager and graph alike — the class a chance turn of a rounding looks like, everywhere."""
    import torch

    def truncating(x, scale):
        y = (x.float() / scale).clamp(-kv_cache_module.FP8_MAX, kv_cache_module.FP8_MAX)
        q = y.to(torch.float8_e4m3fn)
        code = q.view(torch.uint8)
        magnitude = code & 0x7F
        down = (q.float().abs() > y.abs()) & (magnitude > 0)
        return torch.where(down, (code & 0x80) | (magnitude - 1), code).view(torch.float8_e4m3fn)

    monkeypatch.setattr(kv_cache_module, "quantize_kv", truncating)


def _plant_scale_off_on_read(monkeypatch) -> None:
    """Read back with the scale 12.5% off (a scale from another calibration): graph = eager, every value off."""
    monkeypatch.setattr(kv_cache_module, "dequantize_kv", lambda x, scale, dtype: (x.float() * scale * 1.125).to(dtype))


@pytest.mark.parametrize("plant", [_plant_truncating_quantizer, _plant_scale_off_on_read])
def test_subtle_kv_faults_eager_shares_are_caught_by_the_reference_layer_past_chance_turns(monkeypatch, plant):
    """Float32 on the CPU, where the reference layer excuses what a chance FP8 turn does at each position
    (kv_reference.CHANCE_TWINS): a fault that moves every value by a rounding step or less is still caught."""
    plant(monkeypatch)
    r = _cell()
    assert r.status == "fail_accuracy", (r.status, r.reason)
    assert r.metrics.judge.max_same_padding_diff < 1e-4  # graph = eager: only the reference layer can see it
    ref = r.metrics.judge.reference
    assert ref.status == "fail" and ref.chance_adjusted_mean is not None and ref.chance_adjusted_mean > 10 * ref.mean_bound, \
        ref.summary()


@pytest.mark.parametrize("graph", ["piecewise", pytest.param("full", marks=pytest.mark.slow)])
def test_a_stale_kv_scale_under_graphs_is_caught(monkeypatch, graph):
    _plant_stale_scale(monkeypatch)
    r = _cell(graph=graph)
    assert r.status == "fail_accuracy", (r.status, r.reason)
    assert "same padding" in r.reason  # graph ≠ eager: what the graph read is not what eager read
    assert r.metrics.judge.reference.status == "pass"  # eager itself is right


@pytest.mark.slow
@pytest.mark.parametrize("model", ["deepseek-v3", "gpt-oss-120b"])
def test_a_stale_kv_scale_is_caught_on_mla_and_sinks(monkeypatch, model):
    _plant_stale_scale(monkeypatch)
    r = _cell(model, "full", "flex")
    assert r.status == "fail_accuracy", (r.status, r.reason)


@pytest.mark.parametrize("model", ["llama-3.1-8b", pytest.param("deepseek-v3", marks=pytest.mark.slow)])
def test_a_scale_applied_on_write_but_not_on_read_is_caught(monkeypatch, model):
    _plant_no_scale_on_read(monkeypatch)
    r = _cell(model)
    assert r.status == "fail_accuracy", (r.status, r.reason)
    assert r.metrics.judge.max_same_padding_diff == 0 or r.metrics.judge.max_same_padding_diff < 1e-4  # graph = eager: not the graph
    assert r.metrics.judge.reference.status == "fail" and "reference layer" in r.reason, r.reason


def test_the_planted_faults_change_nothing_with_a_16_bit_cache(monkeypatch):
    """Control: the plants act on the FP8 path only, so a kv_cache=auto cell with both planted still passes."""
    _plant_stale_scale(monkeypatch)
    _plant_no_scale_on_read(monkeypatch)
    r = run_cell(CellSpec(model="llama-3.1-8b", tiny=True, graph="piecewise", max_tokens=64, max_new_tokens=4))
    assert r.status == "pass", r.reason
    assert r.metrics.settings.kv_cache == "auto" and r.metrics.quant.kv_scales is None


@pytest.mark.slow
def test_checkpoint_scales_are_used_as_declared(monkeypatch):
    """A model whose loader set `pcg_kv_scales` (a checkpoint declaring an FP8 KV cache) is not recalibrated."""
    from harness.cell import run as run_module

    real = run_module.load_model

    def load(*args, **kwargs):
        lm = real(*args, **kwargs)
        layers = lm.model.config.num_hidden_layers
        lm.model.pcg_kv_scales = {i: (0.02 + 0.01 * i, 0.015) for i in range(layers)}
        return lm

    monkeypatch.setattr(run_module, "load_model", load)
    r = _cell()
    assert r.status == "pass", r.reason
    assert r.metrics.quant.kv_scales == "checkpoint"
