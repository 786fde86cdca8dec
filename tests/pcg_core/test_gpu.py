"""CUDA graph capture and replay on a GPU, bf16: every graph backend captures its whole ladder, generates
what eager generates, and — the strong check — a replay is bitwise equal to an eager forward of the same
padded inputs. Skipped without a GPU (CI has none); run on the device machine with
`python -m pytest -q -m gpu tests/pcg_core/test_gpu.py`."""

from __future__ import annotations

import contextlib
import gc
from types import SimpleNamespace

import pytest
import torch
from pcg_helpers import CASES, GRAPH_BACKENDS, MAX_NEW_TOKENS, compare_outputs, config_path, make_engine, plant_stale_positions, prompts_of, tiny_model

from pcg_core import load_model
from pcg_core.attention.sdpa import SdpaBackend
from pcg_core.capture import base as capture_base
from pcg_core.capture.graphs import GraphPool
from pcg_core.engine.inputs import PackedBatch
from pcg_core.forward_context import CaptureMode, get_forward_context

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# bf16 bound on logprobs, graph replay vs the eager engine. On a GPU the padded batch runs GEMMs with more rows
# than the unpadded eager one, and cuBLAS may pick another kernel (another summation order) for another M, so
# real rows can differ by bf16 roundings (relative 2^-9 ≈ 2e-3 each) that compound over the layers. Logits of
# these synthetic models are O(1-10): a few roundings give ≲ 5e-2 on a logprob. Tokens are compared only up to
# the first divergence, where each token must be in the other run's top 5. (Bitwise equality, where it is
# expected, is checked separately below.)
GPU_BF16_TOL = 2e-2

MODELS = {
    "qwen3-tiny": dict(arch="qwen3", tiny=True, layers=2),
    "qwen3-moe-tiny": dict(arch="qwen3-moe", tiny=True, layers=2),
    "qwen3-0.6b-4-layers": dict(arch="qwen3", tiny=False, layers=4),  # real widths, trimmed
    "qwen3-30b-a3b-2-layers": dict(arch="qwen3-moe", tiny=False, layers=2),  # real widths, 128 experts
}


@pytest.fixture(scope="module", params=list(MODELS))
def gpu_model(request):
    spec = MODELS[request.param]
    lm = load_model(config_path(spec["arch"]), tiny=spec["tiny"], layers=spec["layers"], dtype=torch.bfloat16, device="cuda")
    setup = SimpleNamespace(name=request.param, lm=lm, layers=spec["layers"], engines={}, ref={})
    setup.engines["disabled"] = make_engine(lm.model, "disabled", dtype="bfloat16", device="cuda")
    yield setup
    setup.engines.clear()
    torch.cuda.empty_cache()


def _engine(setup, backend):
    if backend not in setup.engines:
        setup.engines[backend] = make_engine(setup.lm.model, backend, dtype="bfloat16", device="cuda")
    return setup.engines[backend]


def _batch(engine, lengths, seed=0) -> PackedBatch:
    prompts = prompts_of(lengths, engine.model.config.vocab_size, seed=seed)
    engine.cache.reset()
    batch = PackedBatch([], [], [], [])
    for i, p in enumerate(prompts):
        slots = engine.cache.allocate(i, len(p))
        batch.token_ids += p
        batch.positions += list(range(len(p)))
        batch.seq_ids += [i] * len(p)
        batch.slots += slots
    return batch


