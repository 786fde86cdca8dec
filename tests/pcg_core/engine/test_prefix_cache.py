"""The prefix cache (engine/prefix_cache.py) and shared KV pages (KVCache.allocate(shared=)): what a later request
reuses, and that a sequence started from a cached prefix computes what the same prompt computes whole — on every
attention backend that runs here, MLA's latent cache, sliding windows, an FP8 KV cache and every graph backend."""

from __future__ import annotations

import pytest
import torch
from pcg_helpers import config_path, tiny_model

from pcg_core import CaptureConfig, EngineConfig
from pcg_core.attention.kv_cache import KVCache, KVCacheFull
from pcg_core.engine import Engine, PrefixCache
from pcg_core.engine.kv_scales import calibrate_kv_scales, set_kv_scales
from pcg_core.model import load_model

CPU = torch.device("cpu")


def _cache(qwen3, slots: int = 64, page: int = 4) -> KVCache:
    return KVCache(qwen3.config, slots, torch.float32, CPU, page_size=page)


@pytest.fixture(scope="module")
def qwen3():
    return tiny_model("qwen3")


def _written(cache: KVCache, seq: int, tokens: list[int], pc: PrefixCache) -> None:
    """Sequence `seq` allocated for `tokens` and finished: its pages into `pc`."""
    cache.allocate(seq, len(tokens))
    pc.insert(tokens, cache.block_tables[seq])


def test_a_prompt_shares_whole_pages_and_copies_the_page_its_prefix_ends_inside(qwen3):
    cache = _cache(qwen3)
    pc = PrefixCache(cache)
    a = list(range(100, 114))  # 14 tokens: pages of 4, 4, 4 and a leaf of 2
    _written(cache, 0, a, pc)
    pages = cache.block_tables[0]
    cache.release_all()
    assert pc.pages == sorted(pages) and cache.free_pages == 16 - 4  # the cache holds them past the sequence
    m = pc.match(a[:8] + [7, 7])  # two whole pages, then another token
    assert (m.shared, m.copy_page, m.copied, m.length) == (tuple(pages[:2]), None, 0, 8)
    m = pc.match(a[:10] + [7])  # two pages and two tokens of the third
    assert (m.shared, m.copy_page, m.copied) == (tuple(pages[:2]), pages[2], 2)
    m = pc.match(a)  # all of it cached: its last token is computed all the same
    assert (m.shared, m.copy_page, m.copied, m.length) == (tuple(pages[:3]), pages[3], 1, 13)
    m = pc.match(a[:3] + [1])  # inside the first page only
    assert (m.shared, m.copy_page, m.copied) == ((), pages[0], 3)
    assert pc.match([5, 6, 7]).length == 0 and pc.match(a[:1]).length == 0  # nothing, or nothing left to compute


def test_shared_pages_join_the_block_table_read_only_and_are_freed_last(qwen3):
    cache = _cache(qwen3)
    pc = PrefixCache(cache)
    a = list(range(12))
    _written(cache, 0, a, pc)
    shared = cache.block_tables[0][:2]
    cache.release_all()
    slots = cache.allocate(1, 11, shared=shared)
    assert cache.block_tables[1][:2] == shared and slots[:8] == [p * 4 + o for p in shared for o in range(4)]
    own = cache.block_tables[1][2:]
    assert not set(own) & set(shared) and len(own) == 1
    assert cache.seq_pages[1].nonzero().flatten().tolist() == sorted(shared + own)
    assert int(cache.page_pos[own[0]]) == 8 and cache.slot_pos[own[0] * 4 : own[0] * 4 + 4].tolist() == [8, 9, 10, 11]
    assert cache.readable(torch.tensor([1, -2], dtype=torch.int32))[1].sum() == 0  # padding reads nothing
    pc.clear()
    assert cache.free_pages == 16 - 3  # the shared pages stay while sequence 1 reads them
    cache.release(1)
    assert cache.free_pages == 16
    with pytest.raises(ValueError, match="must be held"):
        cache.allocate(2, 9, shared=shared)  # freed pages cannot be shared


