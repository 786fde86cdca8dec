"""Fresh-sequence paths (AttentionMetadata.fresh_path): a forward with nothing cached before it attends over its own
rows. MLA's expanded prefill (pcg_core/attention/mla_op.py: per-head keys and values multiplied out of the latent,
every other forward absorbed) held to transformers' own forward, to the absorbed form (eager at every bucket edge
with it: test_mla.py), its faults planted; varlen's read of the forward's own K and V instead of a gather (GPU)."""

import copy
import json
import types

import pytest
import torch

from pcg_core import load_model
from pcg_core.attention import fresh, mla_op
from pcg_core.engine import engine as engine_module
from pcg_helpers import make_engine, prompts_of, transformers_prompt_logprobs, transformers_twin

PROMPTS = [list(range(3, 40)), list(range(50, 61)), list(range(7, 30))]  # 71 tokens, three sequences


@pytest.fixture(scope="module")
def deepseek(configs):
    return load_model(json.loads((configs / "deepseek-ai__DeepSeek-V3.json").read_text()), tiny=True)


@pytest.fixture
def fresh_from(monkeypatch):
    """fresh_from(n): engines built after it take the fresh path from n tokens up."""
    return lambda n: monkeypatch.setattr(engine_module, "FRESH_PATH_MIN_TOKENS", n)


@pytest.fixture
def expanded_calls(monkeypatch):
    """Each time the expanded form ran (fresh_attention called from the op): its rows and its path."""
    calls = []
    real = mla_op.fresh_attention
    monkeypatch.setattr(mla_op, "fresh_attention", lambda *a: calls.append((a[0].shape[0], a[3].fresh_path)) or real(*a))
    return calls


def _prompt_logprobs(engine, prompts):
    return [o.prompt_logprobs for o in engine.generate(prompts, max_new_tokens=3, prompt_logprobs=True)]


