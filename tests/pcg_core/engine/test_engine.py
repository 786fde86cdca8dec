"""The engine: KV cache, input buffers and padding, the sdpa attention backend, generate(), and agreement of
the eager engine with transformers' own forward (the outside reference)."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from pcg_helpers import (
    ARCH_NAMES,
    ARCHS,
    KV_SLOTS,
    MAX_TOKENS,
    changed_slots,
    compare_outputs,
    make_engine,
    padding_violations,
    prompts_of,
    snapshot_cache,
    tiny_model,
)

from pcg_core import CaptureConfig, ConfigError, EngineConfig
from pcg_core.attention.metadata import LayerParams
from pcg_core.attention.sdpa import SdpaBackend
from pcg_core.capture.full import FullBackend
from pcg_core.engine import Engine
from pcg_core.engine import engine as engine_mod
from pcg_core.engine.inputs import PAD_SEQ, PackedBatch
from pcg_core.attention.kv_cache import KVCache, KVCacheFull

CPU = torch.device("cpu")

# fp32 bound, used throughout: the engine and the reference differ only in summation order (packed vs
# unpacked GEMMs, attention over the whole masked cache vs over the sequence). fp32 rounding is ~6e-8
# relative; over two tiny layers and a 2048-way log_softmax that is ~1e-6 (measured: <= 2e-6), so 1e-4 is
# a wide margin that still catches any real error (a wrong position, mask or expert moves logprobs by >1e-2).
FP32_TOL = 1e-4


@pytest.fixture(scope="module")
def qwen3():
    return tiny_model("qwen3")


def _batch(prompts: list[list[int]], seq_slots: list[list[int]]) -> PackedBatch:
    b = PackedBatch([], [], [], [])
    for i, (p, slots) in enumerate(zip(prompts, seq_slots)):
        b.token_ids += p
        b.positions += list(range(len(p)))
        b.seq_ids += [i] * len(p)
        b.slots += slots[: len(p)]
    return b


# KV cache and input buffers -----------------------------------------------------------------------------


def test_kv_cache_layout_and_allocation(qwen3):
    cfg = qwen3.config
    cache = KVCache(cfg, 16, torch.float32, CPU)
    assert len(cache.k) == len(cache.v) == cfg.num_hidden_layers
    assert cache.k[0].shape == (17, cfg.num_key_value_heads, cfg.head_dim)  # slot-major, + the pad slot
    assert cache.pad_slot == 16 == cache.num_slots
    assert cache.nbytes == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 17 * cfg.head_dim * 4
    assert cache.allocate(0, 5) == [0, 1, 2, 3, 4]
    assert cache.allocate(7, 3) == [5, 6, 7]
    assert cache.slot_seq[:9].tolist() == [0] * 5 + [7] * 3 + [-1]
    assert cache.slot_pos[:8].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert int(cache.slot_seq[cache.pad_slot]) == -1
    with pytest.raises(KVCacheFull, match="kv_slots"):
        cache.allocate(8, 9)  # 8 + 9 > 16
    assert cache.allocate(8, 8) == list(range(8, 16))  # exactly full is fine
    k_ptr = cache.k[0].data_ptr()
    cache.reset()
    assert cache.k[0].data_ptr() == k_ptr  # captured graphs keep valid addresses
    assert (cache.slot_seq == -1).all() and cache.allocate(3, 16) == list(range(16))


def test_paged_kv_cache_block_tables(qwen3):
    """Pages of 4: a sequence owns whole pages, anywhere in the pool, in block-table order."""
    cache = KVCache(qwen3.config, 30, torch.float32, CPU, page_size=4)
    assert (cache.num_pages, cache.num_slots, cache.pad_slot) == (8, 32, 32)  # rounded up to whole pages
    cache.reset(page_order=[5, 2, 7, 0, 1, 3, 4, 6])
    assert cache.allocate(0, 6) == [20, 21, 22, 23, 8, 9]  # pages 5 then 2
    assert cache.allocate(1, 4) == [28, 29, 30, 31]
    assert cache.block_tables == {0: [5, 2], 1: [7]}
    assert cache.page_seq.tolist() == [-1, -1, 0, -1, -1, 0, -1, 1]
    assert cache.page_pos[[5, 2, 7]].tolist() == [0, 4, 0]
    assert cache.slot_seq[8:12].tolist() == [0] * 4 and cache.slot_pos[8:12].tolist() == [4, 5, 6, 7]  # the page's tail too
    with pytest.raises(KVCacheFull, match="pages of 4 slots.*kv_slots"):
        cache.allocate(2, 21)  # 6 pages, 5 left
    with pytest.raises(ValueError, match="already holds"):
        cache.allocate(1, 1)
    with pytest.raises(ValueError, match="permutation"):
        cache.reset(page_order=[0, 0, 1, 2, 3, 4, 5, 6])
    with pytest.raises(ConfigError, match="page_size"):
        KVCache(qwen3.config, 30, torch.float32, CPU, page_size=0)


def test_input_buffers_pad_rows_and_mask(qwen3):
    engine = make_engine(qwen3.model, "disabled", kv_slots=64)
    cache = engine.cache
    cache.reset()
    seq_slots = [cache.allocate(0, 6), cache.allocate(1, 4), cache.allocate(2, 5)]  # seq 2: allocated, not in batch
    batch = _batch([[11, 12, 13], [21, 22]], seq_slots[:2])
    ids, pos, md = engine.inputs.fill(batch, 8)
    sdpa = SdpaBackend(cache, 8)
    sdpa.begin_forward(md)
    n = len(batch)
    assert ids.tolist() == [11, 12, 13, 21, 22, 0, 0, 0]
    assert pos.tolist() == [0, 1, 2, 0, 1, 0, 0, 0]
    assert md.slot_mapping.tolist() == [*seq_slots[0][:3], *seq_slots[1][:2]] + [cache.pad_slot] * 3
    assert md.seq_ids.tolist() == [0, 0, 0, 1, 1] + [PAD_SEQ] * 3
    assert md.valid.tolist() == [True] * 5 + [False] * 3
    assert (md.num_tokens, md.num_actual) == (8, 5)
    assert md.host_seq_ids.tolist() == batch.seq_ids and md.host_positions.tolist() == batch.positions
    mask = sdpa.mask
    assert mask.shape == (8, cache.num_slots)
    assert not mask[n:].any()  # padding sees nothing
    expected = torch.zeros(n, cache.num_slots, dtype=torch.bool)
    for t, (s, p) in enumerate(zip(batch.seq_ids, batch.positions)):
        for slot in range(cache.num_slots):
            expected[t, slot] = int(cache.slot_seq[slot]) == s and int(cache.slot_pos[slot]) <= p
    assert torch.equal(mask[:n], expected)
    assert mask[2].nonzero().flatten().tolist() == seq_slots[0][:3]  # causal, own sequence only
    with pytest.raises(ValueError):
        engine.inputs.fill(batch, 4)
    # Above the buffers' capacity: fresh tensors, the static buffers are not overrun.
    big = engine.inputs.capacity + 3
    ids2, _, md2 = engine.inputs.fill(batch, big)
    sdpa.begin_forward(md2)
    assert ids2.shape == (big,) and sdpa.mask.shape == (big, cache.num_slots)


# sdpa attention backend: padding rows and KV writes ------------------------------------------------------


def _naive_attention(q, k, v, batch, scale, window):
    """Per-token reference: same sequence, key position ≤ query position (and inside the window)."""
    n_heads, n_kv = q.shape[1], k.shape[1]
    rep = n_heads // n_kv
    out = torch.zeros(len(batch), n_heads, q.shape[2], dtype=torch.float64)
    for t in range(len(batch)):
        keys = [
            j
            for j in range(len(batch))
            if batch.seq_ids[j] == batch.seq_ids[t]
            and batch.positions[j] <= batch.positions[t]
            and (window == 0 or batch.positions[t] - batch.positions[j] < window)
        ]
        for h in range(n_heads):
            kk = k[keys, h // rep].double()
            vv = v[keys, h // rep].double()
            w = torch.softmax(kk @ q[t, h].double() * scale, dim=0)
            out[t, h] = w @ vv
    return out


def _sdpa_setup(engine, fault_pad_slot: int | None = None):
    cache = engine.cache
    cache.reset()
    g = torch.Generator().manual_seed(0)
    for t in cache.k + cache.v:  # history in every slot, so an unexpected write is visible
        t.copy_(torch.randn(t.shape, generator=g))
    seq_slots = [cache.allocate(0, 9), cache.allocate(1, 6), cache.allocate(2, 5)]  # seq 2 is not in the batch
    batch = _batch([[5] * 5, [6] * 4], seq_slots[:2])  # 9 tokens
    bucket = engine.config.capture.bucket_for(len(batch))
    assert bucket == 12
    if fault_pad_slot is not None:
        cache.pad_slot = fault_pad_slot
    _, _, md = engine.inputs.fill(batch, bucket)
    engine.attn_backend.begin_forward(md)
    cfg = engine.model.config
    q = torch.randn(bucket, cfg.num_attention_heads, cfg.head_dim, generator=g)
    k = torch.randn(bucket, cfg.num_key_value_heads, cfg.head_dim, generator=g)
    v = torch.randn(bucket, cfg.num_key_value_heads, cfg.head_dim, generator=g)
    out = torch.full_like(q, float("nan"))
    return batch, md, q, k, v, out


@pytest.mark.parametrize("window", [0, 3])
def test_sdpa_padding_rows_are_zero_and_padding_writes_only_the_pad_slot(qwen3, window):
    engine = make_engine(qwen3.model, "disabled", kv_slots=64)
    batch, md, q, k, v, out = _sdpa_setup(engine)
    cache, n, layer = engine.cache, len(batch), 1
    before = snapshot_cache(cache)
    scale = q.shape[-1] ** -0.5
    engine.attn_backend.forward(q, k, v, out, LayerParams(layer, scale, window), md)

    assert padding_violations(out, n) == []
    assert torch.equal(out[n:], torch.zeros_like(out[n:]))  # exactly zero, not merely small
    torch.testing.assert_close(out[:n].double(), _naive_attention(q, k, v, batch, scale, window), atol=1e-5, rtol=1e-5)
    # Only this layer, only the batch's own slots and the pad slot were written.
    touched = changed_slots(before, cache)
    assert touched <= set(batch.slots) | {cache.pad_slot}, sorted(touched - set(batch.slots))
    assert set(batch.slots) <= touched
    num_layers = len(cache.k)
    for i, (old, new) in enumerate(zip(before, cache.k + cache.v)):  # k of every layer, then v
        if i % num_layers != layer:
            assert torch.equal(old, new), f"layer {i % num_layers} cache changed"
    # The written values are the batch's K and V.
    slots = torch.tensor(batch.slots)
    assert torch.equal(cache.k[layer][slots], k[:n])
    assert torch.equal(cache.v[layer][slots], v[:n])


def test_planted_padding_faults_are_caught_by_the_padding_checks(qwen3):
    engine = make_engine(qwen3.model, "disabled", kv_slots=64)

    # Fault 1: padding rows of the output are not zeroed (garbage 1e3 instead).
    class GarbagePadding(SdpaBackend):
        def forward(self, q, k, v, out, params, md):
            super().forward(q, k, v, out, params, md)
            out[md.num_actual :] = 1e3

    batch, md, q, k, v, out = _sdpa_setup(engine)
    garbage = GarbagePadding(engine.cache, MAX_TOKENS)
    garbage.begin_forward(md)
    garbage.forward(q, k, v, out, LayerParams(0, 0.25), md)
    assert padding_violations(out, len(batch)) == ["3 of 3 padding rows are not exactly zero"]

    # Fault 2: padding writes its KV into a real slot (the first slot of sequence 2, allocated but not in
    # this batch) instead of the pad slot.
    real_pad = engine.cache.pad_slot
    stray = int(torch.nonzero(engine.cache.slot_seq == 2)[0])
    batch, md, q, k, v, out = _sdpa_setup(engine, fault_pad_slot=stray)
    before = snapshot_cache(engine.cache)
    engine.attn_backend.forward(q, k, v, out, LayerParams(0, 0.25), md)
    touched = changed_slots(before, engine.cache)
    assert touched - (set(batch.slots) | {real_pad}) == {stray}


def test_engine_forward_padding_rows_zero_and_kv_writes_confined(qwen3, monkeypatch):
    """Through the whole engine (piecewise split graph on CPU): every attention call zeroes its padding rows
    and the forward writes KV only into the batch's slots and the pad slot."""
    engine = make_engine(qwen3.model, "piecewise", kv_slots=64)
    problems, calls = [], []
    original = engine.attn_backend.forward

    def checked(q, k, v, out, params, md):
        original(q, k, v, out, params, md)
        calls.append((params.layer, md.num_tokens, md.num_actual))
        problems.extend(padding_violations(out, md.num_actual))

    monkeypatch.setattr(engine.attn_backend, "forward", checked)
    cache = engine.cache
    cache.reset()
    g = torch.Generator().manual_seed(1)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g))
    bases = [cache.allocate(0, 10), cache.allocate(1, 10), cache.allocate(2, 10)]
    batch = _batch(prompts_of([7, 3], qwen3.config.vocab_size), bases[:2])  # 10 tokens → bucket 12
    before = snapshot_cache(cache)
    hidden = engine.forward(batch)
    assert hidden.shape == (10, qwen3.config.hidden_size)
    assert calls == [(layer, 12, 10) for layer in range(qwen3.config.num_hidden_layers)]
    assert problems == []
    touched = changed_slots(before, cache)
    assert touched <= set(batch.slots) | {cache.pad_slot}
    assert set(batch.slots) <= touched and cache.pad_slot in touched
    assert engine.stats.bucket_hits == {12: 1}
    # eager=True pads the same way but runs the model eagerly; on a CPU that is the same computation.
    eager = engine.forward(batch, eager=True)
    assert torch.equal(hidden, eager)
    assert engine.stats.bucket_hits == {12: 1}  # the eager reference is not counted


