"""Cells of four ranks as the launcher runs them (four gloo ranks, each run_cell with the same spec): a pipeline of
four stages, data-parallel attention over four ranks, and four ranks each holding a quarter of the routed experts,
each held to TP1 eager on the same weights, graphs bitwise equal to eager at the same padding; and two pipeline
stages each running another mode over a stage group of its own (tp2-pp2, pp2-dp2, pp2-ep2, tp2-pp2-ep2). Four
processes on a 2-core machine: slow."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.cell.run import run_cell
import harness.cell.parallel as cell_parallel
from harness.cell.spec import CellSpec
from harness.outcome import Status
from pcg_core.distributed import ParallelGroup

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "pcg_core" / "distributed"))
from tp_ranks import run_ranks  # noqa: E402

SMALL = {"tiny": True, "max_tokens": 64, "max_new_tokens": 2, "latency_repeat": 1}
CELLS = (("llama-3.1-8b", "pp4", 4), ("qwen3-30b-a3b", "dp4", None), ("mixtral-8x7b", "ep4", None))


def cells_on_rank(rank: int) -> dict:
    out = {}
    for model, parallel, layers in CELLS:
        o = run_cell(CellSpec(model, graph="piecewise", parallel=parallel, layers=layers, **SMALL))
        out[parallel] = (o.status, o.reason, o.metrics.judge.tp1_logprob_diff, o.metrics.process.gpus)
    return out


@pytest.mark.slow
def test_pp4_dp4_and_ep4_cells_pass_on_four_ranks_and_match_tp1():
    ranks = run_ranks(cells_on_rank, world=4)
    assert all(r == ranks[0] for r in ranks)  # every rank records the same outcome
    for parallel, (status, reason, tp1_diff, gpus) in ranks[0].items():
        assert status == Status.PASS, (parallel, reason)
        assert tp1_diff is not None and tp1_diff < 1e-5, (parallel, tp1_diff)


STAGED = (("llama-3.1-8b", "tp2-pp2", "piecewise"), ("llama-3.1-8b", "tp2-pp2", "breakable"),
          ("qwen3-30b-a3b", "pp2-dp2", "piecewise"), ("mixtral-8x7b", "pp2-ep2", "breakable"),
          ("qwen3-30b-a3b", "tp2-pp2-ep2", "piecewise"))


def _stage_rank_from_world(world, stages):
    """Planted: each stage's ranks numbered world rank // stages (0, 0, 1, 1), so both ranks of a stage keep the
    same TP shard and their all-reduce sums one half twice; the collectives still pair up (no hang)."""
    stage, pipe = real_stage_groups(world, stages)
    return ParallelGroup(world.rank // stages, stage.size, stage.name, stage.backend), pipe


real_stage_groups = cell_parallel.stage_groups


def staged_cells_on_rank(rank: int) -> dict:
    out = {}
    for model, parallel, graph in STAGED:
        o = run_cell(CellSpec(model, graph=graph, parallel=parallel, **SMALL))
        out[model, parallel, graph] = (o.status, o.reason, o.metrics.judge.tp1_logprob_diff, o.metrics.process.gpus,
                                       o.metrics.settings.expert_dispatch)
    cell_parallel.stage_groups = _stage_rank_from_world
    try:
        o = run_cell(CellSpec("llama-3.1-8b", graph="piecewise", parallel="tp2-pp2", **SMALL))
    finally:
        cell_parallel.stage_groups = real_stage_groups
    out["planted"] = (o.status, o.reason)
    return out


@pytest.mark.slow
def test_pipeline_stages_of_tp_dp_and_ep_pass_on_four_ranks_and_a_stage_keeping_the_wrong_shard_fails():
    ranks = run_ranks(staged_cells_on_rank, world=4)
    assert all(r == ranks[0] for r in ranks)
    r = ranks[0]
    dispatch = {"tp2-pp2": None, "pp2-dp2": None, "pp2-ep2": "all_to_all", "tp2-pp2-ep2": "all_reduce"}
    for (model, parallel, graph), (status, reason, tp1_diff, gpus, how) in ((k, v) for k, v in r.items() if k != "planted"):
        assert status == Status.PASS, (model, parallel, graph, reason)
        assert tp1_diff is not None and tp1_diff < 1e-5, (model, parallel, graph, tp1_diff)
        assert how == dispatch[parallel], (parallel, how)
    status, reason = r["planted"]
    assert status == Status.FAIL_ACCURACY and "tp2-pp2 eager differs from tp1 eager" in reason, reason
