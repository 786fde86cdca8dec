"""Graph memory against the KV cache (harness/cell/memory.py): the largest context beside the weights with the graph
pool and without it, and the verdict's memory line past the matrix's share — the status untouched."""

from __future__ import annotations

import pytest
import torch

from harness.cell import CellSpec, run_cell
from harness.cell.memory import GIB, memory_fit, weights_bytes
from harness.metrics import CellMetrics
from harness.outcome import Status


def _m(pool_gib: float, weights_gib: float = 10.0, per_token: int = 1 << 17) -> CellMetrics:
    return CellMetrics(graph_pool_bytes=int(pool_gib * GIB), weights_bytes=int(weights_gib * GIB),
                       kv_bytes_per_token=per_token)


def test_the_context_with_and_without_graphs_and_the_line_past_the_share():
    m = _m(1.0)  # 100 GiB budget, 10 GiB weights: 90 GiB room, the pool 1.1% of it
    assert memory_fit(m, 100 * GIB, 0.10) is None
    assert m.memory.max_context_tokens_without_graphs == 90 * GIB // (1 << 17) == 737_280
    assert m.memory.max_context_tokens == 89 * GIB // (1 << 17)
    m = _m(18.0)  # 20% of the room
    line = memory_fit(m, 100 * GIB, 0.10)
    assert line.startswith("memory: the graph pool (18.00 GiB) takes 20% of what the KV cache could have had")
    assert "over the 10% allowed" in line and f"{m.memory.max_context_tokens:,} tokens of context instead of 737,280" in line
    assert memory_fit(_m(18.0), 100 * GIB, 0.25) is None  # the matrix may allow more
    line = memory_fit(_m(1.0, weights_gib=120), 100 * GIB, 0.10)
    assert "no room for a KV cache" in line
    m = _m(5.0)
    assert memory_fit(m, None, 0.10) is None and m.memory.max_context_tokens is None  # off CUDA: nothing to weigh


def test_weights_count_each_storage_once():
    lin = torch.nn.Linear(8, 4, bias=False)
    model = torch.nn.Sequential(lin, torch.nn.Linear(4, 8, bias=False))
    model[1].weight = torch.nn.Parameter(lin.weight.t())  # shares lin's storage (tied)
    assert weights_bytes(model) == 8 * 4 * 4


@pytest.mark.parametrize("share,lined", [(0.10, False), (1e-9, True)])
def test_a_cell_records_its_memory_and_the_line_leaves_the_status(monkeypatch, share, lined):
    """On the CPU no graph pool exists; a cell with a stand-in GPU budget and pool still records weights, the
    context both ways, and the line only past its share."""
    import harness.cell.run as run

    def fit(m, budget, share):  # a 64 MiB pool, as a CUDA capture would have recorded
        m.capture.graph_pool_bytes = 64 << 20
        return memory_fit(m, budget, share)

    monkeypatch.setattr(run, "memory_budget", lambda device: 4 * GIB)
    monkeypatch.setattr(run, "memory_fit", fit)
    r = run_cell(CellSpec(model="qwen3-0.6b", tiny=True, max_tokens=64, max_new_tokens=3, memory_share=share))
    m = r.metrics
    assert r.status == Status.PASS, r.reason
    assert 0 < m.memory.weights_bytes < 4 * GIB and m.memory.memory_budget_bytes == 4 * GIB
    assert m.memory.max_context_tokens < m.memory.max_context_tokens_without_graphs
    assert ("memory: the graph pool" in r.reason) == lined, r.reason