# generate() -----------------------------------------------------------------------------------------------


def test_generate_shapes_and_prompt_logprob_alignment(qwen3):
    engine = make_engine(qwen3.model, "disabled")
    prompts = prompts_of([1, 4, 9], qwen3.config.vocab_size)
    outs = engine.generate(prompts, max_new_tokens=3, top_k=7, prompt_logprobs=True)
    assert [o.prompt_ids for o in outs] == prompts
    for p, o in zip(prompts, outs):
        assert len(o.output_ids) == len(o.output_logprobs) == len(o.output_topk_ids) == 3
        assert len(o.prompt_logprobs) == len(p) - 1
        assert len(o.prompt_topk_ids) == len(o.prompt_topk_logprobs) == len(p)
        assert all(len(t) == 7 for t in o.output_topk_ids + o.prompt_topk_ids)
        for step in range(3):
            assert o.output_ids[step] == o.output_topk_ids[step][0]  # greedy
            assert o.output_logprobs[step] == pytest.approx(o.output_topk_logprobs[step][0], abs=1e-6)
            assert o.output_logprobs[step] <= 0
        for i, lp in enumerate(o.prompt_logprobs):
            # log p(prompt[i+1]) is at most the top-1 logprob at position i, and equals the top-k entry when present
            top_ids, top_lp = o.prompt_topk_ids[i], o.prompt_topk_logprobs[i]
            assert lp <= top_lp[0] + 1e-6
            if p[i + 1] in top_ids:
                assert lp == pytest.approx(top_lp[top_ids.index(p[i + 1])], abs=1e-6)
    # Without prompt logprobs: none are returned and the generated tokens and logprobs are the same.
    plain = engine.generate(prompts, max_new_tokens=3, top_k=7)
    assert all(o.prompt_logprobs is None and o.prompt_topk_ids is None for o in plain)
    assert compare_outputs([_strip_prompt(o) for o in outs], plain, FP32_TOL) == []


