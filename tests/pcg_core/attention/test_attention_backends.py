"""Every attention backend against plain math, feature by feature, on a paged cache whose pages are scattered.

One batch mixes what the engine sends: a chunked prefill over KV already in the cache, a fresh prefill, a decode
row, and padding. Each backend (sdpa and flex on the CPU; all three on CUDA) must give the reference's output
on real rows, exactly zero on padding rows, and write KV only into the batch's slots and the pad slot. The
block-mask builder gets its own planted faults (a stale block mask, a lost page), which these checks must catch.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from pcg_helpers import compare_outputs, prompts_of, tiny_model

from pcg_core import CaptureConfig, ConfigError, Engine, EngineConfig
from pcg_core.attention import FEATURES, KVCache, LayerParams, get_attention_backend
from pcg_core.attention.flex import FlexBackend
from pcg_core.attention.reference import attention_math, length_temperature, visible
from pcg_core.capabilities import capabilities
from pcg_core.engine.schedule import decode_batch
from pcg_core.engine.inputs import InputBuffers, PackedBatch
from torch.nn.attention.flex_attention import BlockMask

GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEVICES = ["cpu", pytest.param("cuda", marks=GPU)]
BACKENDS = ["sdpa", "flex", "varlen"]
PAGE = 16
# (sequence, first position in the batch, last position + 1): a chunk after 13 cached tokens, a fresh prompt,
# a decode step at position 20, a 2-token chunk crossing a page edge.
RUNS = [(0, 13, 18), (1, 0, 7), (2, 20, 21), (3, 7, 9)]
BUCKET = 24  # 16 real rows + 8 padding


def _config(heads: int, kv_heads: int, dim: int = 16):
    return SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=dim,
                           hidden_size=heads * dim, num_hidden_layers=2)


def _setup(device: str, heads: int, kv_heads: int, dtype=torch.float32, page: int = PAGE, seed: int = 0):
    """A cache of 12 pages handed out in a scattered order, history in every slot, and one batch of RUNS."""
    g = torch.Generator().manual_seed(seed)
    cache = KVCache(_config(heads, kv_heads), 12 * page, dtype, torch.device(device), page_size=page)
    cache.reset(page_order=torch.randperm(cache.num_pages, generator=g).tolist())
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g).to(dtype))
    batch = PackedBatch([], [], [], [])
    for s, start, end in RUNS:
        slots = cache.allocate(s, end + 3)
        batch.token_ids += [1] * (end - start)
        batch.positions += list(range(start, end))
        batch.seq_ids += [s] * (end - start)
        batch.slots += slots[start:end]
    inputs = InputBuffers(BUCKET, cache, torch.device(device))
    _, _, md = inputs.fill(batch, BUCKET)
    q = torch.randn(BUCKET, heads, 16, generator=g).to(device, dtype)
    k = torch.randn(BUCKET, kv_heads, 16, generator=g).to(device, dtype)
    v = torch.randn(BUCKET, kv_heads, 16, generator=g).to(device, dtype)
    return cache, batch, md, q, k, v


def _page(name: str, device: str) -> int:
    """PAGE (pages end inside the batch's runs), except for flex on CUDA: its main kernel (prefills of 128+ rows, and
    head groups of 3 at any row count) tiles a page by up to 128 keys."""
    return 128 if name == "flex" and device == "cuda" else PAGE


def _reference(cache, batch, md, q, k, v, params: LayerParams) -> torch.Tensor:
    n, s = len(batch), cache.num_slots
    keys, values = cache.k[params.layer][:s].clone(), cache.v[params.layer][:s].clone()
    slots = torch.tensor(batch.slots, device=keys.device)
    keys[slots], values[slots] = k[:n], v[:n]
    mask = visible(md.seq_ids[:n], md.positions[:n], cache.slot_seq[:s], cache.slot_pos[:s], params.sliding_window)
    temp = length_temperature(md.positions[:n], params.temperature_len) if params.temperature_len else None
    return attention_math(q[:n].float(), keys.float(), values.float(), mask, params.scale, params.softcap, params.sinks,
                          temp)


def _supported(name: str, device: str) -> bool:
    return get_attention_backend(name).device_reason(device) is None


CASES = {
    "plain": dict(),
    "window": dict(sliding_window=4),
    "window1": dict(sliding_window=1),
    "softcap": dict(softcap=2.0),
    "sinks": dict(sinks=True),
    "all": dict(sliding_window=5, softcap=3.0, sinks=True),
    # Grok: soft-cap, then the length temperature past position 8 (RUNS reach 20; the decode row is at 20)
    "temperature": dict(softcap=3.0, temperature_len=8),
    "temperature_only": dict(temperature_len=4),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("case", list(CASES))
def test_backend_matches_plain_math(device, name, gqa, case):
    if not _supported(name, device):
        pytest.skip(get_attention_backend(name).device_reason(device))
    cls = get_attention_backend(name)
    heads, kv_heads = (4, 2) if gqa else (4, 4)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    cache, batch, md, q, k, v = _setup(device, heads, kv_heads, dtype, page=_page(name, device))
    opts = dict(CASES[case])
    if opts.pop("sinks", False):
        opts["sinks"] = torch.tensor([0.5, -1.0, 2.0, 0.0], device=device)
    params = LayerParams(1, 0.3, **opts)
    backend = cls(cache, BUCKET)
    unsupported = [f for f in params.features(gqa) if cls.features()[f] is not None]
    if unsupported:  # the refusal names one of them (the backend's own order, not necessarily the first here)
        with pytest.raises(ConfigError, match="|".join(unsupported)):
            backend.check_call(params, gqa)
        return
    backend.check_call(params, gqa)
    before = [t.clone() for t in cache.k + cache.v]
    out = torch.full_like(q, float("nan"))
    backend.begin_forward(md)
    backend.forward(q, k, v, out, params, md)
    n = len(batch)
    want = _reference(cache, batch, md, q, k, v, params)
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out[:n].float(), want.float(), **tol)
    assert torch.equal(out[n:], torch.zeros_like(out[n:]))  # padding rows: exactly zero
    # KV: this layer's batch slots hold k, v; nothing else changed but the pad slot.
    written = set(batch.slots) | {cache.pad_slot}
    for i, (old, new) in enumerate(zip(before, cache.k + cache.v)):
        changed = set((old != new).flatten(1).any(1).nonzero().flatten().tolist())
        assert changed <= (written if i % 2 == 1 else set()), (i, sorted(changed - written))


@pytest.mark.parametrize("case", ["softcap", "sinks", "all", "temperature"])
def test_sdpa_math_path_in_row_chunks_matches_it_whole(case, monkeypatch):
    """sdpa's plain-math path (soft-cap, sinks, temperature) runs query rows in chunks to bound its scores' memory: the
    chunks (5 rows here, the last one short) give what the whole does."""
    from pcg_core.attention import sdpa

    cache, batch, md, q, k, v = _setup("cpu", 4, 2, torch.float32, page=PAGE)
    opts = dict(CASES[case])
    if opts.pop("sinks", False):
        opts["sinks"] = torch.tensor([0.5, -1.0, 2.0, 0.0])
    params = LayerParams(1, 0.3, **opts)
    backend = sdpa.SdpaBackend(cache, BUCKET)
    outs = []
    for chunk in (sdpa.MATH_CHUNK_BYTES, 4 * 4 * cache.num_slots * 5):
        monkeypatch.setattr(sdpa, "MATH_CHUNK_BYTES", chunk)
        out = torch.full_like(q, float("nan"))
        backend.begin_forward(md)
        backend.forward(q, k, v, out, params, md)
        outs.append(out)
    assert q.shape[0] % 5 != 0  # a short last chunk
    torch.testing.assert_close(outs[1], outs[0], atol=1e-6, rtol=1e-6)


def test_declared_features_and_devices_are_published():
    caps = capabilities()["attention_backends"]
    assert list(caps)[:3] == BACKENDS
    for name, c in caps.items():
        assert set(c["features"]) == set(FEATURES)
        assert set(c["devices"]) == {"cpu", "cuda"}
    assert caps["varlen"]["devices"]["cpu"] and "CUDA" in caps["varlen"]["devices"]["cpu"]
    assert caps["varlen"]["features"]["softcap"]  # declared unsupported, with the reason
    assert caps["flex"]["devices"]["cpu"] is None and caps["flex"]["page_size"] == 128
    assert caps["varlen"]["devices"]["cuda"] is None  # this torch has varlen_attn
    assert all(why is None for why in caps["sdpa"]["features"].values())  # the reference runs every modifier
    assert caps["varlen"]["dtypes"]["float32"] and "FlashAttention" in caps["varlen"]["dtypes"]["float32"]
    assert caps["varlen"]["dtypes"]["bfloat16"] is None and caps["sdpa"]["dtypes"]["float32"] is None


def test_a_backend_asked_for_a_dtype_it_has_no_kernel_for_is_refused_naming_it():
    from pcg_core.attention.varlen import VarlenBackend

    cache = KVCache(_config(4, 2), 4 * PAGE, torch.float32, torch.device("cpu"), page_size=PAGE)
    with pytest.raises(ConfigError, match="varlen.*cannot compute in float32.*FlashAttention") as e:
        VarlenBackend(cache, 8)
    assert e.value.field == "dtype"
    FlexBackend(cache, 8)  # flex computes float32


def test_varlen_on_cpu_is_refused_with_the_reason():
    lm = tiny_model("qwen3")
    with pytest.raises(ConfigError, match="varlen.*cannot run on cpu.*CUDA") as e:
        Engine(lm.model, EngineConfig(attention="varlen", kv_slots=256))
    assert e.value.field == "attention"


# The block-mask builder: a flex graph replayed for a second layout must not use the first one's block mask ----


def _layouts(vocab: int):
    """Two prefills that pad to one bucket (32) with other sequences on other pages, then a third."""
    return [prompts_of(lengths, vocab, seed=i) for i, lengths in enumerate([[30], [3, 9, 17], [20, 10]])]


def _run_layouts(engine, layouts):
    return [engine.generate(p, max_new_tokens=3, prompt_logprobs=True) for p in layouts]


@pytest.fixture(scope="module", params=DEVICES)
def flex_setup(request):
    device = request.param
    lm = tiny_model("qwen3", device=device)
    layouts = _layouts(lm.config.vocab_size)
    ref = _run_layouts(Engine(lm.model, EngineConfig(device=device, attention="flex", kv_slots=1024,
                                                     page_size=_page("flex", device))), layouts)
    return SimpleNamespace(lm=lm, layouts=layouts, ref=ref, device=device)


def _flex_engine(setup, backend="piecewise", attention="flex"):
    cap = CaptureConfig(backend=backend, max_tokens=64)
    return Engine(setup.lm.model, EngineConfig(device=setup.device, attention=attention, capture=cap, kv_slots=1024,
                                               page_size=_page("flex", setup.device)))



@pytest.mark.parametrize("backend", ["piecewise", "breakable", "full"])
def test_flex_graph_paths_match_eager_flex(flex_setup, backend):
    out = _run_layouts(_flex_engine(flex_setup, backend), flex_setup.layouts)
    for got, want in zip(out, flex_setup.ref):
        assert compare_outputs(want, got, 1e-4) == []


def test_flex_matches_sdpa(flex_setup):
    sdpa = _flex_engine(flex_setup, "disabled", attention="sdpa")
    for got, want in zip(_run_layouts(sdpa, flex_setup.layouts), flex_setup.ref):
        assert compare_outputs(want, got, 1e-4) == []


class _StaleOnReplay(FlexBackend):
    """Planted: the block mask is built once per bucket and reused, as if the builder keyed on the bucket."""

    def _build(self, n, window):
        seen = self.__dict__.setdefault("_seen", set())
        if (n, window) in seen:
            return BlockMask.from_kv_blocks(*[getattr(self._bufs.blocks_for(window), f)[:, :, : -(-n // 128)]
                                              for f in ("kv_num", "kv_idx", "full_num", "full_idx")],
                                            BLOCK_SIZE=(128, self.cache.page_size), mask_mod=self._mask_mod(window),
                                            seq_lengths=(n, self.cache.num_slots), compute_q_blocks=False)
        seen.add((n, window))
        return super()._build(n, window)


class _LostPage(FlexBackend):
    """Planted: each query block's last listed page is dropped from the block mask."""

    def _build(self, n, window):
        bm = super()._build(n, window)
        bm.kv_num_blocks.sub_(1).clamp_(min=0)
        return bm


