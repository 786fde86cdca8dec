"""Qwen3-Next tiny through run_cell on the CPU: the cell passes under piecewise and breakable, `full` is unsupported
with the split op's reason, and a state pool whose reused slots keep their state is caught: eager and graph share
the fault, but the judge's first layer runs eager twice on the same prompts, and the second run starts from the
states the first one left."""

import pytest

from harness.cell import CellSpec, run_cell
from harness.outcome import Status
from pcg_core.linear_attention.state import LinearStatePool

MODEL = "qwen3-next-80b-a3b"


@pytest.mark.parametrize("graph", ["piecewise", "breakable"])
def test_qwen3_next_tiny_cell_passes(graph):
    r = run_cell(CellSpec(model=MODEL, tiny=True, graph=graph, max_tokens=16, max_new_tokens=4))
    assert r.status == Status.PASS, r.reason
    assert r.metrics.capture.pieces == 3 and r.metrics.judge.reference.status == "pass" and r.metrics.judge.reference.positions > 0


def test_full_is_unsupported_with_the_split_ops_reason():
    r = run_cell(CellSpec(model=MODEL, tiny=True, graph="full", max_tokens=16, max_new_tokens=4))
    assert r.status == Status.UNSUPPORTED and "pcg::linear_attention" in r.reason


def test_a_state_slot_not_reset_is_caught(monkeypatch):
    monkeypatch.setattr(LinearStatePool, "_zero", lambda self, slot: None)  # planted: reused slots keep their state
    r = run_cell(CellSpec(model=MODEL, tiny=True, graph="breakable", max_tokens=16, max_new_tokens=4))
    assert r.status == Status.EAGER_NONDETERMINISTIC and "two eager runs of the same prompts differ" in r.reason
