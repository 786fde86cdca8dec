"""The float32 padding check (harness/cell/judge/padding.py): padding noise is allowed only where float32 shows padding
exact, and a failure against unpadded eager is excused only then and only when the graph matches eager at its own
padding. Planted into the model (so eager and graph share it): a padding leak, and a half-precision-only one."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from harness.cards import find_card
from harness.cell import CellSpec, run_cell
from harness.cell.judge.lockstep import LockstepStats
from harness.cell.judge.padding import FP32_PADDING_RTOL, PROBE_RTOL, attention_padding_rel, float32_padding_rel
from harness.cell.judge.policy import _excuse_padding
from harness.cell.judge.tokens import Judgement
from harness.cell.run import _Cell
from harness.cell.prompts import Case, prompt_suite
from harness.metrics import CellMetrics
from harness.outcome import Status
from pcg_core.config import CaptureConfig, EngineConfig
from pcg_core.engine import Engine
from pcg_core.engine.kv_scales import calibrate_kv_scales, set_kv_scales
from pcg_core.model import load_model


class _LeakyNorm(torch.nn.Module):
    """The final norm plus a share of the mean over every row of the forward, padding rows included: the hidden
    state of a real row then depends on the padding. `half_only`: only outside float32 (what rounding looks like
    to the judge: a padding effect that float32 does not have)."""

    def __init__(self, inner: torch.nn.Module, share: float, half_only: bool):
        super().__init__()
        self.inner, self.share, self.half_only = inner, share, half_only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        if self.half_only and x.dtype == torch.float32:
            return out
        return out + self.share * out.mean(dim=-2, keepdim=True)


def _leaky(model: torch.nn.Module, share: float, half_only: bool) -> torch.nn.Module:
    decoder = model.get_decoder()
    decoder.norm = _LeakyNorm(decoder.norm, share, half_only)
    return model


def _padding_rel(model: torch.nn.Module, config: EngineConfig) -> float:
    """float32_padding_rel on the first 3 cases of the suite, padded to `config`'s ladder."""
    ladder = config.capture.ladder
    cases = prompt_suite(ladder, model.config.vocab_size, seed=0, max_new_tokens=3)[:3]
    return float32_padding_rel(model, config, lambda n: next((b for b in ladder if b >= n), None), cases)


def _plant(monkeypatch, share: float, half_only: bool) -> None:
    import harness.cell.run as run

    real = run.load_model

    def load(*a, **kw):
        lm = real(*a, **kw)
        _leaky(lm.model, share, half_only)
        return lm

    monkeypatch.setattr(run, "load_model", load)


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_padding_is_exact_in_float32_and_a_leak_is_not(attention):
    lm = load_model(find_card("qwen3-0.6b").config, tiny=True, dtype=torch.float32, device="cpu", seed=0)
    config = EngineConfig(attention=attention, dtype="bfloat16",
                          capture=CaptureConfig(backend="piecewise", max_tokens=64), kv_slots=4096)
    exact = _padding_rel(lm.model.to(torch.bfloat16), config)
    assert exact <= 1e-5, exact
    leaked = _padding_rel(_leaky(lm.model, 0.01, half_only=False), config)
    assert leaked > 100 * FP32_PADDING_RTOL, leaked
    # the caller's model was not touched (the check ran on its twin)
    assert next(lm.model.parameters()).dtype == torch.bfloat16


def _cell(**kw):
    return run_cell(CellSpec(model="qwen3-30b-a3b", tiny=True, dtype="bfloat16", max_tokens=64, max_new_tokens=4, **kw))


def test_a_padding_leak_does_not_widen_the_bound(monkeypatch):
    """The leak shows as padding noise; before the float32 check it widened the logprob bound to itself."""
    _plant(monkeypatch, 0.5, half_only=False)
    r = _cell()
    m = r.metrics
    assert m.judge.padding_noise > 0.1 and m.judge.padding_rel_fp32 > FP32_PADDING_RTOL, (m.judge.padding_noise, m.judge.padding_rel_fp32)
    assert r.status == Status.FAIL_ACCURACY, r.reason
    assert "padding reaches real rows" in r.reason