def test_least_recently_used_leaves_are_evicted_for_new_prompts_and_a_reset_empties_the_cache(qwen3):
    cache = _cache(qwen3, slots=32)  # 8 pages of 4
    pc = PrefixCache(cache)
    for s, base in enumerate((100, 200)):
        _written(cache, s, list(range(base, base + 8)), pc)
    cache.release_all()
    pc.match(list(range(100, 106)))  # the first prefix used again: the second is the older
    assert cache.free_pages == 4 and pc.evict(2) == 2
    assert pc.match(list(range(200, 206))).length == 0 and pc.match(list(range(100, 106))).length == 5
    cache.reset()
    assert pc.pages == [] and pc.match(list(range(100, 106))).length == 0


def _shared_prefix_rounds(engine: Engine):
    """The prompt suite's shared-prefix case run on `engine` (8 prompts in rounds, 2 new tokens each), after checking
    how much of each prompt came from the cache: whole pages, half a page, a page boundary inside the prefix, none."""
    from harness.cell.prompts import run_case, shared_prefix_case

    g = torch.Generator().manual_seed(1)
    case = shared_prefix_case(engine.cache.page_size, list(engine.config.capture.ladder),
                              lambda n: tuple(torch.randint(0, 1000, (n,), generator=g).tolist()), 8)
    outs = run_case(engine, case, 2)
    ps = engine.cache.page_size
    assert [o.cached_tokens for o in outs] == [0, 0, 2 * ps, 2 * ps + ps // 2, 0, ps - 3, 2 * ps + 7, 3 * ps + 4]
    return case, outs


@pytest.mark.parametrize("arch,attention,graph", [
    ("qwen3", "sdpa", "disabled"), ("qwen3", "flex", "disabled"), ("qwen3", "sdpa", "piecewise"),
    ("qwen3", "flex", "breakable"), ("qwen3", "sdpa", "full"), ("gpt-oss", "sdpa", "disabled"),
    ("gpt-oss", "flex", "piecewise"), ("deepseek-v3", "sdpa", "disabled"), ("deepseek-v3", "flex", "full"),
])
def test_a_cached_prefix_computes_what_the_whole_prompt_computes(arch, attention, graph):
    """Round 2 and 3 prompts start from round 1's (and round 2's) pages; each sequence matches the same prompt run
    alone from position 0, in float32, to summation-order noise; and the graph matches eager bit for bit."""
    from harness.cell.prompts import run_case

    lm = (load_model(config_path("qwen3").parent / "deepseek-ai__DeepSeek-V3.json", tiny=True, dtype=torch.float32,
                     device="cpu", seed=0) if arch == "deepseek-v3" else tiny_model(arch))
    cfg = EngineConfig(attention=attention, capture=CaptureConfig(backend=graph, max_tokens=64), kv_slots=4096)
    case, outs = _shared_prefix_rounds(Engine(lm.model, cfg))
    if graph != "disabled":
        eager = run_case(Engine(lm.model, EngineConfig(attention=attention, capture=CaptureConfig(backend="disabled",
                                                       max_tokens=64), kv_slots=4096)), case, 2)
        assert [o.output_ids for o in eager] == [o.output_ids for o in outs]
    alone = Engine(lm.model, EngineConfig(attention=attention, capture=CaptureConfig(backend="disabled", max_tokens=64),
                                          kv_slots=4096))
    for o, p, n in zip(outs, case.prompts, case.new_tokens):
        whole = alone.generate([list(p)], [n], 2, prompt_logprobs=True)[0]
        assert o.output_ids == whole.output_ids
        k = o.cached_tokens
        got, want = o.prompt_logprobs + o.output_logprobs, whole.prompt_logprobs[k:] + whole.output_logprobs
        assert len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want)) < 1e-4


def test_an_fp8_kv_cache_copies_codes_bit_for_bit():
    lm = tiny_model("qwen3")  # its own: the scales stay on the model
    cfg = EngineConfig(capture=CaptureConfig(backend="disabled", max_tokens=64), kv_slots=512)
    set_kv_scales(lm.model, calibrate_kv_scales(Engine(lm.model, cfg), [list(range(40))], [2]))
    engine = Engine(lm.model, EngineConfig(capture=CaptureConfig(backend="disabled", max_tokens=64), kv_slots=512,
                                           kv_cache="fp8_e4m3"))
    pc = PrefixCache(engine.cache)
    a = list(range(30, 70))
    engine.generate([a], 2, prefix_cache=pc)
    (b,) = engine.generate([a[:21] + [5, 6, 7]], 2, prefix_cache=pc, prompt_logprobs=True)
    assert b.cached_tokens == 21  # a page of 16 shared, 5 positions copied
    src, dst = pc.match(a[:21] + [1]).copy_page, engine.cache.block_tables[0][1]
    layer = engine.cache.attention_layers[0]
    for t in (engine.cache.k[layer], engine.cache.v[layer]):
        raw = t.view(torch.uint8)
        assert torch.equal(raw[src * 16 : src * 16 + 5], raw[dst * 16 : dst * 16 + 5])
    whole = engine.generate([a[:21] + [5, 6, 7]], 2, prompt_logprobs=True)[0]
    assert max(abs(x - y) for x, y in zip(b.prompt_logprobs, whole.prompt_logprobs[21:])) < 1e-4


