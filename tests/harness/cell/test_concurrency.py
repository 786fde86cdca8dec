"""The concurrency cases (prompts.CONCURRENCY): 64, 128 and 256 sequences of mixed lengths in one forward, decode
batches that shrink across bucket edges while a quarter of the sequences join at later steps; each sequence judged against its own eager reference, the worst named. A
fault that appears only with more than 64 sequences in a forward sits in code eager shares with the graph, so graph
= eager cannot see it: eager's own checks must (its self-check, when the fault reads memory left by an earlier
case; the reference layer, eager against transformers with the most concurrent case among its cases)."""

from __future__ import annotations

import pytest

from harness.cell import CellSpec, run_cell
from harness.cell.prompts import CONCURRENCY, prompt_suite, run_case
from harness.cell.judge.reference import reference_cases
from harness.outcome import Status
from pcg_core.engine import inputs as engine_inputs
from pcg_core.engine.inputs import PackedBatch

LADDER_4096 = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def _concurrent(ladder: list[int]):
    return [c for c in prompt_suite(ladder, 1000, max_new_tokens=4) if c.name.startswith("concurrent_")]


def test_the_levels_the_ladder_holds_pack_mixed_lengths_and_shrink_across_buckets():
    cases = _concurrent(LADDER_4096)
    assert [len(c.prompts) for c in cases] == list(CONCURRENCY)
    for c in cases:
        assert c.prefill_tokens <= 4096 and len({len(p) for p in c.prompts}) == 8  # one prefill, lengths 1–8 mixed
        alive = [sum(n > k for n in c.new_tokens) for k in range(max(c.new_tokens))]  # decode batch sizes by step
        buckets = {next(b for b in LADDER_4096 if b >= a) for a in alive if a}
        assert len(buckets) >= 3, (c.name, alive)  # the shrinking decode batch replays several buckets
        assert sorted(set(c.join_at)) == [0, 1, 2, 3] and sum(j > 0 for j in c.join_at) == len(c.prompts) // 4
    small = _concurrent([4, 8, 16, 24, 32, 48, 64])  # the CPU smoke ladder: 64 only, its prefill chunked
    assert [len(c.prompts) for c in small] == [64] and small[0].chunk == 64
    capped = [c for c in prompt_suite(LADDER_4096, 1000, max_new_tokens=4, concurrency=64) if "concurrent" in c.name]
    assert [len(c.prompts) for c in capped] == [64]  # a CPU cell's cap
    chosen, _ = reference_cases(prompt_suite(LADDER_4096, 1000, max_new_tokens=4))
    assert "concurrent_256_seqs" in [c.name for c in chosen]


def _off_by_one_above_64(monkeypatch):
    """Planted in the engine's input staging (eager and graph alike): with more than 64 sequences in a forward, the
    rows of the highest sequence are labelled with the index before it (the two sequences attend to each other)."""
    real = engine_inputs.InputBuffers.stage

    def stage(self, batch: PackedBatch, num_tokens: int):
        if len(set(batch.seq_ids)) > 64:
            top = max(batch.seq_ids)
            ids = [s - 1 if s == top else s for s in batch.seq_ids]
            batch = PackedBatch(batch.token_ids, batch.positions, ids, batch.slots)
        return real(self, batch, num_tokens)

    monkeypatch.setattr(engine_inputs.InputBuffers, "stage", stage)


@pytest.mark.parametrize("plant", [False, True])
def test_a_sequence_index_off_by_one_above_64_sequences_is_caught(monkeypatch, plant):
    import harness.cell.run as run

    monkeypatch.setattr(run, "CPU_CONCURRENCY", 128)  # a CPU cell stops at 64 sequences by default
    if plant:
        _off_by_one_above_64(monkeypatch)
    r = run_cell(CellSpec(model="qwen3-0.6b", tiny=True, max_tokens=128, max_new_tokens=4))
    if plant:  # the relabelled sequence reads its neighbour's allocated, not yet written slots: stale KV
        assert r.status in (Status.FAIL_ACCURACY, Status.EAGER_NONDETERMINISTIC), r.reason
        assert "concurrent_128_seqs" in r.reason, r.reason
    else:
        assert r.status == Status.PASS and r.metrics.judge.reference.status == "pass", r.reason
        assert r.metrics.judge.worst_sequence


def test_the_reference_layer_alone_catches_it(monkeypatch):
    """Eager's self-check aside (both runs read the same stale memory when run back to back on one case), the
    reference layer holds the most concurrent case to transformers."""
    import torch

    from harness.cards import find_card
    from harness.cell.judge.reference import reference_layer
    from pcg_core.config import CaptureConfig, EngineConfig
    from pcg_core.engine import Engine
    from pcg_core.model import load_model

    lm = load_model(find_card("qwen3-0.6b").config, tiny=True, dtype=torch.float32, device="cpu", seed=0)
    config = EngineConfig(capture=CaptureConfig(backend="disabled", max_tokens=128), kv_slots=8192)
    cases = [c for c in prompt_suite(config.capture.ladder, lm.config.vocab_size, max_new_tokens=4)
             if c.name == "concurrent_128_seqs" or (c.name.startswith("layout_") and "_0_" in c.name)]
    verdicts = {}
    for plant in (False, True):
        if plant:
            _off_by_one_above_64(monkeypatch)
        eager = Engine(lm.model, config)
        outs = {c.name: run_case(eager, c, 5) for c in cases}
        verdicts[plant] = reference_layer(lm.model, config, cases, outs, False)
    assert verdicts[False].status == "pass", verdicts[False].summary()
    assert verdicts[True].status == "fail", verdicts[True].summary()