@pytest.mark.parametrize("bias", [False, True])
def test_half_precision_logits_are_the_float32_head_upcast_a_slice_at_a_time(qwen3, monkeypatch, bias):
    """bf16 hidden states meet the head in float32 whatever the slice size: slices that do not divide the vocabulary
    (the last one short), a bias sliced with them, and one slice holding the whole head give the same logits."""
    model = copy.deepcopy(qwen3.model).to(torch.bfloat16)
    engine = make_engine(model, "disabled", dtype="bfloat16")
    head = engine.lm_head
    if bias:
        head.bias = torch.nn.Parameter(torch.randn(head.out_features, dtype=torch.bfloat16))
    hidden = torch.randn(5, head.in_features, dtype=torch.bfloat16)
    whole = torch.nn.functional.linear(hidden.float(), head.weight.float(),
                                       None if head.bias is None else head.bias.float())
    vocab, width = head.weight.shape
    for rows in (1, 7, vocab - 1, vocab, 10 * vocab):
        monkeypatch.setattr(engine_mod, "HEAD_SLICE_BYTES", 4 * width * rows)
        got = engine.logits(hidden)
        assert got.dtype == torch.float32 and got.shape == (5, vocab)
        torch.testing.assert_close(got, whole, rtol=1e-6, atol=1e-6)