@pytest.mark.parametrize("backend", ["piecewise", "full"])
@pytest.mark.parametrize("fault", [_StaleOnReplay, _LostPage])
def test_planted_block_mask_faults_are_caught(flex_setup, fault, backend, monkeypatch):
    # Planted before the engine is built: on CUDA its prep graphs record the block-mask build at capture and replay
    # it, never calling _build again, so a fault planted after construction never runs there (it went unnoticed on
    # the H100 2026-12-06 for that reason, not for the judge's).
    import pcg_core.engine.engine as engine_module

    real = engine_module.get_attention_backend
    monkeypatch.setattr(engine_module, "get_attention_backend", lambda name: fault if name == "flex" else real(name))
    engine = _flex_engine(flex_setup, backend)
    assert type(engine.attn_backend) is fault
    out = _run_layouts(engine, flex_setup.layouts)
    problems = [m for got, want in zip(out, flex_setup.ref) for m in compare_outputs(want, got, 1e-4)]
    assert problems, f"planted {fault.__name__} went unnoticed"


def test_flex_block_mask_lists_exactly_the_visible_pages():
    cache, batch, md, q, k, v = _setup("cpu", 4, 2)
    flex = FlexBackend(cache, BUCKET)
    flex.begin_forward(md)
    for window in (0, 4):
        bm = flex.block_mask(md, window)
        dense = bm.to_dense()[0, 0]  # [query blocks, pages]: partial or full
        n = len(batch)
        vis = visible(md.seq_ids[:n], md.positions[:n], cache.slot_seq[: cache.num_slots],
                      cache.slot_pos[: cache.num_slots], window)
        want = vis.view(n, cache.num_pages, PAGE).any(-1).any(0)  # one query block: the pages any row sees
        assert torch.equal(dense[0].bool(), want), (window, dense[0], want)


