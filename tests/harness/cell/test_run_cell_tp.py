"""A TP=2 cell as the launcher runs it: two processes (gloo ranks) with torch's env:// variables, each calling
run_cell(spec) with the same spec; both return the same outcome (rank 0's is the one recorded)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from harness.cell.run import run_cell
from harness.cell.spec import CellSpec
from harness.outcome import Status
from pcg_core.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "pcg_core" / "distributed"))
from tp_ranks import planted_after_sharding, run_ranks  # noqa: E402

SMALL = {"tiny": True, "max_tokens": 64, "max_new_tokens": 2, "latency_repeat": 1}


def cells_on_rank(rank: int) -> dict:
    out = {}
    for graph in ("piecewise", "breakable"):
        o = run_cell(CellSpec("llama-3.1-8b", graph=graph, parallel="tp2", **SMALL))
        out[graph] = (o.status, o.reason, o.metrics.capture.pieces, o.metrics.judge.tp1_logprob_diff)
    o = run_cell(CellSpec("qwen3-next-80b-a3b", graph="piecewise", parallel="tp2", **SMALL))
    out["linear"] = (o.status, o.reason, o.metrics.judge.tp1_logprob_diff)
    for vlm in ("qwen2.5-vl-7b", "qwen3-vl-30b-a3b"):  # the vision tower whole on every rank, the text decoder sharded
        o = run_cell(CellSpec(vlm, graph="breakable", parallel="tp2", **SMALL))
        out[vlm] = (o.status, o.reason, o.metrics.judge.tp1_logprob_diff)
    def drop_one_all_reduce(model):  # planted: layer 1's MLP partial sum never reduced
        model.model.layers[1].mlp.down_proj.__class__ = torch.nn.Linear

    with planted_after_sharding(drop_one_all_reduce):
        o = run_cell(CellSpec("llama-3.1-8b", graph="piecewise", parallel="tp2", **SMALL))
    out["fault"] = (o.status, o.reason)
    return out


@pytest.mark.slow
def test_llama_qwen3_next_and_vlm_tp2_cells_pass_on_both_ranks_and_a_dropped_all_reduce_fails():
    ranks = run_ranks(cells_on_rank)
    faults = [r.pop("fault") for r in ranks]  # a fault's ranks hold different partial sums: their numbers differ
    assert ranks[0] == ranks[1]  # the ranks agree on everything the outcome records
    for graph in ("piecewise", "breakable"):
        status, reason, pieces, tp1_diff = ranks[0][graph]
        assert status == Status.PASS, (graph, reason)
        assert tp1_diff is not None and tp1_diff < 1e-5  # float32: TP2 eager vs TP1 eager, same weights
        assert pieces == 7  # 2 layers: 2 attentions and 4 all-reduces cut the forward into 7
    for status, reason in faults:
        assert status == Status.FAIL_ACCURACY and "tp2 eager differs from tp1 eager" in reason, reason
    status, reason, tp1_diff = ranks[0]["linear"]  # Gated DeltaNet by key-head group, each rank its heads' state
    assert status == Status.PASS and tp1_diff is not None and tp1_diff < 1e-5, (reason, tp1_diff)
    for vlm in ("qwen2.5-vl-7b", "qwen3-vl-30b-a3b"):
        status, reason, tp1_diff = ranks[0][vlm]
        assert status == Status.PASS and tp1_diff is not None and tp1_diff < 1e-5, (vlm, reason, tp1_diff)


def test_a_tp2_cell_in_a_single_process_says_how_to_start_it(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="runs as 2 processes, one per rank.*pcgh cell --parallel"):
        run_cell(CellSpec("llama-3.1-8b", parallel="tp2", **SMALL))


def moe_and_mla_cells_on_rank(rank: int) -> dict:
    return {(model, graph): (o.status, o.reason, o.metrics.judge.tp1_logprob_diff)
            for model in ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3") for graph in ("piecewise", "breakable")
            for o in [run_cell(CellSpec(model, graph=graph, parallel="tp2", **SMALL))]}


@pytest.mark.slow
def test_moe_and_mla_tp2_cells_pass_under_piecewise_and_breakable():
    """Qwen3-MoE and Mixtral (experts sliced along their intermediate size, summed over ranks) and DeepSeek-V3 (MLA
    heads sharded, the latent whole; a dense then a MoE layer with its shared expert)."""
    ranks = run_ranks(moe_and_mla_cells_on_rank)
    assert ranks[0] == ranks[1]
    for key, (status, reason, tp1_diff) in ranks[0].items():
        assert status == Status.PASS and tp1_diff < 1e-5, (key, reason, tp1_diff)