def _assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if not torch.equal(a, b):
        diff = (a.float() - b.float()).abs()
        pytest.fail(f"{what}: not bitwise equal; max abs diff {diff.max().item():.3g}, {int((diff > 0).sum())} of {diff.numel()} elements differ")


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_capture_covers_the_whole_ladder(gpu_model, backend):
    engine = _engine(gpu_model, backend)
    stats, ladder, L = engine.stats, engine.config.capture.ladder, gpu_model.layers
    # piecewise: the pieces, and the attention ops in graphs of their own (sdpa's op is capturable)
    per_bucket = {"piecewise": 2 * L + 1, "breakable": L + 1, "full": 1}[backend]
    assert stats.graphs_captured == per_bucket * len(ladder) > 0
    assert stats.graphed_split_ops == (L if backend == "piecewise" else 0)
    assert stats.capture_s > 0
    assert stats.graph_pool_bytes >= 0
    if backend == "piecewise":
        assert (stats.pieces, stats.split_ops) == (L + 1, L)
        for mod in engine.backend.split_gm.children():
            if hasattr(mod, "graphs"):
                assert sorted(mod.graphs) == ladder
        # every submodule graphed, so each bucket replays its graphs back to back without the split module
        assert all(len(engine.backend.entries[b].graphs) == per_bucket for b in ladder)
    assert sorted(engine.backend.entries) == ladder


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_replay_is_bitwise_equal_to_eager_at_the_same_padded_count(gpu_model, backend):
    engine = _engine(gpu_model, backend)
    for lengths in ([3, 7], [16], [5, 9, 11, 23]):  # 10 → bucket 12 (padded), 16 (exact), 48 → bucket 48
        batch = _batch(engine, lengths)
        replay = engine.forward(batch).clone()  # a view of graph memory until cloned
        eager = engine.forward(batch, eager=True).clone()
        _assert_bitwise(replay, eager, f"{gpu_model.name}/{backend} {lengths}: replay vs eager at the same bucket")


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_replay_at_an_exact_bucket_is_bitwise_equal_to_the_eager_engine(gpu_model, backend):
    engine, off = _engine(gpu_model, backend), gpu_model.engines["disabled"]
    for lengths in ([16], [12, 20]):  # 16 and 32 tokens: buckets, so no padding on either side
        hits = sum(engine.stats.bucket_hits.values())
        replay = engine.forward(_batch(engine, lengths)).clone()
        assert sum(engine.stats.bucket_hits.values()) == hits + 1
        eager = off.forward(_batch(off, lengths)).clone()
        _assert_bitwise(replay, eager, f"{gpu_model.name}/{backend} {lengths}: replay vs disabled engine")


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_generation_matches_eager_bf16(gpu_model, backend):
    engine, off = _engine(gpu_model, backend), gpu_model.engines["disabled"]
    vocab = gpu_model.lm.config.vocab_size
    problems = []
    for case, lengths in CASES.items():
        prompts = prompts_of(lengths, vocab, seed=1)
        if case not in gpu_model.ref:
            gpu_model.ref[case] = off.generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True)
        fallbacks = engine.stats.eager_fallbacks
        out = engine.generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True)
        assert engine.stats.eager_fallbacks - fallbacks == (1 if case == "above_max" else 0)
        problems += [f"{case}: {m}" for m in compare_outputs(gpu_model.ref[case], out, GPU_BF16_TOL, divergence="topk")]
    assert problems == [], f"{gpu_model.name}/{backend}: " + "; ".join(problems)


def test_a_replay_plan_missing_a_graph_is_caught(gpu_model):
    """Planted fault in the back-to-back replay: one attention graph dropped from a bucket's plan, so that layer's
    output is whatever the previous forward left there. The bitwise check must see it."""
    if gpu_model.name != "qwen3-tiny":
        pytest.skip("one model is enough")
    engine = _engine(gpu_model, "piecewise")
    batch = _batch(engine, [5, 11])  # 16 tokens: an exact bucket
    plan = engine.backend.entries[16]
    good = engine.forward(batch).clone()
    _assert_bitwise(good, engine.forward(batch, eager=True).clone(), "intact plan")
    graphs = plan.graphs
    try:
        plan.graphs = graphs[:1] + graphs[2:]  # graphs[1] is layer 0's attention
        engine.forward(_batch(engine, [9, 7]))  # other tokens leave other values behind in graph memory
        bad = engine.forward(batch).clone()
    finally:
        plan.graphs = graphs
    assert not torch.equal(bad, good), "a plan without layer 0's attention graph gave the right answer"


def test_stale_static_input_is_caught_on_replay(gpu_model, monkeypatch):
    """Planted fault on real graphs: the positions buffer the graphs read keeps the previous batch's values."""
    if gpu_model.name != "qwen3-tiny":
        pytest.skip("one model is enough")
    off = gpu_model.engines["disabled"]
    engine = make_engine(gpu_model.lm.model, "piecewise", dtype="bfloat16", device="cuda")
    prompts = prompts_of(CASES["packed_8"], gpu_model.lm.config.vocab_size, seed=4)
    ref = off.generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True)
    assert compare_outputs(ref, engine.generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True), GPU_BF16_TOL, divergence="topk") == []
    plant_stale_positions(engine, monkeypatch)
    faulty = engine.generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True)
    assert compare_outputs(ref, faulty, GPU_BF16_TOL) != []