# On the GPU, at real widths: every backend × graph mode replays bitwise equal to eager at the same padding --------

JUDGE_BF16_LOGPROB_TOL = 0.1  # harness/cell/judge/tolerances.py's LOGPROB_TOL["bfloat16"]; pcg_core's tests do not import the harness


@pytest.fixture(scope="module")
def trimmed():
    from pcg_core import load_model
    from pcg_helpers import config_path

    lm = load_model(config_path("qwen3"), tiny=False, layers=4, dtype=torch.bfloat16, device="cuda")
    return SimpleNamespace(lm=lm, vocab=lm.config.vocab_size, eager={})


def _gpu_engine(lm, attention: str, graph: str) -> Engine:
    cap = CaptureConfig(backend=graph, max_tokens=256)
    return Engine(lm.model, EngineConfig(device="cuda", dtype="bfloat16", attention=attention, capture=cap, kv_slots=8192))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("graph", ["piecewise", "breakable", "full"])
@pytest.mark.parametrize("attention", BACKENDS)
def test_gpu_replay_bitwise_equal_to_eager_at_the_same_padding(trimmed, attention, graph):
    engine = _gpu_engine(trimmed.lm, attention, graph)
    # [300]: above the largest bucket, eager with buffers of its own; the replays after it must not read those.
    for i, lengths in enumerate([[5, 17, 30], [200], [300], [3] * 40, [1, 2, 250], [7]]):
        prompts = prompts_of(lengths, trimmed.vocab, seed=i)
        batch, seq_slots, _ = engine.pack_prompts(prompts, 4)
        got, want = engine.forward(batch).clone(), engine.forward(batch, eager=True)
        assert torch.equal(got, want), (attention, graph, lengths, float((got.float() - want.float()).abs().max()))
        steps = [(s, 1, len(p)) for s, p in enumerate(prompts)]  # one decode step for every sequence
        dec = decode_batch(steps, seq_slots)
        got, want = engine.forward(dec, decode=True).clone(), engine.forward(dec, eager=True)
        assert torch.equal(got, want), (attention, graph, "decode", lengths)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("attention", ["flex", "varlen"])