def _gap(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.mark.parametrize("backend", ["disabled", "piecewise", "breakable", "full"])
@pytest.mark.parametrize("prompts,path", [(PROMPTS, "packed"), (PROMPTS[:1], "one")])
def test_fresh_prefill_is_expanded_and_matches_transformers(deepseek, backend, prompts, path, fresh_from, expanded_calls):
    """Three packed fresh sequences, and one alone (the dense path): the prefill expanded (decode absorbed), each
    sequence's prompt logprobs transformers' own within float32 summation order."""
    fresh_from(1)
    engine = make_engine(deepseek.model, backend)
    got = _prompt_logprobs(engine, prompts)
    layers = deepseek.config.num_hidden_layers
    assert [p for _, p in expanded_calls] == [path] * layers, expanded_calls  # the prefill only: decode reads the cache
    for prompt, lp in zip(prompts, got):
        assert _gap(lp, transformers_prompt_logprobs(deepseek, prompt)) < 1e-4


def test_below_the_threshold_and_after_a_prefix_it_stays_absorbed(deepseek, fresh_from, expanded_calls):
    fresh_from(200)
    engine = make_engine(deepseek.model, "piecewise", max_tokens=256)
    _prompt_logprobs(engine, PROMPTS)  # 71 tokens < 200
    assert expanded_calls == []
    fresh_from(1)
    engine = make_engine(deepseek.model, "piecewise", max_tokens=256)
    engine.generate(PROMPTS, max_new_tokens=3, chunk=16)  # chunks of 16 over 37 + 11 + 23 tokens
    # fresh: the first chunk and the one that starts the third sequence at its first token; not the others (each
    # holds a sequence with KV cached before it) nor the decode steps
    assert len(expanded_calls) == 2 * deepseek.config.num_hidden_layers


@pytest.mark.parametrize("backend", ["piecewise", "breakable", "full"])
def test_every_graph_a_forward_looks_up_has_a_capture_pass(deepseek, backend, fresh_from):
    """The key a replay looks up (bucket, and the variant where the backend records split ops) is one a capture pass
    at that bucket stores: a missing variant would not fail, it would run eagerly at every fresh forward (found on
    the H100: full recorded one pass per bucket, so its fresh prefills never replayed). CPU: the plan alone."""
    fresh_from(128)
    engine = make_engine(deepseek.model, backend, max_tokens=256)
    graphs = engine.backend
    for bucket in engine.config.capture.ladder:
        stored = {graphs.key(bucket, fresh) for fresh in graphs.capture_passes(bucket)}
        # a fresh path needs ≥ fresh_min; MLA's op tells one sequence from several
        looked_up = {graphs.key(bucket, fresh) for fresh in (("", "packed", "one") if bucket >= 128 else ("",))}
        assert looked_up <= stored, (bucket, stored)
        assert len(graphs.capture_passes(bucket)) == (3 if backend == "full" and bucket >= 128 else 1)
    # what prepare() checks on CUDA after capturing: stored as the passes store them, nothing is missing; a variant
    # dropped is named
    graphs.entries = {graphs.key(b, fresh): object() for b in engine.config.capture.ladder
                      for fresh in graphs.capture_passes(b)}
    assert graphs.missing_entries() == []
    if graphs.entry_per_key:
        dropped = graphs.key(256, "one")
        del graphs.entries[dropped]
        assert graphs.missing_entries() == [dropped]


def test_the_path_is_a_function_of_the_batch_and_its_padding(deepseek, configs, fresh_from):
    fresh_from(32)
    engine = make_engine(deepseek.model, "piecewise")
    seqs = torch.tensor([0] * 12 + [1] * 8)
    two = (seqs, torch.tensor(list(range(12)) + list(range(8))))
    assert engine.fresh_path(*two, 32) == "packed" and engine.fresh_path(*two, 20) == ""  # padded to the bucket or not
    assert engine.fresh_path(seqs[:12], two[1][:12], 32) == "one"  # the first sequence alone
    later = (seqs, torch.tensor(list(range(12)) + list(range(3, 11))))
    assert engine.fresh_path(*later, 32) == ""  # the second sequence has KV cached before it
    assert engine.fresh_path(seqs[12:], later[1][12:], 32) == ""  # and alone too
    many = torch.arange(fresh.FRESH_PATH_MAX_SEQS + 1).repeat_interleave(2)  # one sequence too many, two rows each
    assert engine.fresh_path(many, torch.tensor([0, 1]).repeat(len(many) // 2), len(many) + 32) == ""
    assert engine.fresh_path(many[2:], torch.tensor([0, 1]).repeat(len(many) // 2 - 1), len(many) + 32) == "packed"
    engine.backend.fresh_paths = ("packed",)  # a backend whose fresh path is one for any count (varlen's own rows)
    assert engine.fresh_path(seqs[:12], two[1][:12], 32) == "packed"
    llama = load_model(json.loads((configs / "meta-llama__Llama-3.1-8B-Instruct.json").read_text()), tiny=True)
    dense = make_engine(llama.model, "piecewise")
    assert dense.backend.fresh_min is None and dense.backend.fresh_paths == () and dense.fresh_path(*two, 32) == ""


@pytest.mark.parametrize("lengths", [[5, 3, 4], [16], [1] * 6, [2, 9]])
@pytest.mark.parametrize("pad", [0, 7])
def test_sequence_bounds_are_the_runs_then_the_padding_at_a_fixed_length(lengths, pad):
    seq = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)] + [torch.full((pad,), -2)])
    runs = lengths + ([pad] if pad else [])
    want = [0] + torch.tensor(runs).cumsum(0).tolist()
    got = fresh.sequence_bounds(seq, max_seqs=6).tolist()
    assert len(got) == 6 + 2 and got == want + [want[-1]] * (len(got) - len(want))


def test_an_mla_engine_builds_the_bounds_once_per_forward_in_one_static_buffer(deepseek, configs, fresh_from):
    """The upload writes the forward's cu_seqlens (what every layer's fresh kernel reads on CUDA) into one buffer,
    the same for any batch as building them from the uploaded sequence ids; a model without MLA has none, nor an MLA
    model with the fresh paths off."""
    fresh_from(None)
    off = make_engine(deepseek.model, "piecewise")
    assert off.stage_inputs(off.prefill_batch([[5, 6, 7]]), 8, replay=False)[2].fresh_bounds is None
    fresh_from(128)
    engine = make_engine(deepseek.model, "piecewise", max_tokens=128, kv_slots=1024)
    where = set()
    for lengths in ([37, 11, 23], [5], [1] * (fresh.FRESH_PATH_MAX_SEQS + 8), [2, 60]):
        batch = engine.prefill_batch(prompts_of(lengths, deepseek.config.vocab_size))
        md = engine.stage_inputs(batch, engine.bucket_for(len(batch)), replay=False)[2]
        assert md.fresh_bounds is not None and md.fresh_bounds.tolist() == fresh.sequence_bounds(md.seq_ids).tolist()
        where.add(md.fresh_bounds.data_ptr())
    assert len(where) == 1
    llama = load_model(json.loads((configs / "meta-llama__Llama-3.1-8B-Instruct.json").read_text()), tiny=True)
    dense = make_engine(llama.model, "piecewise")
    assert dense.stage_inputs(dense.prefill_batch([[5, 6, 7]]), 8, replay=False)[2].fresh_bounds is None


def test_fresh_and_absorbed_agree_over_an_fp8_latent_cache(deepseek, fresh_from):
    """With an FP8 KV cache the expansion reads the latent rows back as the cache holds them, so the expanded and
    absorbed forms attend over the same rounded numbers (float32: summation order apart); attending over the
    unrounded rows instead is an FP8 step away."""

    from pcg_core import CaptureConfig, Engine, EngineConfig
    from pcg_core.engine.kv_scales import calibrate_kv_scales, set_kv_scales

    model = copy.deepcopy(deepseek.model)  # the scales go on the model
    set_kv_scales(model, calibrate_kv_scales(Engine(model, EngineConfig(kv_slots=256)), PROMPTS, 3))

    def run():
        cfg = EngineConfig(dtype="float32", kv_cache="fp8_e4m3", capture=CaptureConfig(backend="disabled", max_tokens=64))
        return [o.prompt_logprobs + o.output_logprobs for o in Engine(model, cfg).generate(PROMPTS, 3, prompt_logprobs=True)]

    fresh_from(10_000)
    absorbed = run()
    fresh_from(1)
    expanded = run()
    assert max(_gap(a, b) for a, b in zip(absorbed, expanded)) < 1e-4
    fresh_from(10_000)
    model.pcg_kv_scales = None
    assert max(_gap(a, b) for a, b in zip(absorbed, _auto(model))) > 1e-3  # the FP8 cache's rounding is visible


def _auto(model):
    from pcg_core import CaptureConfig, Engine, EngineConfig

    cfg = EngineConfig(dtype="float32", capture=CaptureConfig(backend="disabled", max_tokens=64))
    return [o.prompt_logprobs + o.output_logprobs for o in Engine(model, cfg).generate(PROMPTS, 3, prompt_logprobs=True)]


def _masked_sdpa(rule):
    """fresh._sdpa with another mask rule(seq, pos) → [T, T] (the CPU path; the CUDA one is FlashAttention's)."""

    def sdpa(q, k, v, md, scale):
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=rule(md.seq_ids, md.positions)[None, None], scale=scale)
        return o[0].transpose(0, 1)

    return sdpa


def _dense_one(causal: bool):
    """fresh._one with or without its causal mask."""

    def one(q, k, v, scale):
        o = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                             v.transpose(0, 1)[None], is_causal=causal, scale=scale)
        return o[0].transpose(0, 1)

    return one


