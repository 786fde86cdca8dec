"""A DP=2 cell (data-parallel attention) as the launcher runs it: two gloo ranks, each attending over its own
sequences with its own KV, the MoE blocks over both ranks' rows (pcg::all_gather_into_), the whole batch's hidden
states gathered after each forward. EP=2 alone: each rank holds half the routed experts whole and its tokens reach
them by all-to-all dispatch (pcg::ep_all_to_all_), or under full by the all-gather form (partial sums all-reduced). Both are held to TP1 eager on the same weights, which sees a rank that keeps the wrong
rows or serves the wrong experts (graph and eager share them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from harness.cell.run import run_cell
from harness.cell.spec import CellSpec
from harness.outcome import Status
from pcg_core.capabilities import parallel_unsupported_reason

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "pcg_core" / "distributed"))
from tp_ranks import run_ranks  # noqa: E402

SMALL = {"tiny": True, "max_tokens": 64, "max_new_tokens": 2, "latency_repeat": 1}
MODELS = ("llama-3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3")


def _other_ranks_rows(monkeypatch):
    """Planted: every MoE block hands back the next rank's rows instead of its own."""
    import pcg_core.distributed.data_parallel as dp

    real = dp._gathering_class

    def wrong(cls):
        good = real(cls)

        def forward(self, hidden_states, *args, **kwargs):
            rank = self.pcg_dp_rank
            self.pcg_dp_rank = (rank + 1) % self.pcg_dp_size
            try:
                return good.forward(self, hidden_states, *args, **kwargs)
            finally:
                self.pcg_dp_rank = rank

        return type(f"Wrong{good.__name__}", (good,), {"forward": forward})

    monkeypatch.setattr(dp, "_gathering_class", wrong)


def cells_on_rank(rank: int) -> dict:
    out = {}
    for model in MODELS:
        for graph in ("piecewise", "breakable"):
            o = run_cell(CellSpec(model, graph=graph, parallel="dp2", **SMALL))
            out[model, graph] = (o.status, o.reason, o.metrics.capture.pieces, o.metrics.judge.tp1_logprob_diff)
    mp = pytest.MonkeyPatch()
    _other_ranks_rows(mp)
    try:
        o = run_cell(CellSpec("qwen3-30b-a3b", graph="piecewise", parallel="dp2", **SMALL))
    finally:
        mp.undo()
    out["wrong_rows"] = (o.status, o.reason)
    o = run_cell(CellSpec("qwen3-next-80b-a3b", graph="piecewise", parallel="dp2", **SMALL))
    out["linear"] = (o.status, o.reason)
    return out


def ep_cells_on_rank(rank: int) -> dict:
    import harness.cell.parallel as run

    out = {}
    for model in MODELS[1:]:
        for graph in ("piecewise", "breakable"):
            o = run_cell(CellSpec(model, graph=graph, parallel="ep2", **SMALL))
            out[model, graph] = (o.status, o.reason, o.metrics.judge.tp1_logprob_diff, o.metrics.settings.expert_dispatch)
    o = run_cell(CellSpec("qwen3-30b-a3b", graph="full", parallel="ep2", **SMALL))
    out["full"] = (o.status, o.reason, o.metrics.judge.tp1_logprob_diff, o.metrics.settings.expert_dispatch)
    o = run_cell(CellSpec("llama-3.1-8b", graph="piecewise", parallel="ep2", **SMALL))
    out["dense"] = (o.status, o.reason)
    real = run.shard_experts_by_index

    def wrong_range(model, group, **kw):  # planted: rank 1's layer-1 experts answer for rank 0's range
        n = real(model, group, **kw)
        if group.rank == 1:
            model.model.layers[1].mlp.experts.ep_start = 0
        return n

    run.shard_experts_by_index = wrong_range
    try:
        o = run_cell(CellSpec("qwen3-30b-a3b", graph="piecewise", parallel="ep2", **SMALL))
    finally:
        run.shard_experts_by_index = real
    out["fault"] = (o.status, o.reason)
    return out