def test_gpu_eager_backends_agree_with_sdpa(trimmed, attention):
    """Different kernels, so not bitwise: held to the judge's bf16 logprob bound (harness/cell/judge/tolerances.py),
    the bound a cell comparing them would apply. Each backend's own exactness is test_gpu_long_batches_match_plain_math's."""
    prompts = prompts_of([5, 17, 30, 120], trimmed.vocab, seed=3)
    if "sdpa" not in trimmed.eager:
        trimmed.eager["sdpa"] = _gpu_engine(trimmed.lm, "sdpa", "disabled").generate(prompts, 6, prompt_logprobs=True)
    got = _gpu_engine(trimmed.lm, attention, "disabled").generate(prompts, 6, prompt_logprobs=True)
    assert compare_outputs(trimmed.eager["sdpa"], got, JUDGE_BF16_LOGPROB_TOL) == []


def _long_batch(cache: KVCache, runs: list[tuple[int, int]]):
    """A batch of (context, new tokens) runs, one sequence each, the new tokens the last of the context; with its
    metadata on CUDA."""
    batch = PackedBatch([], [], [], [])
    for s, (ctx, new) in enumerate(runs):
        slots = cache.allocate(s, ctx)
        batch.token_ids += [0] * new
        batch.positions += list(range(ctx - new, ctx))
        batch.seq_ids += [s] * new
        batch.slots += slots[ctx - new :]
    _, _, md = InputBuffers(len(batch), cache, torch.device("cuda")).fill(batch, len(batch))
    return batch, md


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("heads", [16, 32, 64], ids=["group2", "group4", "group8"])  # Qwen3-0.6B, Llama-3-8B, Qwen3-30B-A3B
@pytest.mark.parametrize("runs", [[(2048, 2048)], [(1536, 512), (700, 300)], [(512, 1)] * 8, [(600, 64)]],
                         ids=["prefill2048", "extend", "decode8x512", "chunk64"])