@pytest.mark.parametrize("fault", ["sequences see each other", "one position ahead", "rope keys dropped",
                                   "latent not cached", "one sequence sees ahead", "the dense path for several"])
def test_planted_fresh_path_faults_are_caught(deepseek, fault, fresh_from, monkeypatch):
    """What a wrong expanded prefill gets wrong: each moves some sequence's logprobs (prompt, or the decode steps
    that read what the prefill cached) off transformers' forward."""
    fresh_from(1)
    prompts = PROMPTS
    if fault == "one sequence sees ahead":  # the one-sequence path without its causal mask
        prompts = PROMPTS[:1]
        monkeypatch.setattr(fresh, "_one", _dense_one(causal=False))
    elif fault == "the dense path for several":  # the engine takes "one" for a packed batch: sequences see each other
        real = engine_module.Engine.fresh_path
        monkeypatch.setattr(engine_module.Engine, "fresh_path", lambda *a: real(*a) and "one")
    elif fault == "sequences see each other":
        monkeypatch.setattr(fresh, "_sdpa", _masked_sdpa(lambda s, p: torch.ones(len(s), len(s), dtype=torch.bool).tril()))
    elif fault == "one position ahead":
        monkeypatch.setattr(fresh, "_sdpa", _masked_sdpa(lambda s, p: (s[:, None] == s[None, :]) & (p[None, :] <= p[:, None] + 1)))
    elif fault == "rope keys dropped":
        real_cat = torch.cat

        def cat(ts, dim=0, **kw):
            if len(ts) == 2 and ts[1].dim() == 3 and ts[1].stride(1) == 0:  # the shared rope part, broadcast to the heads
                ts = (ts[0], torch.zeros_like(ts[1]))
            return real_cat(ts, dim=dim, **kw)

        monkeypatch.setattr(mla_op.torch, "cat", cat)
    else:
        monkeypatch.setattr(mla_op, "write_kv", lambda *a: None)
    outs = make_engine(deepseek.model, "disabled").generate(prompts, max_new_tokens=3, prompt_logprobs=True)
    gaps = []
    for prompt, o in zip(prompts, outs):
        # transformers over prompt + outputs: its prompt logprobs, then the decode steps' own
        want = transformers_prompt_logprobs(deepseek, prompt + o.output_ids[:-1])
        gaps.append(max(_gap(o.prompt_logprobs, want), _gap(o.output_logprobs[:-1], want[len(prompt) - 1 :])))
    assert max(gaps) > 1e-3, (fault, gaps)