def test_half_precision_only_padding_noise_is_allowed(monkeypatch):
    """The same noise, absent in float32 (as rounding is): graph equals eager at its padding, so the cell passes,
    whatever the unpadded comparison shows, and says why when it needed the excuse."""
    _plant(monkeypatch, 0.5, half_only=True)
    r = _cell()
    m = r.metrics
    assert m.judge.padding_noise > 0.1 and m.judge.padding_rel_fp32 <= FP32_PADDING_RTOL, (m.judge.padding_noise, m.judge.padding_rel_fp32)
    assert r.status == Status.PASS, r.reason
    assert m.judge.max_same_padding_diff <= 1e-3


def _judged(failed: list[str], same: float) -> tuple[_Cell, Judgement, dict[str, LockstepStats]]:
    m = CellMetrics(padding_rel_fp32=1e-6, padding_noise=0.9)
    cell = _Cell(CellSpec(model="qwen3-0.6b"), EngineConfig(), m, cases=[Case("a", ((1, 2),), (2,)), Case("b", ((3,),), (2,))])
    j = Judgement(Status.FAIL_ACCURACY, "greedy tokens diverge", failed_cases=failed)
    stats = {"a": LockstepStats(same_padding_rel=same), "b": LockstepStats(same_padding_rel=0.0)}
    return cell, j, stats


@pytest.mark.parametrize("failed,same,proven,unproven_exact,passes", [
    (["a"], 0.0, {"a"}, None, True),  # proven before (its padding noise widened the bound)
    (["a", "b"], 0.0, {"a"}, True, True),  # b checked now, exact
    (["a", "b"], 0.0, {"a"}, False, False),  # b checked now, a leak
    (["a", "b"], 0.0, {"a"}, None, False),  # b's check could not run
    (["a"], 2e-3, {"a"}, None, False),  # the graph is not eager at its padding: no excuse
    (["a"], float("nan"), {"a"}, None, False),
])
def test_the_excuse_needs_every_failing_case_proven_and_the_graph_equal_at_its_padding(
        monkeypatch, failed, same, proven, unproven_exact, passes):
    import harness.cell.judge.policy as policy

    asked = []
    monkeypatch.setattr(policy, "_padding_exact", lambda cell, graph, cases: asked.extend(c.name for c in cases) or unproven_exact)
    cell, j, stats = _judged(failed, same)
    _excuse_padding(cell, None, j, stats, proven)
    assert (j.status == Status.PASS) == passes, j.reason
    assert not passes or j.reason.startswith("padding, not the graph")
    assert asked == ([n for n in failed if n not in proven] if same == 0.0 else [])


@pytest.mark.parametrize("error,status", [
    ("RuntimeError: CUDA driver error: out of memory", Status.OOM),  # measured: beside two cells on an H100
    ("OutOfMemoryError: CUDA out of memory. Tried to allocate 4.51 GiB", Status.OOM),
    ("NotImplementedError: no float32 kernel", Status.FAIL_ACCURACY),
])
def test_a_failure_whose_padding_check_could_not_run_says_so_and_out_of_memory_is_retried(monkeypatch, error, status):
    """Graph = eager at its padding, the failure only against unpadded eager, and the float32 check that decides
    the excuse fails: never a silent fail_accuracy. Out of memory ends the cell in OOM (the launcher and
    gpu_cells.sh run it again, alone); any other error keeps the failure, the reason naming the error."""
    import harness.cell.judge.policy as policy

    def check(cell, graph, cases):
        cell.metrics.judge.padding_check_error = error
        return None

    monkeypatch.setattr(policy, "_padding_exact", check)
    cell, j, stats = _judged(["a"], 0.0)
    _excuse_padding(cell, None, j, stats, set())
    assert j.status == status, j.reason
    assert j.reason.startswith("greedy tokens diverge") and error[:40] in j.reason
    # the graph not equal to eager at its padding: no excuse to check, so nothing to retry
    cell, j, stats = _judged(["a"], 2e-3)
    _excuse_padding(cell, None, j, stats, set())
    assert j.status == Status.FAIL_ACCURACY and "could not run" not in j.reason