# Capture hygiene: what else runs in the process must not break a capture, and a broken capture must not break
# the process. Both found on the H200 when this file's earlier fixtures left dead engines behind.


@pytest.fixture(scope="module")
def tiny_lm():
    return tiny_model("qwen3", layers=2, dtype=torch.bfloat16, device="cuda")


def _in_capture(monkeypatch, action) -> None:
    """Call action() inside the attention op whenever it runs while a bucket is captured: recorded into a graph
    (full, and piecewise's attention graphs: the stream is capturing) or between segments (breakable's
    CAPTURE mode)."""
    original = SdpaBackend.forward

    def forward(self, *args, **kwargs):
        if get_forward_context().mode is CaptureMode.CAPTURE or torch.cuda.is_current_stream_capturing():
            action()
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SdpaBackend, "forward", forward)


@pytest.mark.parametrize("planted", [False, True], ids=["guarded", "planted-no-guard"])
@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_the_garbage_collector_is_paused_while_capturing(tiny_lm, backend, planted, monkeypatch):
    """The cyclic collector freeing a dead engine's graphs mid-capture invalidates the capture."""
    if planted:
        monkeypatch.setattr(capture_base, "no_gc_during_capture", contextlib.nullcontext)
    seen: list[bool] = []
    _in_capture(monkeypatch, lambda: seen.append(gc.isenabled()))
    make_engine(tiny_lm.model, backend, dtype="bfloat16", device="cuda")
    assert seen, "the attention op never ran in capture mode"
    assert set(seen) == {planted}, f"collector enabled during capture: {sorted(set(seen))}"
    assert gc.isenabled()


def test_dead_engines_collected_around_a_capture_do_not_break_it(tiny_lm):
    """The regression itself: engines with graphs, dropped in reference cycles, and an eager collector."""
    for backend in ("piecewise", "breakable"):
        engine = make_engine(tiny_lm.model, backend, dtype="bfloat16", device="cuda")
        engine.self_cycle = engine
    del engine
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        full = make_engine(tiny_lm.model, "full", dtype="bfloat16", device="cuda")
    finally:
        gc.set_threshold(*thresholds)
    off = make_engine(tiny_lm.model, "disabled", dtype="bfloat16", device="cuda")
    prompts = prompts_of(CASES["packed_8"], tiny_lm.config.vocab_size, seed=5)
    ref = off.generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True)
    assert compare_outputs(ref, full.generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True), GPU_BF16_TOL, divergence="topk") == []


@pytest.mark.parametrize("planted", [False, True], ids=["aborted", "planted-no-abort"])
def test_an_exception_during_capture_ends_the_capture(tiny_lm, planted, monkeypatch):
    """Left open, the capture makes every later CUDA call in the process fail (the error a failed cell and
    all its neighbours in one process would see)."""
    pools: list[GraphPool] = []
    real_begin, real_abort = GraphPool.begin, GraphPool.abort
    monkeypatch.setattr(GraphPool, "begin", lambda self: (pools.append(self), real_begin(self))[1])
    if planted:
        monkeypatch.setattr(GraphPool, "abort", lambda self: None)

    def boom():
        raise RuntimeError("planted capture failure")

    _in_capture(monkeypatch, boom)
    with pytest.raises(RuntimeError, match="planted capture failure"):
        make_engine(tiny_lm.model, "full", dtype="bfloat16", device="cuda")
    try:
        torch.ones(8, device="cuda").sum().item()
        usable = True
    except Exception:  # noqa: BLE001 - any CUDA refusal counts
        usable = False
    finally:
        for pool in pools:
            real_abort(pool)  # clean up after the planted leak, for the tests that follow
    assert usable is not planted
    torch.randn(8, device="cuda")  # after an abort the CUDA generator is out of capture mode too