def test_what_a_prefix_cache_cannot_serve_is_refused_by_name(qwen3):
    engine = Engine(qwen3.model, EngineConfig(capture=CaptureConfig(backend="disabled", max_tokens=64), kv_slots=256))
    other = Engine(qwen3.model, EngineConfig(capture=CaptureConfig(backend="disabled", max_tokens=64), kv_slots=256))
    with pytest.raises(ValueError, match="another engine's KV cache"):
        engine.generate([[1, 2, 3]], 1, prefix_cache=PrefixCache(other.cache))
    nxt = load_model(config_path("qwen3").parent / "Qwen__Qwen3-Next-80B-A3B-Instruct.json", tiny=True, seed=0)
    hybrid = Engine(nxt.model, EngineConfig(capture=CaptureConfig(backend="disabled", max_tokens=64), kv_slots=256))
    with pytest.raises(ValueError, match="recurrent state"):
        hybrid.generate([[1, 2, 3]], 1, prefix_cache=PrefixCache(hybrid.cache))


def test_a_full_cache_evicts_cached_prefixes_before_it_refuses(qwen3):
    engine = Engine(qwen3.model, EngineConfig(capture=CaptureConfig(backend="disabled", max_tokens=64), kv_slots=64))
    pc = PrefixCache(engine.cache)  # 4 pages of 16
    engine.generate([list(range(100, 140))], 1, prefix_cache=pc)  # 3 pages kept
    assert len(pc.pages) == 3
    engine.generate([list(range(300, 340))], 1, prefix_cache=pc)  # needs 3: two of the first prompt's go
    assert pc.match(list(range(300, 340))).length == 39
    with pytest.raises(KVCacheFull):
        engine.generate([list(range(500, 600))], 1, prefix_cache=pc)