@pytest.mark.parametrize("prompts", [PROMPTS, PROMPTS[:1]])
def test_without_a_fault_the_same_check_holds(deepseek, prompts, fresh_from):
    """The planted faults' check on the unplanted paths (packed, one): every sequence within float32 summation order."""
    fresh_from(1)
    outs = make_engine(deepseek.model, "disabled").generate(prompts, max_new_tokens=3, prompt_logprobs=True)
    for prompt, o in zip(prompts, outs):
        want = transformers_prompt_logprobs(deepseek, prompt + o.output_ids[:-1])
        assert max(_gap(o.prompt_logprobs, want), _gap(o.output_logprobs[:-1], want[len(prompt) - 1 :])) < 1e-4


# On the GPU: each fresh kernel against the SDPA one, and graphs = eager bitwise with both variants ---------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("t", [128, 300])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("heads,qk,v", [(4, 24, 16), (16, 192, 128)])  # tiny; DeepSeek-V3's widths
@pytest.mark.parametrize("kernel", ["flash", "efficient", "one"])
def test_fresh_attention_kernels_match_the_masked_sdpa_and_replay_bitwise(t, dtype, heads, qk, v, kernel):
    """Each CUDA kernel of the fresh path (FRESH_KERNEL's over packed sequences of odd lengths; the dense one over a
    single sequence, fresh_path "one") against the masked SDPA in float32, with padding after; recorded in a CUDA
    graph, its replay bitwise equal to the eager call."""
    if kernel == "flash":
        pytest.importorskip("torch.nn.attention.varlen")
    from pcg_core.attention.metadata import AttentionMetadata

    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(t)
    lengths = [t - 9] if kernel == "one" else [t // 2 - 9, 1, t // 3, 5]  # the rest padding
    n = sum(lengths)
    seq = torch.cat([torch.full((k,), i, dtype=torch.int32) for i, k in enumerate(lengths)] + [torch.full((t - n,), -2, dtype=torch.int32)]).cuda()
    pos = torch.cat([torch.arange(k) for k in lengths] + [torch.zeros(t - n, dtype=torch.int64)]).cuda()
    md = AttentionMetadata(t, n, torch.zeros(t, dtype=torch.int64, device="cuda"), pos, seq, seq >= 0,
                           fresh_path="one" if kernel == "one" else "packed")
    kernel = None if kernel == "one" else kernel
    # scales that vary by head and by token, with outlier tokens (as real queries and keys have): uniform inputs give
    # flat attention, where a wrong causal edge or a sequence leak moves the output least
    head_scale = torch.logspace(-0.5, 0.5, heads, device="cuda")[:, None]
    token_scale = torch.rand(t, 1, 1, device="cuda", generator=g) + 0.5
    token_scale[torch.randperm(t, device="cuda", generator=g)[: max(1, t // 50)]] *= 6  # outlier keys and values
    q = (torch.randn(t, heads, qk, device="cuda", generator=g) * head_scale).to(dt)
    k = (torch.randn(t, heads, qk, device="cuda", generator=g) * head_scale * token_scale).to(dt)
    val = (torch.randn(t, heads, v, device="cuda", generator=g) * token_scale).to(dt)
    got = fresh.fresh_attention(q, k, val, md, qk ** -0.5, kernel)[:n]
    ref = fresh._sdpa(q.float(), k.float(), val.float(), md, qk ** -0.5)[:n]
    assert got.shape == (n, heads, v)
    assert ((got.float() - ref).norm() / ref.norm()).item() < 1e-2
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fresh.fresh_attention(q, k, val, md, qk ** -0.5, kernel)  # warm-up off the default stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        recorded = fresh.fresh_attention(q, k, val, md, qk ** -0.5, kernel)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(recorded[:n], got)


def _transformers_hidden(own, prompts: list[list[int]]) -> torch.Tensor:
    """transformers' own forward (a transformers_twin) of each prompt alone: the final hidden states, packed back to
    back like the engine's rows."""
    device = next(own.parameters()).device
    with torch.no_grad():
        return torch.cat([own.model(input_ids=torch.tensor([p], device=device)).last_hidden_state[0] for p in prompts])


GPU_MODELS = {"deepseek-v3": "deepseek-ai__DeepSeek-V3.json", "llama": "meta-llama__Llama-3.1-8B-Instruct.json"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kv_cache", ["auto", "fp8_e4m3"])
@pytest.mark.parametrize("backend", ["piecewise", "breakable", "full"])
@pytest.mark.parametrize("model,attention", [("deepseek-v3", "sdpa"), ("deepseek-v3", "flex"), ("llama", "varlen")])
def test_graphs_keep_a_variant_per_path_and_replay_bitwise_equal_to_eager(configs, model, attention, backend, kv_cache,
                                                                          fresh_from):
    """From fresh_min up, piecewise and full record the op once per path (breakable chooses in its hole); a fresh
    prefill, a small one, a prefill over a cached prefix and a decode step each replay bitwise what eager computes at
    the same padding; the fresh path is as near float32 as the cache-reading one (MLA absorbed, varlen's gather)
    or transformers' own forward."""

    from pcg_core import CaptureConfig, Engine, EngineConfig
    from pcg_core.engine.inputs import PackedBatch
    from pcg_core.engine.kv_scales import calibrate_kv_scales, set_kv_scales

    lm = load_model(json.loads((configs / GPU_MODELS[model]).read_text()), tiny=True, dtype=torch.bfloat16, device="cuda")
    net = copy.deepcopy(lm.model)
    if kv_cache != "auto":
        set_kv_scales(net, calibrate_kv_scales(Engine(net, EngineConfig(device="cuda", dtype="bfloat16", kv_slots=1024)),
                                               PROMPTS, 3))

    def build(b):
        return Engine(net, EngineConfig(device="cuda", dtype="bfloat16", attention=attention, kv_cache=kv_cache,
                                        kv_slots=2048, capture=CaptureConfig(backend=b, max_tokens=256)))

    fresh_from(10**6)
    cache_reading = build("disabled")
    reference = Engine(copy.deepcopy(net).float(), EngineConfig(device="cuda", dtype="float32", attention="sdpa",
                                                                kv_cache=kv_cache, kv_slots=2048,
                                                                capture=CaptureConfig(backend="disabled", max_tokens=256)))
    twin = transformers_twin(lm, "sdpa")  # built once: each fresh batch's sequences run through it alone
    fresh_from(128)
    engine = build(backend)
    ladder = engine.config.capture.ladder
    paths = ("packed", "one") if model == "deepseek-v3" else ("packed",)  # MLA's op tells one sequence from several
    if backend != "breakable":
        assert {(b, p) for b in ladder if b >= 128 for p in paths} <= set(engine.backend.entries)
    assert all(not isinstance(k, tuple) or k[0] >= 128 for k in engine.backend.entries)
    for lengths, start in (([100, 37, 20], 0), ([3, 7], 0), ([150], 0), ([64, 90], 40), ([1] * 9, 60)):
        outs = []
        for e in (engine, cache_reading, reference):
            e.cache.reset()
            b = PackedBatch([], [], [], [])
            for i, n in enumerate(lengths):
                slots = e.cache.allocate(i, start + n)
                b.token_ids += prompts_of([n], lm.config.vocab_size, seed=i)[0]
                b.positions += list(range(start, start + n))
                b.seq_ids += [i] * n
                b.slots += slots[start:]
            outs.append(b)
        b = outs[0]
        bucket = engine.bucket_for(len(b))
        path = "" if start or bucket < 128 else paths[-1] if len(lengths) == 1 else "packed"
        assert engine.fresh_path(torch.tensor(b.seq_ids), torch.tensor(b.positions), bucket) == path
        replay = engine.forward(b).clone()
        eager = engine.forward(b, eager=True).clone()
        assert torch.equal(replay, eager), (lengths, start, (replay.float() - eager.float()).abs().max())
        # both paths held to float32 (the cache-reading one): bf16 moves a tiny MoE's hidden states by several percent
        # on either path, so the fresh one may be no further from it than twice the cache-reading one's distance or
        # than transformers' own bf16 forward of each sequence (the model as written: DeepSeek-V3's expanded form
        # lies 4.2% from float32 on the H100 where the absorbed one lies 1.4%; pcg's fresh path lies where it does,
        # as on the CPU), plus 1%
        want = reference.forward(outs[2], pad_to=bucket, eager=True)
        other = cache_reading.forward(outs[1], pad_to=bucket, eager=True).float()
        err, err_other = (((x.float() - want).norm() / want.norm()).item() for x in (eager, other))
        own = _transformers_hidden(twin, [prompts_of([n], lm.config.vocab_size, seed=i)[0] for i, n in enumerate(lengths)]) \
            if start == 0 else other
        err_own = ((own.float() - want).norm() / want.norm()).item()
        assert err <= max(2 * err_other, err_own) + 1e-2, (lengths, start, err, err_other, err_own)


def _stand_in_varlen(calls: list):
    """torch's varlen_attn as plain math on the CPU: per pair of cu_seqlens entries, that sequence's causal attention
    (bottom-right aligned, as FlashAttention's), rows in no sequence left as garbage (NaN: the caller zeroes them).
    Records each call's sequence count and max query length: the kernel's grid."""
    from pcg_core.attention.reference import attention_math

    def varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, scale=None, window_size=None, is_causal=None, enable_gqa=None,
                    **_):
        calls.append((len(cu_q) - 1, max_q))
        out = torch.full((q.shape[0], q.shape[1], v.shape[-1]), float("nan"), dtype=q.dtype)
        if q.shape[1] != k.shape[1]:
            k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
        for a, b, c, d in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(), cu_k[1:].tolist()):
            if b > a:
                mask = torch.ones(b - a, d - c, dtype=torch.bool).tril(d - c - (b - a))
                out[a:b] = attention_math(q[a:b], k[c:d], v[c:d], mask, scale, 0.0, None, None)
        return out

    return types.SimpleNamespace(varlen_attn=varlen_attn, AuxRequest=None)


def test_varlen_fresh_forward_bounds_its_sequences_and_computes_what_the_gather_does(monkeypatch, configs, fresh_from):
    """varlen's fresh path hands FlashAttention cu_seqlens of FRESH_PATH_MAX_SEQS sequences, not one per token of the
    bucket (its grid is query blocks × sequences × heads: a bucket's worth of empty sequences made a 2048-token prefill
    take 1.65× sdpa on the H100, 2026-12-08), and computes what the gather path computes; a stand-in kernel on the CPU
    (plain math per cu_seqlens pair) shows both."""
    from pcg_core import CaptureConfig, Engine, EngineConfig
    from pcg_core.attention import varlen
    from pcg_core.attention.fresh import FRESH_PATH_MAX_SEQS

    calls: list = []
    monkeypatch.setattr(varlen, "_varlen", _stand_in_varlen(calls))
    monkeypatch.setattr(varlen, "_PARAMS", {"window_size", "enable_gqa"})
    monkeypatch.setattr(varlen.VarlenBackend, "devices", ("cpu",))
    monkeypatch.setattr(varlen.VarlenBackend, "dtypes", ("float32",))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # a CPU build has no CUDA streams
    lm = load_model(json.loads((configs / GPU_MODELS["llama"]).read_text()), tiny=True)

    def logprobs(attention: str, fresh: int):
        fresh_from(fresh)
        engine = Engine(lm.model, EngineConfig(attention=attention, kv_slots=1024,
                                               capture=CaptureConfig(backend="disabled", max_tokens=256)))
        calls.clear()
        return _prompt_logprobs(engine, PROMPTS)

    want = logprobs("sdpa", 10**6)
    gathered = logprobs("varlen", 10**6)
    assert calls and all(seqs == rows for seqs, rows in calls)  # the gather path: one cu entry per row
    got = logprobs("varlen", 1)
    layers = lm.config.num_hidden_layers
    prefill = calls[:layers]
    assert all(seqs == FRESH_PATH_MAX_SEQS for seqs, _ in prefill), prefill  # bounded, whatever the bucket
    assert all(seqs == rows for seqs, rows in calls[layers:])  # decode steps read the cache: the gather path
    for a, b, c in zip(want, gathered, got):
        assert _gap(a, b) < 1e-4 and b == c  # the fresh path reads the same keys in the same order: exactly
