"""Cells of four ranks as the launcher runs them (four gloo ranks, each run_cell with the same spec): a pipeline of
four stages, data-parallel attention over four ranks, and four ranks each holding a quarter of the routed experts,
each held to TP1 eager on the same weights, graphs bitwise equal to eager at the same padding. Four processes on a
2-core machine: slow."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.cell.run import run_cell
from harness.cell.spec import CellSpec
from harness.outcome import Status

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