def _strip_prompt(o):
    o = copy.deepcopy(o)
    o.prompt_logprobs = o.prompt_topk_ids = o.prompt_topk_logprobs = None
    return o


def test_generate_is_repeatable_and_sequences_do_not_interact(qwen3):
    engine = make_engine(qwen3.model, "disabled")
    prompts = prompts_of([6, 2, 11], qwen3.config.vocab_size, seed=3)
    first = engine.generate(prompts, max_new_tokens=4, prompt_logprobs=True)
    again = engine.generate(prompts, max_new_tokens=4, prompt_logprobs=True)
    assert compare_outputs(first, again, 0.0) == []
    alone = [engine.generate([p], max_new_tokens=4, prompt_logprobs=True)[0] for p in prompts]
    assert compare_outputs(alone, first, FP32_TOL) == []


def test_generate_rejects_bad_arguments(qwen3):
    engine = make_engine(qwen3.model, "disabled", kv_slots=16)
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([])
    with pytest.raises(ValueError, match="at least one token"):
        engine.generate([[1, 2], []])
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate([[1, 2]], max_new_tokens=0)
    with pytest.raises(KVCacheFull, match="kv_slots"):
        engine.generate([[1] * 10, [2] * 5], max_new_tokens=2)  # 12 + 7 > 16


