"""`pcgh request`'s graph memory: the estimated pool per capture backend that can hold the model, at the TP size
whose weights leave room (in the checkpoint's own width), the context beside weights and graphs, and a `memory` note
past 10% of the KV cache's room — the cell's own rule (harness/cell/memory.py), from the config alone."""

from __future__ import annotations

import pytest
from request_helpers import load_config

from harness.request.analyze import analyze
from harness.request.graph_memory import MEMORY_SHARE, memory_note
from harness.shape.graph_pool import context_fit, estimate_pool, features, table
from harness.shape.structure import read_structure


def test_a_hybrid_model_gets_no_full_graph_estimate():
    g = analyze(load_config("Qwen__Qwen3-Next-80B-A3B-Instruct.json"))["graph_memory"]
    assert set(g["by_graph"]) == {"piecewise", "breakable"}  # full cannot hold pcg::linear_attention


def test_an_fp8_checkpoint_is_weighed_in_fp8_and_its_mla_pool_is_large():
    r = analyze(load_config("deepseek-ai__DeepSeek-V3.json"))
    g = r["graph_memory"]
    assert g["tp"] == 8 and g["weights_fit"]  # 671 GB of FP8 over 8 H200s; bf16 would not fit
    assert g["weights_bytes"] < 0.75 * g["budget_bytes"]
    for v in g["by_graph"].values():
        assert v["pool_bytes"] > 1 << 30  # MLA's absorbed heads: gigabytes, not the dense model's hundreds of MB
        assert 0 < v["context_tokens"] < g["context_tokens_without_graphs"]


def test_weights_that_fill_the_gpus_leave_no_context():
    g = analyze(load_config("moonshotai__Kimi-K2-Instruct.json"))["graph_memory"]
    assert g["tp"] == 8 and not g["weights_fit"]
    assert all(v["pool_share"] is None for v in g["by_graph"].values()) and memory_note(g) is None


@pytest.mark.parametrize("layers,noted", [(300, False), (310, True)])
def test_the_memory_note_appears_past_the_share(layers, noted):
    c = load_config("Qwen__Qwen3-8B.json")
    c["num_hidden_layers"] = layers  # the weights leave ~7 GiB of room at 300 layers, ~4 at 310
    r = analyze(c, tps=[1])
    notes = [n for n in r["notes"] if n.startswith("memory:")]
    shares = [v["pool_share"] for v in r["graph_memory"]["by_graph"].values()]
    assert bool(notes) == noted == any(s > MEMORY_SHARE for s in shares)
    if noted:
        assert "piecewise" in notes[0] and "tokens without graphs" in notes[0]


def test_the_pool_scales_with_tokens_and_tp_and_not_with_depth():
    c = load_config("Qwen__Qwen3-30B-A3B.json")
    s = read_structure(c, "t")
    const = table()["coefficients"]["piecewise"]["const"] * (1 << 20)
    p4096, p2048 = (estimate_pool(s, t).by_graph["piecewise"] - const for t in (4096, 2048))
    assert p4096 == pytest.approx(2 * p2048, rel=1e-6)
    assert estimate_pool(s, 4096, tp=4).by_graph["piecewise"] < estimate_pool(s, 4096).by_graph["piecewise"]
    deeper = read_structure({**c, "num_hidden_layers": 2 * c["num_hidden_layers"]}, "t")
    assert features(deeper, 4096) == features(s, 4096)
    assert "disabled" not in estimate_pool(s, 4096).by_graph


def test_context_fit_is_the_cells_rule():
    fit = context_fit(budget=100, weights=60, pool=8, kv_bytes_per_token=2.0)
    assert (fit.room, fit.tokens, fit.tokens_without_graphs) == (40, 16, 20) and fit.over(0.1) and not fit.over(0.2)
    assert context_fit(100, 120, 8, 2.0).tokens == 0


def test_a_plugin_capture_backend_without_measured_pools_gets_no_estimate():
    """A capture backend loaded from PCG_PLUGINS (tests' fault backends) is in the capability table but has no
    calibrated pool: the report leaves it out instead of failing."""
    from pcg_core.capabilities import capabilities

    caps = capabilities()
    caps["capture_backends"] = {**caps["capture_backends"], "a_plugin": {"requires_capturable_attention": False}}
    g = analyze(load_config("Qwen__Qwen3-8B.json"), caps=caps)["graph_memory"]
    assert set(g["by_graph"]) == {"piecewise", "breakable", "full"}