@pytest.mark.slow
def test_ep2_cells_pass_a_rank_serving_the_wrong_experts_fails_and_a_dense_model_is_refused():
    r0, r1 = run_ranks(ep_cells_on_rank)
    faults = [r0.pop("fault"), r1.pop("fault")]
    assert r0 == r1
    for model in MODELS[1:]:
        for graph in ("piecewise", "breakable"):  # split ops run eagerly: tokens go where their experts are
            status, reason, tp1_diff, dispatch = r0[model, graph]
            assert status == Status.PASS and tp1_diff is not None and tp1_diff < 1e-5, (model, graph, reason, tp1_diff)
            assert dispatch == "all_to_all", (model, graph, dispatch)
    status, reason, tp1_diff, dispatch = r0["full"]  # one graph: the all-gather form, static shapes
    assert status == Status.PASS and tp1_diff is not None and tp1_diff < 1e-5 and dispatch == "all_gather", r0["full"]
    status, reason = r0["dense"]
    assert status == Status.UNSUPPORTED and "no routed experts" in reason, reason
    for status, reason in faults:
        assert status == Status.FAIL_ACCURACY and "ep2 eager differs from tp1 eager" in reason, reason


@pytest.mark.slow
def test_dp2_cells_pass_and_a_rank_keeping_the_wrong_rows_fails():
    ranks = run_ranks(cells_on_rank)
    assert ranks[0] == ranks[1]  # each rank returns the whole batch's outputs: the same outcome
    r = ranks[0]
    for model in MODELS:
        for graph in ("piecewise", "breakable"):
            status, reason, pieces, tp1_diff = r[model, graph]
            assert status == Status.PASS, (model, graph, reason)
            assert tp1_diff is not None and tp1_diff < 1e-5, (model, graph, tp1_diff)  # float32: DP eager = TP1 eager
    # 2 layers: the dense model's forward is cut by its 2 attentions only (its MLPs run on the local rows); Qwen3-MoE's
    # also by a gather per MoE block
    assert r["llama-3.1-8b", "piecewise"][2] == 3 and r["qwen3-30b-a3b", "piecewise"][2] == 5
    status, reason = r["wrong_rows"]
    assert status == Status.FAIL_ACCURACY and "dp2 eager differs from tp1 eager" in reason, reason
    status, reason = r["linear"]
    assert status == Status.UNSUPPORTED and "linear-attention" in reason, reason


def engine_on_rank(rank: int) -> dict:
    from harness.cards import find_card
    from pcg_core.config import CaptureConfig, EngineConfig
    from pcg_core.distributed import init_from_env
    from pcg_core.distributed.data_parallel import data_parallel_model
    from pcg_core.engine import Engine
    from pcg_core.model import load_model

    lm = load_model(find_card("qwen3-30b-a3b").config, tiny=True, dtype=torch.float32, device="cpu", seed=0)
    data_parallel_model(lm.model, init_from_env("cpu"))
    engine = Engine(lm.model, EngineConfig(capture=CaptureConfig(backend="piecewise", max_tokens=64), kv_slots=512))
    before = [k.clone() for k in engine.cache.k]
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]]  # sequences 0 and 2 on rank 0, sequence 1 on rank 1
    outs = engine.generate(prompts, 2, prompt_logprobs=True)
    written = set()
    for layer, (old, new) in enumerate(zip(before, engine.cache.k)):
        changed = (old != new).flatten(1).any(1).nonzero().flatten().tolist()
        written |= {int(engine.cache.slot_seq[s]) for s in changed if s < engine.cache.num_slots}
    return {"written": written, "tokens": [o.output_ids for o in outs],
            "logprobs": [o.prompt_logprobs for o in outs]}


@pytest.mark.slow
def test_each_dp_rank_writes_only_its_own_sequences_kv_and_all_return_every_sequence():
    r0, r1 = run_ranks(engine_on_rank)
    assert r0["written"] == {0, 2} and r1["written"] == {1}
    assert r0["tokens"] == r1["tokens"] and r0["logprobs"] == r1["logprobs"] and len(r0["tokens"]) == 3


def test_the_pre_check_runs_dp2_and_ep2_alone():
    assert parallel_unsupported_reason("dp2", graph="piecewise") is None
    assert parallel_unsupported_reason("ep2", graph="breakable") is None
    assert "data-parallel attention 8 is not run yet" in parallel_unsupported_reason("dp8")
    assert "data-parallel attention combined with other kinds" in parallel_unsupported_reason("tp4-dp2")
    assert parallel_unsupported_reason("pp2-dp2", graph="piecewise") is None
