"""tp2-ep2 cells (two gloo ranks): the attention sharded as at tp2, the routed experts split by expert index — each
rank whole experts, the others' routes zero-weighted, the partial sums added over ranks. Qwen3-MoE, Mixtral and
DeepSeek-V3 pass under piecewise and breakable with TP=2 eager equal to the unsharded model's; a rank that serves
the other's experts range fails that check; a dense model is refused with the reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.cell.run import run_cell
from harness.cell.spec import CellSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "pcg_core" / "distributed"))
from tp_ranks import planted_after_sharding, run_ranks  # noqa: E402

SMALL = {"tiny": True, "max_tokens": 64, "max_new_tokens": 2, "latency_repeat": 1}
MOES = ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3")


def _wrong_range(rank: int) -> tuple[str, str]:
    """Planted: rank 1's experts module of layer 1 answers for rank 0's experts (its start index is rank 0's)."""
    def plant(model):
        if rank == 1:
            model.model.layers[1].mlp.experts.ep_start = 0

    with planted_after_sharding(plant):
        o = run_cell(CellSpec("qwen3-30b-a3b", graph="piecewise", parallel="tp2-ep2", **SMALL))
    return str(o.status), o.reason


def cells_on_rank(rank: int) -> dict:
    out = {(model, graph): (str(o.status), o.reason, o.metrics.judge.tp1_logprob_diff, o.metrics.process.rank_statuses)
           for model in MOES for graph in ("piecewise", "breakable")
           for o in [run_cell(CellSpec(model, graph=graph, parallel="tp2-ep2", **SMALL))]}
    o = run_cell(CellSpec("llama-3.1-8b", graph="piecewise", parallel="tp2-ep2", **SMALL))
    out["dense"] = (str(o.status), o.reason)
    out["fault"] = _wrong_range(rank)
    return out


@pytest.mark.slow
def test_ep2_cells_pass_a_wrong_expert_range_fails_and_a_dense_model_is_refused():
    ranks = run_ranks(cells_on_rank)
    faults = [r.pop("fault") for r in ranks]
    assert ranks[0] == ranks[1]
    for key, value in ranks[0].items():
        if key == "dense":
            continue
        status, reason, tp1, _ = value
        assert status == "pass", (key, reason)
        assert tp1 is not None and tp1 < 1e-5, (key, tp1)  # float32: the same experts, other summation order
    status, reason = ranks[0]["dense"]
    assert status == "unsupported" and "no routed experts" in reason, reason
    status, reason = faults[0]
    assert status == "fail_accuracy" and "tp2-ep2 eager differs from tp1 eager" in reason, reason