def test_gpu_long_batches_match_plain_math(name, heads, runs):
    """Real head shapes (16 to 64 query heads over 8 KV heads × 128) at long contexts, bf16, each backend against
    float32 math: the small batches above cannot show a kernel that goes wrong only past some length, or one
    that flex picks only for short queries of wide head groups (its decoding kernel)."""
    cfg = SimpleNamespace(num_attention_heads=heads, num_key_value_heads=8, head_dim=128, hidden_size=heads * 128,
                          num_hidden_layers=1)
    cls = get_attention_backend(name)
    cache = KVCache(cfg, 8192, torch.bfloat16, torch.device("cuda"), page_size=cls.page_size)
    g = torch.Generator(device="cuda").manual_seed(0)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g, device="cuda").to(t.dtype))
    batch, md = _long_batch(cache, runs)
    n = len(batch)
    q = torch.randn(n, heads, 128, generator=g, device="cuda").bfloat16()
    k = torch.randn(n, 8, 128, generator=g, device="cuda").bfloat16()
    v = torch.randn(n, 8, 128, generator=g, device="cuda").bfloat16()
    out = torch.empty_like(q)
    backend = cls(cache, n)
    backend.begin_forward(md)
    params = LayerParams(0, 128 ** -0.5)
    backend.forward(q, k, v, out, params, md)
    want = _reference(cache, batch, md, q, k, v, params)
    err = (out.float() - want.float()).abs()
    worst_row = int(err.amax(dim=(1, 2)).argmax())
    assert float(err.max()) < 3e-2, f"{name}: max |Δ| {float(err.max()):.3g} at row {worst_row} (position {batch.positions[worst_row]})"


@pytest.mark.parametrize("rows,group,fits", [(64, 2, True), (64, 4, False), (32, 4, True), (32, 8, False), (8, 8, True),
                                             (1, 16, True), (128, 8, True), (256, 4, True), (16, 16, False)])
def test_flex_asks_for_its_main_kernel_where_the_decoding_kernel_has_no_configuration(rows, group, fits):
    """Inductor's flex decoding kernel (chosen for < 128 query rows) tiles rows × group query rows per KV head, at
    most one 128-row query block; measured on the H200: 64 rows of 4-head groups lower to no kernel at all."""
    from pcg_core.attention.flex import _decode_kernel_fits

    assert _decode_kernel_fits(rows, group) is fits


