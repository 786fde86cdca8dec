"""A PP=2 cell as the launcher runs it: two gloo ranks, each a contiguous stage of the decoder layers, the hidden
state handed on by pcg::pipeline_pass_ between graphs; PP eager is held to TP1 eager on the same weights, which is
the only check that sees a stage that hands on the wrong state (graph and eager share it)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.cell.run import run_cell
from harness.cell.spec import CellSpec
from harness.outcome import Status
from pcg_core.capabilities import parallel_unsupported_reason
from pcg_core.distributed.pipeline import stage_bounds
from pcg_core.errors import UnsupportedModel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "pcg_core" / "distributed"))
from tp_ranks import run_ranks  # noqa: E402

SMALL = {"tiny": True, "max_tokens": 64, "max_new_tokens": 2, "latency_repeat": 1}


@contextmanager
def planted_after_staging(plant):
    """Every cell's model goes through plant(model, record) right after run_cell stages it."""
    import harness.cell.parallel as run

    real = run.pipeline_model

    def staged_then_planted(model, group):
        record = real(model, group)
        plant(model, record)
        return record

    run.pipeline_model = staged_then_planted
    try:
        yield
    finally:
        run.pipeline_model = real


def _no_hand_off(model, record):  # planted: stage 0's output never reaches stage 1 (it runs on its own embeddings)
    model.get_decoder().layers[record.bounds[0][1] - 1].pcg_pp_pass = None


def _last_stage_from_rank0(model, record):  # planted: the final broadcast from the first stage, not the last
    layers = model.get_decoder().layers
    layers[len(layers) - 1].pcg_pp_pass = (0, -1)


def cells_on_rank(rank: int) -> dict:
    out = {}
    for model in ("llama-3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3"):
        for graph in ("piecewise", "breakable"):
            o = run_cell(CellSpec(model, graph=graph, parallel="pp2", **SMALL))
            out[model, graph] = (o.status, o.reason, o.metrics.capture.pieces, o.metrics.judge.tp1_logprob_diff)
    o = run_cell(CellSpec("llama-3.1-8b", graph="full", parallel="pp2", **SMALL))
    out["full"] = (o.status, o.reason)
    for name, plant in (("no_hand_off", _no_hand_off), ("from_rank0", _last_stage_from_rank0)):
        with planted_after_staging(plant):
            o = run_cell(CellSpec("llama-3.1-8b", graph="piecewise", parallel="pp2", **SMALL))
        out[name] = (o.status, o.reason)
    return out


@pytest.mark.slow
def test_pp2_cells_pass_for_dense_moe_and_mla_and_a_wrong_hand_off_fails():
    ranks = run_ranks(cells_on_rank)
    # each rank's forward is cut where its own split ops are: rank 0 runs layer 0's attention, then the hand-off and
    # (its layer 1 skipped) the broadcast back to back: 3 pieces; rank 1 the hand-off into its stream, layer 1's
    # attention and the broadcast: 4. Everything else the outcome records is the same on both ranks (each ends with
    # the last stage's hidden state, so the same logits and tokens).
    pieces = [{k: v[2] for k, v in r.items() if isinstance(k, tuple) and k[1] == "piecewise"} for r in ranks]
    assert set(pieces[0].values()) == {3} and set(pieces[1].values()) == {4}, pieces
    for r in ranks:
        for k, v in r.items():
            if isinstance(k, tuple):
                r[k] = v[:2] + v[3:]
    assert ranks[0] == ranks[1]
    r = ranks[0]
    for model in ("llama-3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3"):
        for graph in ("piecewise", "breakable"):
            status, reason, tp1_diff = r[model, graph]
            assert status == Status.PASS, (model, graph, reason)
            assert tp1_diff is not None and tp1_diff < 1e-5, (model, graph, tp1_diff)  # float32: PP eager = TP1 eager
    status, reason = r["full"]
    assert status == Status.UNSUPPORTED and "between graphs" in reason, reason
    for name in ("no_hand_off", "from_rank0"):
        status, reason = r[name]
        assert status == Status.FAIL_ACCURACY and "pp2 eager differs from tp1 eager" in reason, (name, reason)


def test_stages_are_contiguous_and_even_and_more_stages_than_layers_are_refused():
    assert stage_bounds(2, 2) == ((0, 1), (1, 2))
    assert stage_bounds(7, 3) == ((0, 3), (3, 5), (5, 7))
    assert stage_bounds(61, 4) == ((0, 16), (16, 31), (31, 46), (46, 61))
    with pytest.raises(UnsupportedModel, match="fewer than its 4 stages"):
        stage_bounds(3, 4)


def test_the_pre_check_names_what_pp_cannot_run_under():
    assert parallel_unsupported_reason("pp2", graph="piecewise") is None
    assert parallel_unsupported_reason("pp2", graph="breakable") is None
    assert "between graphs" in parallel_unsupported_reason("pp2", graph="full")
    assert parallel_unsupported_reason("tp2-pp2", graph="breakable") is None
    assert "between graphs" in parallel_unsupported_reason("tp2-pp2", graph="full")
    assert "as two stages of another mode" in parallel_unsupported_reason("pp2-dp4")