def test_unquantized_float32_cells_skip_the_check_and_quantized_cells_run_it_in_any_dtype(monkeypatch):
    import harness.cell.judge.policy as policy

    calls = []
    monkeypatch.setattr(policy, "float32_padding_rel", lambda *a, **k: calls.append(a) or 0.0)
    r = run_cell(CellSpec(model="qwen3-0.6b", tiny=True, max_tokens=64, max_new_tokens=3))
    assert r.status == Status.PASS and r.metrics.judge.padding_rel_fp32 is None and not calls
    cell, _, _ = _judged(["a"], 0.0)
    for dtype, quant, asked in (("bfloat16", "fp8_block", True), ("float32", "w4a8", True), ("float32", "none", False),
                                ("bfloat16", "none", True)):
        calls.clear()
        cell.spec = CellSpec(model="qwen3-0.6b", dtype=dtype, quant=quant)
        cell.metrics.judge.padding_rel_fp32, cell.lm = None, type("LM", (), {"model": None})()
        got = policy._padding_exact(cell, type("G", (), {"config": EngineConfig(), "bucket_for": None})(), cell.cases)
        assert (got is not None) == asked and bool(calls) == asked, (dtype, quant)


@pytest.mark.slow
@pytest.mark.parametrize("half_only", [False, True])
def test_a_padding_leak_in_a_quantized_cell_is_told_from_its_quantizers_noise(monkeypatch, half_only):
    """Quantized, the float32 check runs on the float twin: a leak (in every dtype) still shows there and fails
    the cell; one absent in float32 is padding noise, as for an unquantized cell."""
    _plant(monkeypatch, 0.5, half_only=half_only)
    r = _cell(quant="fp8_per_token")
    m = r.metrics
    assert m.judge.padding_noise > 0.1 and m.judge.padding_rel_fp32 is not None, (m.judge.padding_noise, m.judge.padding_rel_fp32)
    if half_only:
        assert m.judge.padding_rel_fp32 <= FP32_PADDING_RTOL and r.status == Status.PASS, r.reason
    else:
        assert m.judge.padding_rel_fp32 > FP32_PADDING_RTOL and r.status == Status.FAIL_ACCURACY, r.reason
        assert "padding reaches real rows" in r.reason


# The backend's own padding probe (a backend with no float32 kernel: float32 runs on sdpa) ---------------------------

def _plant_attention_leak(monkeypatch, name: str, via: str) -> None:
    """`name`'s backend leaks padding into real rows outside float32 (as a half-precision-only kernel would, where the
    float32 check runs on a stand-in): `rows` adds a share of the mean value over every row of the call, padding
    rows included; `pad_slot` a share of the pad slot's value, which padding rows write."""
    from pcg_core.attention import get_attention_backend

    cls = get_attention_backend(name)
    real = cls.forward

    def forward(self, q, k, v, out, params, md):
        real(self, q, k, v, out, params, md)
        if q.dtype == torch.float32:
            return
        if via == "rows":
            extra = v.float().mean(dim=(0, 1))
        else:
            extra = self.cache.k[params.layer][self.cache.pad_slot].float().mean(dim=0)
        out[md.valid] += (0.05 * extra).to(out.dtype)

    monkeypatch.setattr(cls, "forward", forward)


def _probe(attention: str, dtype=torch.bfloat16, device: str = "cpu", kv_cache: str = "auto") -> float:
    lm = load_model(find_card("qwen3-0.6b").config, tiny=True, dtype=dtype, device=device, seed=0)
    ladder = (16, 32, 64)
    config = EngineConfig(attention=attention, dtype=str(dtype).removeprefix("torch."), device=device,
                          capture=CaptureConfig(backend="piecewise", max_tokens=64), kv_slots=4096)
    if kv_cache != "auto":  # scales calibrated on a 16-bit cache, as the cell runner does for synthetic weights
        set_kv_scales(lm.model, calibrate_kv_scales(Engine(lm.model, replace(config, capture=CaptureConfig(
            backend="disabled", max_tokens=64))), [[3, 1, 4, 1, 5, 9, 2, 6] * 4]))
        config = replace(config, kv_cache=kv_cache)
    cases = prompt_suite(ladder, lm.model.config.vocab_size, seed=0, max_new_tokens=3)[:3]
    return attention_padding_rel(lm.model, config, lambda n: next((b for b in ladder if b >= n), None), cases)


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
def test_the_padding_probe_finds_a_backend_exact(attention):
    assert _probe(attention) <= PROBE_RTOL
    assert _probe(attention, torch.float32) <= PROBE_RTOL
    assert _probe(attention, kv_cache="fp8_e4m3") <= PROBE_RTOL  # padding rows' K/V land in the pad slot, FP8 too


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("attention", ["sdpa", "flex", "varlen"])
@pytest.mark.parametrize("kv_cache", ["auto", "fp8_e4m3"])
def test_gpu_the_padding_probe_finds_every_backend_exact(attention, kv_cache):
    """On CUDA the same kernel on the same real rows gives the same bits whatever the padding rows hold (varlen:
    FlashAttention-2, whose padding only this probe can prove)."""
    assert _probe(attention, device="cuda", kv_cache=kv_cache) <= PROBE_RTOL


