"""Capture backends on a CPU: the split structure, equivalence of every graph backend with eager generation
at the bucket edges, and planted faults that the comparison must catch.

On a CPU no CUDA graph is recorded, but piecewise runs its dynamo-traced split graph module, breakable its
segment recorder, and all three pad to buckets through the engine's static input buffers: everything but
the replay itself is exercised here (test_gpu.py covers the replay).
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from pcg_helpers import (
    ARCH_NAMES,
    CASES,
    GRAPH_BACKENDS,
    MAX_NEW_TOKENS,
    compare_outputs,
    make_engine,
    plant_stale_positions,
    prompts_of,
    tiny_model,
)

from pcg_core import CaptureConfig, Engine, EngineConfig, SequenceOutput
from pcg_core.capture.piecewise import PieceRunner

# fp32 bound for graph backend vs eager: the only difference is padding (a bucket's GEMMs have more rows;
# padding rows never mix into real rows), so the real rows differ at most by the summation order a GEMM
# kernel picks for a different M: a few fp32 ulps (~1e-7 relative), ~1e-6 after log_softmax. Measured: 0.
# 1e-4 is far below anything a real bug produces (the planted faults below move logprobs by >1e-2).
FP32_TOL = 1e-4
# bf16 bound: bf16 keeps 8 significant bits (relative rounding 2^-9 ≈ 2e-3). Logits of these tiny models are
# O(1-5), so one rounding of a logit moves a logprob by up to ~1e-2 where a different GEMM shape rounds
# differently (as on a GPU); 2e-2 allows that, and tokens are compared only up to the first divergence with
# top-5 containment there. Measured on a CPU: 0 (bitwise equal).
BF16_TOL = 2e-2


def _attention_nodes(gm: torch.fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and "pcg.attention" in str(n.target))


# Structure ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_split_structure(arch, layers):
    L = layers
    lm = tiny_model(arch, layers=L)
    pw = make_engine(lm.model, "piecewise")
    assert (pw.stats.submodules, pw.stats.pieces, pw.stats.split_ops) == (2 * L + 1, L + 1, L)
    # The split module alternates piece, attention, piece, ...: each split submodule holds exactly one
    # attention call, each captured piece none.
    children = list(pw.backend.split_gm.named_children())
    assert len(children) == 2 * L + 1
    for i, (name, mod) in enumerate(children):
        if i % 2 == 0:
            assert isinstance(mod, PieceRunner), name
            assert _attention_nodes(mod.fn) == 0, name
        else:
            assert _attention_nodes(mod) == 1, name
    assert pw.stats.buckets == pw.config.capture.ladder
    assert pw.stats.graphs_captured == 0  # no CUDA here

    br = make_engine(lm.model, "breakable")
    assert (br.stats.pieces, br.stats.split_ops) == (L + 1, L)  # segments = L + 1

    full = make_engine(lm.model, "full")
    assert (full.stats.pieces, full.stats.submodules, full.stats.split_ops) == (1, 1, 0)


def test_replay_plan_lists_every_graph_in_call_order_or_none():
    """The plan replays a bucket's graphs back to back, so it must hold each submodule's graph in the order the
    split module calls them, and exist only where every submodule has one (an eager split op needs Python)."""
    lm = tiny_model(ARCH_NAMES[0], layers=2)
    backend = make_engine(lm.model, "piecewise").backend
    names = [n.target for n in backend.split_gm.graph.nodes if n.op == "call_module"]
    runners = [getattr(backend.split_gm, n) for n in names]
    assert backend._graphs_in_call_order(8) is None  # no graphs on a CPU
    for i, r in enumerate(runners):
        if isinstance(r, PieceRunner):
            r.graphs[8] = (f"graph{i}", None)
    assert backend._graphs_in_call_order(8) is None  # the split ops have no graphs: they run between them
    for i, name in enumerate(names):
        if not isinstance(runners[i], PieceRunner):
            setattr(backend.split_gm, name, PieceRunner(runners[i], i, backend.pool, split=True))
            getattr(backend.split_gm, name).graphs[8] = (f"graph{i}", None)
    assert backend._graphs_in_call_order(8) == tuple(f"graph{i}" for i in range(len(names)))
    assert backend._graphs_in_call_order(16) is None
    # a split op's fresh-path variant (MLA's expanded prefill) is a graph of its own; the pieces' are shared
    assert backend._graphs_in_call_order(8, fresh_path="packed") is None
    for i, r in enumerate(getattr(backend.split_gm, n) for n in names):
        if r.split:
            r.graphs[(8, "packed")] = (f"packed{i}", None)
    assert backend._graphs_in_call_order(8, fresh_path="packed") == tuple(
        f"{'packed' if getattr(backend.split_gm, n).split else 'graph'}{i}" for i, n in enumerate(names))
    assert backend._graphs_in_call_order(8, fresh_path="one") is None  # each variant's own graphs, none borrowed

    off = make_engine(lm.model, "disabled")
    assert (off.stats.pieces, off.stats.submodules, off.stats.buckets) == (0, 0, [])


# Equivalence with eager, fp32, every architecture and backend, at the bucket edges ------------------------------


@pytest.fixture(scope="module", params=ARCH_NAMES)
def arch_engines(request):
    lm = tiny_model(request.param)
    engines = {b: make_engine(lm.model, b) for b in ["disabled", *GRAPH_BACKENDS]}
    return SimpleNamespace(arch=request.param, lm=lm, engines=engines, ref={})


def _reference(setup, case: str) -> list[SequenceOutput]:
    if case not in setup.ref:
        prompts = prompts_of(CASES[case], setup.lm.config.vocab_size, seed=len(setup.ref))
        setup.ref[case] = (prompts, setup.engines["disabled"].generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True))
    return setup.ref[case]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_graph_backend_matches_eager_fp32(arch_engines, backend, case):
    prompts, ref = _reference(arch_engines, case)
    engine = arch_engines.engines[backend]
    hits0, fallbacks0 = Counter(engine.stats.bucket_hits), engine.stats.eager_fallbacks
    out = engine.generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True)

    mismatches = compare_outputs(ref, out, FP32_TOL)
    assert mismatches == [], f"{arch_engines.arch}/{backend}/{case}: " + "; ".join(mismatches)

    # The batches went where the ladder says: prefill to its bucket (or eagerly above max_tokens), each of the
    # decode steps (one token per sequence) to the bucket of the number of sequences.
    cap = engine.config.capture
    total = sum(len(p) for p in prompts)
    expected = Counter({cap.bucket_for(len(prompts)): MAX_NEW_TOKENS - 1})
    if cap.bucket_for(total) is not None:
        expected[cap.bucket_for(total)] += 1
    hits = engine.stats.bucket_hits - hits0
    assert hits == expected
    assert engine.stats.eager_fallbacks - fallbacks0 == (1 if case == "above_max" else 0)
    if case == "exact_16":
        assert hits[16] == 1  # no padding at all
    if case == "bucket_plus_1":
        assert hits[20] == 1
    assert arch_engines.engines["disabled"].stats.eager_fallbacks == 0  # eager never counts fallbacks


@pytest.mark.parametrize("arch", ["qwen3", "qwen3-moe"])  # one dense, one MoE
def test_graph_backends_match_eager_bf16(arch):
    lm = tiny_model(arch, dtype=torch.bfloat16)
    ref_engine = make_engine(lm.model, "disabled", dtype="bfloat16")
    assert ref_engine.cache.k[0].dtype == torch.bfloat16
    problems = []
    cases = {c: prompts_of(CASES[c], lm.config.vocab_size, seed=5) for c in ("one_token", "bucket_plus_1", "above_max", "packed_8")}
    refs = {c: ref_engine.generate(p, MAX_NEW_TOKENS, prompt_logprobs=True) for c, p in cases.items()}
    for backend in GRAPH_BACKENDS:
        engine = make_engine(lm.model, backend, dtype="bfloat16")
        for case, prompts in cases.items():
            out = engine.generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True)
            problems += [f"{backend}/{case}: {m}" for m in compare_outputs(refs[case], out, BF16_TOL, divergence="topk")]
    assert problems == []


def test_explicit_buckets_pad_to_the_next_listed_bucket():
    lm = tiny_model("llama")
    ref_engine = make_engine(lm.model, "disabled")
    engine = make_engine(lm.model, "piecewise", buckets=[8, 24])
    assert engine.stats.buckets == [8, 24] and engine.inputs.capacity == 24
    prompts = prompts_of([4, 6], lm.config.vocab_size, seed=2)  # 10 tokens → 24; decode 2 → 8
    out = engine.generate(prompts, 3, prompt_logprobs=True)
    assert engine.stats.bucket_hits == {24: 1, 8: 2}
    assert compare_outputs(ref_engine.generate(prompts, 3, prompt_logprobs=True), out, FP32_TOL) == []


@pytest.mark.slow
def test_piecewise_with_inductor_pieces_matches_eager():
    # Each piece compiled by inductor (C++ codegen on a CPU, ~15 s): fused kernels change summation order and
    # may use FMA, so fp32 results differ by a few ulps, well inside FP32_TOL.
    lm = tiny_model("qwen3")
    ref_engine = make_engine(lm.model, "disabled")
    engine = make_engine(lm.model, "piecewise", compiler="inductor")
    assert (engine.stats.pieces, engine.stats.split_ops) == (3, 2)
    assert engine.stats.compile_s > 0
    problems = []
    for case, lengths in CASES.items():
        prompts = prompts_of(lengths, lm.config.vocab_size, seed=8)
        ref = ref_engine.generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True)
        problems += [f"{case}: {m}" for m in compare_outputs(ref, engine.generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True), FP32_TOL)]
    assert problems == []


# compare_outputs itself ---------------------------------------------------------------------------------------


def _seq(prompt_lp, out_ids, out_lp, topk_ids, topk_lp):
    return SequenceOutput(
        prompt_ids=[1, 2, 3],
        output_ids=out_ids,
        output_logprobs=out_lp,
        output_topk_ids=topk_ids,
        output_topk_logprobs=topk_lp,
        prompt_logprobs=prompt_lp,
        prompt_topk_ids=[[0, 1]] * 3,
        prompt_topk_logprobs=[[-0.1, -2.0]] * 3,
    )


def test_compare_outputs_flags_each_kind_of_difference():
    ref = _seq([-1.0, -2.0], [5, 6], [-0.5, -0.7], [[5, 9], [6, 9]], [[-0.5, -1.5], [-0.7, -1.0]])
    assert compare_outputs([ref], [ref], 0.0) == []
    near = _seq([-1.0 + 5e-5, -2.0], [5, 6], [-0.5, -0.7 - 5e-5], [[5, 9], [6, 9]], [[-0.5, -1.5], [-0.7 - 5e-5, -1.0]])
    assert compare_outputs([ref], [near], 1e-4) == []
    far = _seq([-1.0 + 2e-4, -2.0], [5, 6], [-0.5, -0.7], [[5, 9], [6, 9]], [[-0.5, -1.5], [-0.7, -1.0]])
    assert len(compare_outputs([ref], [far], 1e-4)) == 1
    wrong_token = _seq([-1.0, -2.0], [9, 6], [-0.5, -0.7], [[9, 5], [6, 9]], [[-0.5, -1.5], [-0.7, -1.0]])
    assert any("token 9 != reference 5" in m for m in compare_outputs([ref], [wrong_token], 1e-4))
    assert compare_outputs([ref], [wrong_token], 1e-4, divergence="topk") == []  # 9 is in the reference's top-k
    tie = _seq([-1.0, -2.0], [5, 6], [-0.5, -0.7], [[5, 9], [6, 9]], [[-0.50, -0.50001], [-0.7, -1.0]])
    flipped = _seq([-1.0, -2.0], [9, 4], [-0.5, -3.0], [[9, 5], [4, 6]], [[-0.5, -0.5], [-3.0, -4.0]])
    assert compare_outputs([tie], [flipped], 1e-4) == []  # a tie flip ends the comparison of that sequence
    assert compare_outputs([ref], [ref, ref], 0.0) != []
    short = _seq([-1.0, -2.0], [5], [-0.5], [[5, 9]], [[-0.5, -1.5]])
    assert compare_outputs([ref], [short], 1.0) != []
    nan = _seq([float("nan"), -2.0], [5, 6], [-0.5, -0.7], [[5, 9], [6, 9]], [[-0.5, -1.5], [-0.7, -1.0]])
    assert compare_outputs([ref], [nan], 1.0) != []


# Planted faults: the comparison must catch them ------------------------------------------------------------------


@pytest.fixture(scope="module")
def fault_setup():
    lm = tiny_model("qwen3-moe")
    prompts = prompts_of(CASES["packed_8"], lm.config.vocab_size, seed=9)
    ref = make_engine(lm.model, "disabled").generate(prompts, MAX_NEW_TOKENS, prompt_logprobs=True)
    return SimpleNamespace(lm=lm, prompts=prompts, ref=ref)


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_stale_static_positions_are_caught(fault_setup, backend, monkeypatch):
    engine = make_engine(fault_setup.lm.model, backend)
    clean = engine.generate(fault_setup.prompts, MAX_NEW_TOKENS, prompt_logprobs=True)
    assert compare_outputs(fault_setup.ref, clean, FP32_TOL) == []  # unfaulted: passes

    calls = plant_stale_positions(engine, monkeypatch)
    faulty = engine.generate(fault_setup.prompts, MAX_NEW_TOKENS, prompt_logprobs=True)
    assert len(calls) == MAX_NEW_TOKENS  # the fault was active on every decode step
    mismatches = compare_outputs(fault_setup.ref, faulty, FP32_TOL)
    assert mismatches, "stale positions went unnoticed"
    # Prefill used fresh positions, so the prompt logprobs still agree: the mismatches are in decoding.
    assert all("prompt" not in m for m in mismatches), mismatches


def test_padding_kv_written_into_a_real_slot_is_caught(fault_setup):
    engine = make_engine(fault_setup.lm.model, "piecewise")
    engine.cache.pad_slot = 0  # fault: padding rows write K/V over sequence 0's first token
    faulty = engine.generate(fault_setup.prompts, MAX_NEW_TOKENS, prompt_logprobs=True)
    mismatches = compare_outputs(fault_setup.ref, faulty, FP32_TOL)
    assert any(m.startswith("seq 0") for m in mismatches), mismatches


def test_garbage_in_padding_rows_does_not_leak_into_real_rows(fault_setup, monkeypatch):
    # Not zeroing padding rows is caught by the padding check in test_engine.py, not end to end: every op
    # outside attention (norms, MLPs, the MoE router and experts) is per token, and attention masks padding
    # out, so garbage in padding rows must leave real rows bit-for-bit alone. This pins that isolation.
    engine = make_engine(fault_setup.lm.model, "piecewise")
    original = engine.attn_backend.forward
    padded = []

    def garbage(q, k, v, out, params, md):
        original(q, k, v, out, params, md)
        out[md.num_actual :] = 1e3
        padded.append(md.num_tokens - md.num_actual)

    monkeypatch.setattr(engine.attn_backend, "forward", garbage)
    out = engine.generate(fault_setup.prompts, MAX_NEW_TOKENS, prompt_logprobs=True)
    assert sum(padded) > 0
    assert compare_outputs(fault_setup.ref, out, FP32_TOL) == []


# pcg_core bug: the 9th piecewise engine in one process fails ------------------------------------------------------


def test_more_piecewise_engines_than_dynamo_recompile_limit():
    """Building piecewise engines one after another (a harness sweeping models and backends does) must keep
    working. Each PiecewiseBackend torch.compile()s the same code object, Engine._body, with a new backend
    callable; dynamo counts each as a recompile of that code, and with fullgraph=True the engine after
    `recompile_limit` (8) raises FailOnRecompileLimitHit."""
    torch._dynamo.reset()
    limit = getattr(torch._dynamo.config, "recompile_limit", None) or torch._dynamo.config.cache_size_limit
    lm = tiny_model("qwen3", layers=1)
    try:
        for i in range(limit + 1):
            engine = Engine(lm.model, EngineConfig(capture=CaptureConfig(backend="piecewise", max_tokens=8), kv_slots=64))
            assert engine.stats.pieces == 2, i
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("qdtype", [torch.float8_e4m3fn, torch.int8])
def test_pieces_that_quantize_activations_are_told_apart(qdtype):
    """Such pieces are compiled with eager's roundings (compile_piece_inductor); the rest as inductor likes."""
    from pcg_core.capture.piecewise import quantizes

    seen = []

    def backend(gm, inputs):
        seen.append(gm)
        return gm

    torch.compile(lambda x: (x / 3).to(qdtype).float() * 3, backend=backend)(torch.randn(4, 8))
    torch.compile(lambda x: torch.nn.functional.silu(x) * 2, backend=backend)(torch.randn(4, 8))
    assert [quantizes(gm) for gm in seen] == [True, False]
