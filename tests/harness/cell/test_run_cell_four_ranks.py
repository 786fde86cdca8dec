"""Cells of four ranks as the launcher runs them (four gloo ranks, each run_cell with the same spec): a pipeline of
four stages, data-parallel attention over four ranks, and four ranks each holding a quarter of the routed experts,
each held to TP1 eager on the same weights, graphs bitwise equal to eager at the same padding; and modes of several
kinds (pipeline stages of TP, DP or EP; TP attention in data-parallel groups), with ranks put in the wrong group
planted. Four processes on a 2-core machine: slow."""

from __future__ import annotations

import sys
from dataclasses import replace
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


# Modes of several kinds: two pipeline stages each running another mode, and TP attention in data-parallel groups
# (the experts by TP, by index within each TP group, or over all four ranks).
MIXED = (("llama-3.1-8b", "tp2-pp2", "breakable"), ("qwen3-30b-a3b", "pp2-dp2", "piecewise"),
         ("mixtral-8x7b", "pp2-ep2", "breakable"), ("qwen3-30b-a3b", "tp2-pp2-ep2", "piecewise"),
         ("llama-3.1-8b", "tp2-dp2", "piecewise"), ("qwen3-30b-a3b", "tp2-dp2", "breakable"),
         ("deepseek-v3", "tp2-dp2", "piecewise"), ("qwen3-30b-a3b", "tp2-dp2-ep2", "piecewise"),
         ("mixtral-8x7b", "tp2-ep4", "breakable"))
DISPATCH = {"tp2-pp2": None, "pp2-dp2": None, "pp2-ep2": "all_to_all", "tp2-pp2-ep2": "all_reduce", "tp2-dp2": None,
            "tp2-dp2-ep2": "all_reduce", "tp2-ep4": "all_gather"}
real_mesh_groups = cell_parallel.mesh_groups


def _stage_rank_from_world(world, stages, tp):
    """Planted: each stage's ranks numbered world rank // stages (0, 0, 1, 1), so both ranks of a stage keep the
    same TP shard and their all-reduce sums one half twice; the collectives still pair up (no hang)."""
    mesh = real_mesh_groups(world, stages, tp)
    stage = mesh.stage
    return replace(mesh, stage=ParallelGroup(world.rank // stages, stage.size, stage.name, stage.backend))


def _odd_tp_rank_in_the_other_dp_group(world, stages, tp):
    """Planted: the second rank of each TP group numbers itself as the other data-parallel rank, so it attends over
    the other group's sequences while its TP partner attends over its own; their all-reduces still pair up (every
    DP group agrees on the same widest count), summing partials of different sequences."""
    mesh = real_mesh_groups(world, stages, tp)
    dp = mesh.dp
    if mesh.tp.rank % 2:
        dp = ParallelGroup(dp.size - 1 - dp.rank, dp.size, dp.name, dp.backend)
    return replace(mesh, dp=dp)


def mixed_cells_on_rank(rank: int) -> dict:
    out = {}
    for model, parallel, graph in MIXED:
        o = run_cell(CellSpec(model, graph=graph, parallel=parallel, **SMALL))
        out[model, parallel, graph] = (o.status, o.reason, o.metrics.judge.tp1_logprob_diff,
                                       o.metrics.settings.expert_dispatch)
    o = run_cell(CellSpec("llama-3.1-8b", graph="piecewise", parallel="tp2-dp4", **SMALL))
    out["refused"] = (o.status, o.reason)
    for name, plant, model, parallel in (("stage", _stage_rank_from_world, "llama-3.1-8b", "tp2-pp2"),
                                         ("dp", _odd_tp_rank_in_the_other_dp_group, "qwen3-30b-a3b", "tp2-dp2")):
        cell_parallel.mesh_groups = plant
        try:
            o = run_cell(CellSpec(model, graph="piecewise", parallel=parallel, **SMALL))
        finally:
            cell_parallel.mesh_groups = real_mesh_groups
        out[name] = (o.status, o.reason)
    return out


@pytest.mark.slow
def test_modes_of_several_kinds_pass_on_four_ranks_and_ranks_in_the_wrong_group_fail():
    ranks = run_ranks(mixed_cells_on_rank, world=4)
    for r in ranks:  # the planted garbage differs by rank; it fails on each
        for name, parallel in (("stage", "tp2-pp2"), ("dp", "tp2-dp2")):
            status, reason = r.pop(name)
            assert status == Status.FAIL_ACCURACY and f"{parallel} eager differs from tp1 eager" in reason, (name, reason)
    assert all(r == ranks[0] for r in ranks)  # every rank records the same outcome
    r = ranks[0]
    status, reason = r.pop("refused")
    assert status == Status.UNSUPPORTED and "tp2-dp4" in reason, reason
    for (model, parallel, graph), (status, reason, tp1_diff, how) in r.items():
        assert status == Status.PASS, (model, parallel, graph, reason)
        assert tp1_diff is not None and tp1_diff < 1e-5, (model, parallel, graph, tp1_diff)
        assert how == DISPATCH[parallel], (parallel, how)


def test_experts_over_neither_the_tp_group_nor_the_whole_stage_are_refused_before_any_group_is_used():
    """tp2-dp4-ep4 (8 ranks): experts over 4 of 8, which is neither the TP group (2) nor every rank of the stage (8);
    refused with the reason, never sharded half-way (no process group is touched: the groups here are only records)."""
    from pcg_core.errors import UnsupportedModel
    from pcg_core.distributed.group import Mesh

    def group(rank: int, size: int) -> ParallelGroup:
        return ParallelGroup(rank, size, f"fake{size}", "gloo")

    mesh = Mesh(stage=group(0, 8), tp=group(0, 2), dp=group(0, 4))
    with pytest.raises(UnsupportedModel, match="experts spread over 4 of a stage's 8 ranks"):
        cell_parallel._stage_part(None, mesh, {"tp": 2, "dp": 4, "ep": 4}, "piecewise")