def test_bad_attention_backend_is_a_config_error(qwen3):
    with pytest.raises(ConfigError, match="'flash'.*sdpa") as e:
        Engine(qwen3.model, EngineConfig(attention="flash", kv_slots=KV_SLOTS))
    assert e.value.field == "attention"


def test_full_capture_refuses_an_uncapturable_attention_backend(qwen3):
    class Uncapturable(SdpaBackend):
        name = "host-sync"
        capturable = False
        why_not_capturable = "it reads sequence lengths on the host"

    with pytest.raises(ConfigError) as e:
        FullBackend(lambda i, p: i, CaptureConfig(backend="full", max_tokens=8), CPU, None,
                    attn_backend=Uncapturable(KVCache(qwen3.config, 16, torch.float32, CPU), 8))
    msg = str(e.value)
    assert e.value.field == "backend"
    assert "capture backend 'full'" in msg and "'host-sync'" in msg and "reads sequence lengths on the host" in msg
    assert "use backend 'piecewise' or 'breakable'" in msg.lower(), msg  # the fix, from the backends' declarations
    assert "--" not in msg  # config words, not CLI flags


# Outside reference: transformers' own forward, unpacked ------------------------------------------------------


ARCHS_BY_CLASS = {cls: moe for _, cls, moe in ARCHS.values()}


def _reference_model(lm):
    # A deep copy of the config: from_config(attn_implementation=...) writes into the config it is given, and
    # lm.config *is* lm.model.config, so passing it directly would switch the engine's model to sdpa too.
    cls = getattr(transformers, type(lm.model).__name__)
    kw = {"attn_implementation": "sdpa" if cls._supports_sdpa else "eager"}  # gpt-oss: eager only (its sinks)
    if ARCHS_BY_CLASS[type(lm.model).__name__]:
        kw["experts_implementation"] = "eager"  # transformers' own expert loop, not our dense-masked path
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(lm.config), **kw)
    ref.load_state_dict(lm.model.state_dict())
    return ref.eval()



@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_eager_engine_matches_transformers_forward(arch):
    lm = tiny_model(arch)
    ref = _reference_model(lm)
    assert lm.model.config._attn_implementation == "pcg"
    engine = make_engine(lm.model, "disabled")
    prompts = prompts_of([1, 7, 16, 23], lm.config.vocab_size, seed=11)  # one packed batch of 47 tokens
    new = 4
    outs = engine.generate(prompts, max_new_tokens=new, prompt_logprobs=True)
    assert any(t.abs().sum() > 0 for t in engine.cache.k)  # the pcg attention op really ran
    for i, (p, o) in enumerate(zip(prompts, outs)):
        # The whole sequence, unpacked, through transformers: rows len(p)-1 .. score the generated tokens,
        # so this checks prefill (packed) and the KV-cache decode steps against one plain forward.
        seq = p + o.output_ids[:-1]
        with torch.no_grad():
            lp = torch.log_softmax(ref(input_ids=torch.tensor([seq])).logits[0].float(), dim=-1)
        nxt = torch.tensor(seq[1:])
        want_prompt = lp[: len(p) - 1].gather(1, nxt[: len(p) - 1, None])[:, 0]
        got_prompt = torch.tensor(o.prompt_logprobs)
        assert got_prompt.shape == want_prompt.shape
        if len(p) > 1:
            diff = (got_prompt - want_prompt).abs().max().item()
            assert diff <= FP32_TOL, f"{arch} seq {i}: prompt logprobs differ from transformers by {diff:.3g}"
        gen_rows = lp[len(p) - 1 :]
        want_out = gen_rows.gather(1, torch.tensor(o.output_ids)[:, None])[:, 0]
        diff = (torch.tensor(o.output_logprobs) - want_out).abs().max().item()
        assert diff <= FP32_TOL, f"{arch} seq {i}: generated-token logprobs differ from transformers by {diff:.3g}"
        top2 = gen_rows.topk(2, dim=-1).values
        for step, tok in enumerate(o.output_ids):
            if top2[step, 0] - top2[step, 1] > 2 * FP32_TOL:  # not a tie: greedy must agree
                assert tok == int(gen_rows[step].argmax()), f"{arch} seq {i} step {step}"