def test_flex_mask_mod_and_block_mask_read_shared_pages_as_the_block_tables_say(qwen3):
    """The CUDA kernel's mask_mod (the CPU path never calls it) evaluated over every (query, slot): visible exactly
    where the slot is in a page of the query's block table and not in its future; the block mask lists those pages."""
    from pcg_core.attention.flex import FlexBackend
    from pcg_core.engine.inputs import InputBuffers, PackedBatch

    cache = KVCache(qwen3.config, 8 * 4, torch.float32, CPU, page_size=4)
    cache.reset(page_order=[5, 2, 7, 0, 1, 3, 4, 6])
    cache.allocate(0, 10)  # pages 5, 2, 7
    cache.hold(cache.block_tables[0][0]), cache.hold(cache.block_tables[0][1])
    shared = cache.block_tables[0][:2]
    cache.allocate(1, 11, shared=shared)  # reads pages 5 and 2, writes page 0
    batch = PackedBatch([1] * 6, [8, 9, 8, 9, 10, 3], [0, 0, 1, 1, 1, 1], [])
    batch.slots = [cache.block_tables[s][p // 4] * 4 + p % 4 for s, p in zip(batch.seq_ids, batch.positions)]
    md = InputBuffers(8, cache, CPU).fill(batch, 8)[2]
    flex = FlexBackend(cache, 8)
    flex.begin_forward(md)
    bm = flex.block_mask(md, 0)
    q = torch.arange(8)[:, None]
    kv = torch.arange(cache.num_slots)[None, :]
    got = bm.mask_mod(torch.zeros(()), torch.zeros(()), q, kv)
    want = torch.zeros(8, cache.num_slots, dtype=torch.bool)
    for r, (s, p) in enumerate(zip(batch.seq_ids, batch.positions)):
        for page in cache.block_tables[s]:
            for o in range(4):
                want[r, page * 4 + o] = int(cache.slot_pos[page * 4 + o]) <= p
    assert torch.equal(got, want)
    listed = bm.to_dense()[0, 0, 0].bool()  # one query block: the pages any of its rows sees
    assert torch.equal(listed, want.view(8, 8, 4).any(-1).any(0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("attention", ["sdpa", "flex", "varlen"])
@pytest.mark.parametrize("graph", ["piecewise", "full"])
def test_gpu_a_cached_prefix_computes_what_the_whole_prompt_computes(attention, graph):
    """The shared-prefix rounds on CUDA, at Qwen3-0.6B's widths (4 layers, bf16), under graphs: each sequence's prompt
    logprobs against the same prompt computed whole, eagerly, to the judge's bf16 bound."""
    lm = load_model(config_path("qwen3"), tiny=False, layers=4, dtype=torch.bfloat16, device="cuda", seed=0)
    cfg = EngineConfig(device="cuda", dtype="bfloat16", attention=attention,
                       capture=CaptureConfig(backend=graph, max_tokens=256), kv_slots=8192)
    case, outs = _shared_prefix_rounds(Engine(lm.model, cfg))
    alone = Engine(lm.model, EngineConfig(device="cuda", dtype="bfloat16", attention=attention,
                                          capture=CaptureConfig(backend="disabled", max_tokens=256), kv_slots=8192))
    for o, p, n in zip(outs, case.prompts, case.new_tokens):
        whole = alone.generate([list(p)], [n], 2, prompt_logprobs=True)[0]
        k = o.cached_tokens
        # the positions it computed: its prompt past the cached prefix, and the first output token (A run again is
        # all cached but its last token: no prompt logprob of its own, H200 2026-12-06)
        got, want = [*o.prompt_logprobs, o.output_logprobs[0]], [*whole.prompt_logprobs[k:], whole.output_logprobs[0]]
        assert len(got) == len(want) == len(p) - k, (k, len(got), len(want))
        diff = max(abs(a - b) for a, b in zip(got, want))
        assert diff < 0.1, (attention, graph, k, diff)  # the judge's bf16 logprob bound


def test_compiled_flex_reads_shared_pages_through_its_block_mask_and_mask_mod(qwen3):
    """What the CUDA path runs — torch.compile(flex_attention) with the backend's block mask and mask_mod — compiled by
    inductor for the CPU over a batch whose sequence reads another's cached pages: equal to plain math over the block
    tables (a mask_mod that cannot be compiled, or reads the wrong pages, fails here before a GPU sees it)."""
    from torch.nn.attention.flex_attention import flex_attention

    from pcg_core.attention.flex import FlexBackend
    from pcg_core.attention.reference import attention_math, causal
    from pcg_core.engine.inputs import InputBuffers, PackedBatch

    cache = KVCache(qwen3.config, 8 * 128, torch.float32, CPU, page_size=128)
    cache.allocate(0, 300)
    shared = cache.block_tables[0][:2]
    for page in shared:
        cache.hold(page)
    cache.release(0)
    cache.allocate(1, 300, shared=shared)  # positions 0-255 in the cached pages, 256 on in its own
    cache.allocate(2, 100)
    pos, seqs = list(range(256, 280)) + list(range(40)), [1] * 24 + [2] * 40
    slots = [cache.block_tables[s][p // 128] * 128 + p % 128 for s, p in zip(seqs, pos)]
    md = InputBuffers(128, cache, CPU).fill(PackedBatch([1] * 64, pos, seqs, slots), 64)[2]
    flex = FlexBackend(cache, 128)
    flex.begin_forward(md)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, n, 64, generator=g) for n in (64, cache.num_slots, cache.num_slots))
    out = torch.compile(flex_attention, dynamic=False)(q, k, v, block_mask=flex.block_mask(md, 0))
    mask = causal(md.positions[:64], cache.slot_pos[: cache.num_slots]) & cache.readable(md.seq_ids[:64])
    assert mask[:24, shared[0] * 128].all()  # the cached prefix is visible to sequence 1
    ref = attention_math(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), mask, 64**-0.5)
    assert torch.allclose(out[0].transpose(0, 1), ref, atol=1e-5, rtol=1e-5)