@pytest.mark.parametrize("decoding", [True, False])
def test_flex_without_its_decoding_kernel_asks_for_the_main_one_at_every_row_count(monkeypatch, decoding):
    """FlexBackend.decoding_kernel = False (benchmarks/prefill.py's flex_main): under 128 rows, where inductor would
    take its decoding kernel by itself, the call asks for the main kernel; the kernel's key says which, so a graph and
    its eager reference at the same padding call the same one."""
    from types import SimpleNamespace

    from pcg_core.attention import KVCache, LayerParams
    from pcg_core.attention.flex import FlexBackend
    from pcg_core.engine.inputs import InputBuffers, PackedBatch

    cfg = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_size=64, num_hidden_layers=1)
    cache = KVCache(cfg, 512, torch.float32, torch.device("cpu"), page_size=FlexBackend.page_size)
    batch = PackedBatch(list(range(8)), list(range(8)), [0] * 8, cache.allocate(0, 8))
    md = InputBuffers(8, cache, torch.device("cpu")).fill(batch, 8)[2]
    backend = FlexBackend(cache, 8)
    backend.decoding_kernel = decoding
    backend._compiled = True  # the CUDA path's choices, with a stand-in kernel
    keys = []

    def kernel(key):
        keys.append(key)
        return lambda query, *a, **kw: torch.zeros_like(query)

    monkeypatch.setattr(backend, "_kernel", kernel)
    q, k = torch.randn(8, 4, 16), torch.randn(8, 2, 16)
    backend.begin_forward(md)
    backend.forward(q, k, torch.randn_like(k), torch.empty_like(q), LayerParams(0, 0.25), md)
    options = dict(keys[0][6])
    assert keys[0][0] == 8 and options.get("FORCE_USE_FLEX_ATTENTION", False) is (not decoding)


