"""A forward's inputs and attention metadata: staged on the host, uploaded in one copy, and (on CUDA, for the
backends that declare `prep_capturable`) replayed from a prep graph per bucket (pcg_core/engine/prep.py).

The CPU tests hold the staging and `rebind` to what the eager path builds; the GPU tests hold every prep-graph
replay to the eager path's buffers bit for bit, over batches that change between forwards of one bucket, and show
that a prep graph that is not replayed (stale metadata) is caught."""

from __future__ import annotations

import pytest
import torch
from pcg_helpers import CONFIGS, make_engine, prompts_of, tiny_model

from pcg_core.attention.flex import FlexBackend
from pcg_core.attention.kv_cache import KVCache
from pcg_core.engine.inputs import PAD_SEQ, InputBuffers, PackedBatch

from test_attention_backends import _config  # noqa: E402  (beside this file)


def _cache(device="cpu", page=16):
    return KVCache(_config(4, 2), 12 * page, torch.float32, torch.device(device), page_size=page)


def _batch(cache, lengths, start_seq=0):
    cache.reset()
    b = PackedBatch([], [], [], [])
    for i, n in enumerate(lengths):
        s = start_seq + i
        slots = cache.allocate(s, n + 2)
        b.token_ids += list(range(100 + s, 100 + s + n))
        b.positions += list(range(n))
        b.seq_ids += [s] * n
        b.slots += slots[:n]
    return b


def test_staged_and_uploaded_rows_are_the_batch_padded():
    cache = _cache()
    inputs = InputBuffers(16, cache, torch.device("cpu"))
    batch = _batch(cache, [5, 3])
    input_ids, positions, md = inputs.fill(batch, 12)
    n = len(batch)
    assert input_ids.tolist() == batch.token_ids + [0] * 4
    assert positions.tolist() == batch.positions + [0] * 4
    assert md.slot_mapping.tolist() == batch.slots + [cache.pad_slot] * 4
    assert md.seq_ids.dtype == torch.int32 and md.seq_ids.tolist() == batch.seq_ids + [PAD_SEQ] * 4
    assert md.valid.tolist() == [True] * n + [False] * 4
    assert md.host_seq_ids.tolist() == batch.seq_ids and md.host_positions.tolist() == batch.positions
    # the same static rows for every forward of a bucket (a graph reads these addresses)
    again = inputs.fill(_batch(cache, [2]), 12)
    assert again[0].data_ptr() == input_ids.data_ptr() and again[2].valid.data_ptr() == md.valid.data_ptr()
    assert again[2].valid.tolist() == [True] * 2 + [False] * 10


def test_a_batch_above_the_buffers_gets_fresh_rows_and_leaves_the_static_ones_alone():
    cache = _cache()
    inputs = InputBuffers(8, cache, torch.device("cpu"))
    small = inputs.fill(_batch(cache, [4]), 8)
    kept = small[0].clone()
    big = inputs.fill(_batch(cache, [7, 6], start_seq=3), 13)
    assert big[0].data_ptr() != small[0].data_ptr() and big[2].num_tokens == 13
    assert big[2].seq_ids.tolist() == [3] * 7 + [4] * 6
    assert torch.equal(small[0], kept)


def test_stage_refuses_to_pad_down():
    cache = _cache()
    with pytest.raises(ValueError, match="cannot pad 5 tokens down to 4"):
        InputBuffers(8, cache, torch.device("cpu")).stage(_batch(cache, [5]), 4)


def test_flex_rebind_restores_the_block_masks_built_for_the_bucket(monkeypatch):
    """What a prep-graph replay leaves the backend with: the bucket's BlockMask objects (over the static buffers
    the graph refills), its metadata bound, and nothing rebuilt on the host."""
    cache = _cache(page=16)
    inputs = InputBuffers(256, cache, torch.device("cpu"))
    flex = FlexBackend(cache, 256)
    flex._windows = [0]
    md = inputs.fill(_batch(cache, [40, 9]), 64)[2]
    flex.begin_forward(md)
    masks = flex._masks
    flex.begin_forward(inputs.fill(_batch(cache, [100, 60]), 256)[2])  # another bucket in between
    assert flex._masks is not masks
    monkeypatch.setattr(flex, "begin_forward", lambda md: pytest.fail("rebuilt on the host"))
    flex.rebind(md)
    assert flex._masks is masks and flex.block_mask(md, 0) is masks[0]
    bm = masks[0]
    static = flex._static.blocks[0]
    assert bm.kv_indices.data_ptr() == static.kv_idx.data_ptr()  # views of the static buffers a graph refills


