"""Quantized TP=2 cells as the launcher runs them (two gloo ranks, each run_cell with the same spec): an 8-bit scheme
with per-token activations and an int4 one pass under piecewise and breakable, TP=2 eager equal to the unsharded
model's (its activations rounded per K half where the ranks round them so); a wrong scale slice on one rank and a
quantized row-parallel layer left unreduced fail that check; quantized experts and FP4 say what is not sharded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.cell.run import run_cell
from harness.cell.spec import CellSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "pcg_core" / "distributed"))
from tp_ranks import planted_after_sharding, run_ranks  # noqa: E402

SMALL = {"tiny": True, "max_tokens": 64, "max_new_tokens": 2, "latency_repeat": 1}


def _planted(rank: int, fault: str) -> tuple[str, str]:
    from pcg_core.quant.layers.linear import QuantLinear

    def plant(model):
        layer = model.model.layers[1]
        if fault == "scale" and rank == 1:  # rank 1 scales its q_proj rows with rank 0's per-channel scales
            q = layer.self_attn.q_proj
            q.weight_scale = q.weight_scale.roll(q.weight_scale.shape[0] // 2, 0)
        if fault == "reduce":  # layer 1's quantized down_proj: its partial sum never reduced
            down = layer.mlp.down_proj
            down.forward = lambda x: QuantLinear.forward(down, x) + (0 if down.tp_bias is None else down.tp_bias)

    with planted_after_sharding(plant):
        o = run_cell(CellSpec("llama-3.1-8b", graph="piecewise", parallel="tp2", quant="int8_w8a8", **SMALL))
    return str(o.status), o.reason


def cells_on_rank(rank: int) -> dict:
    out = {}
    for quant, graph in (("int8_w8a8", "piecewise"), ("int8_w8a8", "breakable"), ("awq", "piecewise")):
        o = run_cell(CellSpec("llama-3.1-8b", graph=graph, parallel="tp2", quant=quant, **SMALL))
        out[(quant, graph)] = (str(o.status), o.reason, o.metrics.pieces, o.metrics.tp1_logprob_diff,
                               o.metrics.quant_logprob_diff)
    o = run_cell(CellSpec("qwen3-30b-a3b", graph="piecewise", parallel="tp2", quant="int8_w8a8", **SMALL))
    out["experts"] = (str(o.status), o.reason)
    for fault in ("scale", "reduce"):
        out[fault] = _planted(rank, fault)
    return out


@pytest.mark.slow
def test_quantized_tp2_cells_pass_and_planted_shard_faults_fail_the_tp1_check():
    ranks = run_ranks(cells_on_rank)
    faults = [(r.pop("scale"), r.pop("reduce")) for r in ranks]
    assert ranks[0] == ranks[1]
    for (quant, graph), (status, reason, pieces, tp1, qerr) in ((k, v) for k, v in ranks[0].items() if k != "experts"):
        assert status == "pass", (quant, graph, reason)
        assert tp1 is not None and tp1 < 1e-5, (quant, graph, tp1)  # float32: the same rounding, other sum order
        assert qerr is not None and qerr > 1e-2  # the scheme does cost something: the check is not vacuous
        if graph == "piecewise":
            assert pieces == 7  # 2 layers: 2 attentions and 4 all-reduces, as unquantized
    status, reason = ranks[0]["experts"]
    assert status == "unsupported" and "quantized experts" in reason, reason
    for scale, reduce in faults:
        for status, reason in (scale, reduce):
            assert status == "fail_accuracy" and "tp2 eager differs from tp1 eager" in reason, reason