def test_flex_kernels_compile_with_inductors_deterministic_choices_once(monkeypatch):
    """Each engine compiles its own flex kernels; inductor would otherwise pick the decoding kernel's reduction
    configurations by timing them, so a cell's eager reference and its graph could round differently. A second
    compile of one kernel (a failed guard) raises instead of recompiling or falling back to eager flex."""
    import torch._inductor.compile_fx as compile_fx_module
    from torch._inductor import config

    from pcg_core.attention import flex

    assert hasattr(config, "deterministic"), "this torch has no deterministic inductor mode: flex kernels may differ"
    seen = []
    monkeypatch.setattr(flex.torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    cache, *_ = _setup("cpu", 4, 2)
    backend = flex.FlexBackend(cache, BUCKET)
    backend._kernel((8, 0, 0.0, False, True, False))
    assert seen and seen[0]["dynamic"] is False and seen[0]["fullgraph"] is True
    compile_once = seen[0]["backend"]
    assert isinstance(compile_once, flex.CompileOnce)
    patches = []
    monkeypatch.setattr(compile_fx_module, "compile_fx", lambda gm, ex, config_patches=None: patches.append(config_patches) or gm)
    compile_once("gm", [])
    assert patches == [{"deterministic": True}]
    with pytest.raises(RuntimeError, match="compiled a second time"):
        compile_once("gm", [])


@pytest.mark.slow
def test_flex_compiled_kernel_matches_its_cpu_math_past_dynamo_without_a_recompile():
    """The compiled path (inductor's flex, here its CPU kernel) against the plain-math path the CPU runs, over two
    layers (other cache rows) and two batches of one bucket (other block-mask contents): one kernel, compiled once
    (a guard on the layer's cache view would make CompileOnce raise), called past dynamo after its first call."""
    cache, batch, md, q, k, v = _setup("cpu", 4, 2)
    compiled, plain = FlexBackend(cache, BUCKET), FlexBackend(cache, BUCKET)
    compiled._compiled = True
    g = torch.Generator().manual_seed(7)
    for step in range(2):
        if step:  # another batch of the bucket: sequences over other pages, other lengths
            cache.reset(page_order=torch.randperm(cache.num_pages, generator=g).tolist())
            batch = PackedBatch([], [], [], [])
            for s, n in ((4, 9), (5, 3)):
                slots = cache.allocate(s, n)
                batch.token_ids += [1] * n
                batch.positions += list(range(n))
                batch.seq_ids += [s] * n
                batch.slots += slots
            md = InputBuffers(BUCKET, cache, torch.device("cpu")).fill(batch, BUCKET)[2]
        for layer in (0, 1):
            for backend in (compiled, plain):
                backend.begin_forward(md)
            params = LayerParams(layer, 16 ** -0.5)
            got, want = torch.empty_like(q), torch.empty_like(q)
            compiled.forward(q, k, v, got, params, md)
            plain.forward(q, k, v, want, params, md)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    (kernel,) = compiled._kernels.values()
    assert kernel.direct_off == "" and kernel.direct_calls == 3 and kernel.compile_once.compiled == 1
    built, seconds = compiled.kernels_built()  # what a cell reports: one kernel, its first call's build time
    assert built == 1 and seconds == kernel.build_s > 0 and plain.kernels_built() == (0, 0.0)


@pytest.mark.slow
def test_flex_padded_and_unpadded_buckets_of_one_row_count_share_a_kernel_past_dynamo():
    """Buckets 24 and 32 both hand flex 32 query rows: 24 padded up to 32, 32 as it is. Inductor's artifact asserts
    the query strides it was compiled for, and the direct path skips dynamo's stride guards, so the two must reach
    it in one layout (seen on the H200: bucket 32 after bucket 24 raised "expected … stride" in every flex cell)."""
    cache, batch, _, _, _, _ = _setup("cpu", 4, 2)
    compiled, plain = FlexBackend(cache, 32), FlexBackend(cache, 32)
    compiled._compiled = True
    g = torch.Generator().manual_seed(3)
    qkv = [torch.randn(32, h, 16, generator=g) for h in (4, 2, 2)]
    for bucket in (24, 32, 24, 32):
        md = InputBuffers(32, cache, torch.device("cpu")).fill(batch, bucket)[2]
        q, k, v = (t[:bucket] for t in qkv)
        for backend in (compiled, plain):
            backend.begin_forward(md)
        got, want = torch.empty_like(q), torch.empty_like(q)
        compiled.forward(q, k, v, got, LayerParams(0, 16 ** -0.5), md)
        plain.forward(q, k, v, want, LayerParams(0, 16 ** -0.5), md)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    (kernel,) = compiled._kernels.values()
    assert kernel.direct_off == "" and kernel.direct_calls == 3 and kernel.compile_once.compiled == 1


def test_a_flex_kernel_that_cannot_name_an_input_stays_on_dynamos_path():
    """The planted fault: a graph input the plan cannot name (here every name hidden) must switch the direct path
    off, not guess."""
    from pcg_core.attention.flex_kernel import FlexKernel

    kernel = FlexKernel("pcg_flex_probe", (), {})
    q = torch.zeros(1, 2, 8, 4)
    kernel.compile_once.example_inputs = [q.clone()]  # a tensor that is none of the call's
    kernel._make_plan(q, q, q, {"block_mask": None}, torch.zeros(1))
    assert kernel.plan is None and "cannot name" in kernel.direct_off


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("heads", [32, 64])
def test_gpu_two_flex_backends_decode_bitwise_alike(heads):
    """Two flex backends (two engines' worth of compiled kernels) on equal caches give the same decode output
    bitwise: what lets a cell compare its graph with an eager engine at the same padding."""
    cfg = SimpleNamespace(num_attention_heads=heads, num_key_value_heads=8, head_dim=128, hidden_size=heads * 128,
                          num_hidden_layers=1)
    outs = []
    for _ in range(2):
        cache = KVCache(cfg, 4096, torch.bfloat16, torch.device("cuda"), page_size=128)
        g = torch.Generator(device="cuda").manual_seed(0)
        for t in cache.k + cache.v:
            t.copy_(torch.randn(t.shape, generator=g, device="cuda").to(t.dtype))
        batch = PackedBatch([], [], [], [])
        for s, ctx in enumerate([258, 1500]):
            slots = cache.allocate(s, ctx)
            batch.token_ids.append(0)
            batch.positions.append(ctx - 1)
            batch.seq_ids.append(s)
            batch.slots.append(slots[-1])
        _, _, md = InputBuffers(4, cache, torch.device("cuda")).fill(batch, 4)  # padded to a bucket of 4
        q = torch.randn(4, heads, 128, generator=g, device="cuda").bfloat16()
        k = torch.randn(4, 8, 128, generator=g, device="cuda").bfloat16()
        v = torch.randn(4, 8, 128, generator=g, device="cuda").bfloat16()
        out = torch.empty_like(q)
        backend = get_attention_backend("flex")(cache, 4)
        backend.begin_forward(md)
        backend.forward(q, k, v, out, LayerParams(0, 128 ** -0.5), md)
        outs.append(out[:2].clone())
    assert torch.equal(outs[0], outs[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("kv_heads", [8, BUCKET], ids=["gqa", "mha"])
def test_gpu_sinks_where_the_bucket_equals_the_head_count(name, kv_heads):
    """As many query heads as tokens: an LSE of [H, T] and one of [T, H] have the same shape there, so a backend
    that tells its layout from shapes applies each row's sink correction with another row's LSE (gpt-oss-120b:
    64 heads at the 64-token bucket)."""
    if not _supported(name, "cuda"):
        pytest.skip(get_attention_backend(name).device_reason("cuda"))
    heads = BUCKET
    cache, batch, md, q, k, v = _setup("cuda", heads, kv_heads, torch.bfloat16, page=_page(name, "cuda"))
    params = LayerParams(1, 0.3, sinks=torch.linspace(-1.0, 2.0, heads, device="cuda"))
    backend = get_attention_backend(name)(cache, BUCKET)
    out = torch.full_like(q, float("nan"))
    backend.begin_forward(md)
    backend.forward(q, k, v, out, params, md)
    want = _reference(cache, batch, md, q, k, v, params)
    torch.testing.assert_close(out[: len(batch)].float(), want.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_flex_refuses_a_page_its_main_kernel_cannot_tile():
    """Seen on the H200: 16-slot pages compile for flex's decoding kernel but not its main one (KV block 16 is no
    multiple of BLOCK_N 64), so a prefill of 128+ tokens would crash; refused up front instead."""
    cache = KVCache(_config(4, 2), 12 * PAGE, torch.bfloat16, torch.device("cuda"), page_size=PAGE)
    with pytest.raises(ConfigError, match="page_size a multiple of 128"):
        get_attention_backend("flex")(cache, BUCKET)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("name", ["sdpa", "flex"])
@pytest.mark.parametrize("runs", [[(1024, 1024)], [(512, 1)] * 8, [(600, 64)], [(300, 200), (90, 1)]],
                         ids=["prefill1024", "decode8x512", "chunk64", "mixed"])
def test_gpu_absorbed_mla_shapes_match_plain_math(name, runs, dtype):
    """DeepSeek-V3's absorbed attention: 128 query heads of 576 over one latent KV head whose values are its first
    512 columns (a view), against float32 math. flex runs its wide-head tiles here (WIDE_HEAD_OPTIONS); it claims
    MLA once this has passed on the GPU. float32: the judge's padding check (its tiles halved; 32×32 did not fit
    an SM's shared memory, so MLA cells under flex could not prove their padding noise)."""
    cfg = SimpleNamespace(num_attention_heads=128, num_key_value_heads=128, head_dim=192, hidden_size=7168,
                          num_hidden_layers=1, kv_lora_rank=512, qk_rope_head_dim=64)
    cls = get_attention_backend(name)
    cache = KVCache(cfg, 4096, dtype, torch.device("cuda"), page_size=cls.page_size)
    assert cache.latent and cache.v[0].data_ptr() == cache.k[0].data_ptr()
    g = torch.Generator(device="cuda").manual_seed(0)
    cache.k[0].copy_(torch.randn(cache.k[0].shape, generator=g, device="cuda").to(dtype))
    batch, md = _long_batch(cache, runs)
    n = len(batch)
    q = torch.randn(n, 128, 576, generator=g, device="cuda").to(dtype)
    latent = torch.randn(n, 1, 576, generator=g, device="cuda").to(dtype)
    out = torch.empty(n, 128, 512, device="cuda", dtype=dtype)
    backend = cls(cache, n)
    backend.begin_forward(md)
    params = LayerParams(0, 192 ** -0.5)
    backend.forward(q, latent, latent[..., :512], out, params, md)
    want = _reference(cache, batch, md, q, latent, latent[..., :512], params)
    err = (out.float() - want.float()).abs()
    bound = 3e-2 if dtype == torch.bfloat16 else 1e-4
    assert float(err.max()) < bound, f"{name}: max |Δ| {float(err.max()):.3g}"