def test_a_backend_without_prep_capturable_refuses_rebind():
    from pcg_core.attention.varlen import VarlenBackend

    assert not VarlenBackend.prep_capturable
    with pytest.raises(NotImplementedError, match="prep_capturable"):
        VarlenBackend.rebind(object.__new__(VarlenBackend), None)


def test_no_prep_graphs_without_cuda():
    engine = make_engine(tiny_model("qwen3").model, "full")
    assert not engine.prep.enabled and engine.prep.graphs == {}


# GPU ------------------------------------------------------------------------------------------------------


def _snapshot(engine, md):
    """Every buffer the decoder's graphs read for this forward: inputs, and the attention backend's metadata."""
    out = [t.clone() for t in (md.slot_mapping, md.positions, md.seq_ids, md.valid, engine.inputs._dev["rows"])]
    if md.fresh_bounds is not None:  # an MLA model's cu_seqlens, built with the upload
        out.append(md.fresh_bounds.clone())
    backend = engine.attn_backend
    if hasattr(backend, "mask"):
        out.append(backend.mask.clone())
    for bm in getattr(backend, "_masks", {}).values():
        out += [t.clone() for t in (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices)]
    return out


def _prep_matches_eager(engine, batches, bucket) -> bool:
    same = True
    for lengths in batches:
        prompts = prompts_of(lengths, engine.model.config.vocab_size)
        batch = engine.prefill_batch(prompts)
        md = engine.stage_inputs(batch, bucket, replay=True)[2]
        torch.cuda.synchronize()
        replayed = _snapshot(engine, md)
        md = engine.stage_inputs(batch, bucket, replay=False)[2]
        eager = _snapshot(engine, md)
        same &= len(replayed) == len(eager) and all(torch.equal(a, b) for a, b in zip(replayed, eager))
    return same


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("attention", ["sdpa", "flex"])
@pytest.mark.parametrize("backend", ["full", "breakable"])
@pytest.mark.parametrize("planted", [False, True], ids=["prep-replayed", "planted-not-replayed"])
@pytest.mark.parametrize("arch", ["qwen3", "deepseek-v3"])
def test_gpu_prep_graph_replay_equals_the_eager_metadata(arch, attention, backend, planted, monkeypatch):
    from pcg_core import CaptureConfig, Engine, EngineConfig, load_model

    if arch == "deepseek-v3":  # MLA, fresh paths on: the upload also builds the sequences' bounds (fresh_bounds)
        from pcg_core.engine import engine as engine_module

        monkeypatch.setattr(engine_module, "FRESH_PATH_MIN_TOKENS", 128)
        lm = load_model(CONFIGS / "deepseek-ai__DeepSeek-V3.json", tiny=True, layers=2, dtype=torch.bfloat16,
                        device="cuda")
    else:
        lm = tiny_model(arch, dtype=torch.bfloat16, device="cuda")
    engine = Engine(lm.model, EngineConfig(device="cuda", dtype="bfloat16", attention=attention, kv_slots=1024,
                                           capture=CaptureConfig(backend=backend, max_tokens=256)))
    assert engine.prep.enabled and set(engine.prep.graphs) == set(engine.config.capture.ladder)
    assert (engine.inputs._dev.get("bounds") is not None) == (arch == "deepseek-v3")
    if planted:  # the graph is never replayed: the buffers keep the last batch's metadata
        monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda self: None)
    # batches that change page layout and lengths between forwards of one bucket (128 tokens)
    batches = [[100, 20], [5, 60, 40], [128], [1, 1, 1, 90]]
    assert _prep_matches_eager(engine, batches, 128) is (not planted)