@pytest.mark.parametrize("via", ["rows", "pad_slot"])
def test_the_padding_probe_catches_a_backend_whose_padding_reaches_real_rows(monkeypatch, via):
    _plant_attention_leak(monkeypatch, "sdpa", via)
    assert _probe("sdpa") > 100 * PROBE_RTOL


@pytest.mark.parametrize("leak", [False, True])
def test_a_backend_without_float32_is_probed_and_its_leak_fails_the_cell(monkeypatch, leak):
    """As varlen on the H200 (no float32 kernel) and flex on CUDA (float32 kernels compiled for the check alone): the
    float32 check runs on another backend (sdpa here), which proves the model's padding but not the cell's
    backend's; the probe proves that one. Half-precision-only padding
    noise makes the excuse path run; with the backend exact the cell passes saying so, with it leaking it fails."""
    import harness.cell.judge.padding as padding
    import harness.cell.judge.policy as policy

    for module in (policy, padding):
        monkeypatch.setattr(module, "float32_attention", lambda a, device: "sdpa")
    _plant(monkeypatch, 0.5, half_only=True)
    if leak:  # through the rows of the call: graph and eager at one padding still agree, only the probe can tell
        _plant_attention_leak(monkeypatch, "flex", "rows")
    r = _cell(attention="flex")
    m = r.metrics
    assert m.judge.padding_rel_fp32 is not None and m.judge.padding_rel_fp32 <= FP32_PADDING_RTOL, m.judge.padding_rel_fp32
    assert m.judge.padding_check_s is not None and m.judge.padding_check_s > 0 and "judge" in m.process.phase_s
    if leak:
        assert m.judge.padding_probe_rel > PROBE_RTOL and r.status == Status.FAIL_ACCURACY, (m.judge.padding_probe_rel, r.reason)
        assert "padding probe" in r.reason
    else:
        assert m.judge.padding_probe_rel <= PROBE_RTOL and r.status == Status.PASS, (m.judge.padding_probe_rel, r.reason)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("quant", ["none", "fp8_block"])
def test_gpu_the_float32_check_runs_an_mla_model_at_real_width_under_flex(quant):
    """DeepSeek-V3's first layer at its real width (absorbed MLA: 576/512-wide heads), bf16 on CUDA, flex: its float
    twin shares the weights and compiles flex's wide-head tiles in float32 (32×32 tiles asked for more shared memory
    than an SM has: DeepSeek-V3 and Kimi-K2 cells could not prove their padding noise), padding exact; a planted leak
    still found."""
    from pcg_core.quant import get_scheme, quantize_model

    lm = load_model(find_card("deepseek-v3").config, layers=1, dtype=torch.bfloat16, device="cuda", seed=0)
    if quant != "none":
        quantize_model(lm.model, get_scheme(quant))
    config = EngineConfig(attention="flex", dtype="bfloat16", device="cuda",
                          capture=CaptureConfig(backend="piecewise", max_tokens=512), kv_slots=4096)
    free = torch.cuda.mem_get_info()[0]
    exact = _padding_rel(lm.model, config)
    assert exact <= FP32_PADDING_RTOL, exact
    assert torch.cuda.mem_get_info()[0] >= free - (1 << 30)  # the twin freed
    leaked = _padding_rel(_leaky(lm.model, 0.01, half_only=False), config)
    assert leaked > 100 * FP32_PADDING_RTOL, leaked
