"""The main job end to end (`pcgh run smoke.yaml` into SQLite, the report, `--resume`, `pcgh diff`), and the whole CPU
smoke matrix passing, run in shards so that pytest -n spreads its ~125 cells over the workers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from harness.cli import main
from harness.launcher.plan import RunOptions, plan
from harness.outcome import STATUSES
from harness.store import Store

SMOKE = Path(__file__).parents[2] / "harness" / "configs" / "smoke.yaml"
SHARDS = 4  # by a stable hash of the cell key (`pcgh run --shard`): ~31 launched cells a shard
RAY_SHARD = 0
# 7 linears per dense layer; 4 + the fused experts per MoE layer (every scheme, 8- and 4-bit); 2 layers
QUANT_LAYERS = {"llama-3.1-8b:tiny": 14, "qwen3-0.6b:tiny": 14, "qwen3-30b-a3b:tiny": 10}


def test_the_smoke_matrix_is_the_cells_we_expect():
    """The plan alone (no cell runs): which cells the matrix holds and which the pre-check refuses, and why."""
    cells = plan(SMOKE, RunOptions()).cells
    # unquantized: 14 models × 3 attention backends × 3 graph backends; 8-bit: 4 schemes × 3 models × sdpa, one
    # graph each (rotated); 4-bit weight-only (awq, gptq, nvfp4): 3 schemes × 3 models × sdpa, one graph each; the
    # FP8 KV cache: 4 cells;
    # TP=2: 4 models × {piecewise, breakable}, and Llama quantized (int8_w8a8 piecewise, awq breakable); tp2-ep2: 1;
    # pp2: Llama piecewise and DeepSeek-V3 breakable; dp2: Qwen3-MoE piecewise and DeepSeek-V3 breakable; ep2: 1
    assert len(cells) == 126 + 12 + 9 + 4 + 8 + 2 + 1 + 2 + 2 + 1
    launched = [c for c in cells if c.unsupported is None]
    # all 14 models (DeepSeek-V3 and Kimi-K2 with MLA, Qwen3-Next with linear attention, two VLMs) × {sdpa, flex} ×
    # 3 graphs, less Qwen3-Next under full (its linear-attention op cannot be captured: refused with the reason);
    # varlen is marked unsupported on the CPU, with the reason; each 8-bit scheme and each 4-bit weight-only one
    # (awq, gptq, nvfp4) on Llama, Qwen3 and Qwen3-MoE under one graph backend
    assert len(launched) == 82 + 12 + 9 + 4 + 8 + 2 + 1 + 2 + 2 + 1, [(c.key, c.unsupported) for c in cells]
    assert {c.axes["attention"] for c in launched} == {"sdpa", "flex"}
    runnable = {c.axes["model"] for c in launched}
    varlen = [c for c in cells if c.axes["attention"] == "varlen" and c.axes["model"] in runnable]
    assert len(varlen) == 42 and all(c.unsupported and "CUDA" in c.unsupported for c in varlen)
    next_full = [c for c in cells if c.axes["model"] == "qwen3-next-80b-a3b:tiny" and c.axes["graph"] == "full"
                 and c.axes["attention"] != "varlen"]
    assert len(next_full) == 2 and all(c.unsupported and "linear_attention" in c.unsupported for c in next_full)
    tp2 = [c for c in launched if c.axes["parallel"] == "tp2"]
    assert {(c.axes["model"], c.axes["graph"]) for c in tp2} == {
        (m, g) for m in ("llama-3.1-8b:tiny", "qwen3-30b-a3b:tiny", "mixtral-8x7b:tiny", "deepseek-v3:tiny")
        for g in ("piecewise", "breakable")}
    assert sorted((c.axes["quant"], c.axes["graph"]) for c in tp2 if c.axes["quant"] != "none") == [
        ("awq", "breakable"), ("int8_w8a8", "piecewise")]
    for mode, model in (("pp2", "llama-3.1-8b:tiny"), ("dp2", "qwen3-30b-a3b:tiny")):
        assert {(c.axes["model"], c.axes["graph"]) for c in launched if c.axes["parallel"] == mode} == {
            (model, "piecewise"), ("deepseek-v3:tiny", "breakable")}
    assert sum(c.axes["parallel"] in ("tp2-ep2", "ep2") for c in launched) == 2
    mla_flex = [c for c in launched if c.axes["model"] in ("deepseek-v3:tiny", "kimi-k2:tiny")
                and c.axes["attention"] == "flex"]
    assert len(mla_flex) == 7  # 6 + DeepSeek-V3's FP8 latent cache
    assert sum(c.axes["model"] == "grok-2:tiny" and c.axes["attention"] == "flex" for c in launched) == 3
    assert sum(c.axes["kv_cache"] == "fp8_e4m3" for c in launched) == 4
    quant = [c.axes["quant"] for c in launched if c.axes["parallel"] == "tp1"]
    assert sum(q not in ("none", "awq", "gptq", "nvfp4") for q in quant) == 12
    assert sum(q in ("awq", "gptq") for q in quant) == 6 and sum(q == "nvfp4" for q in quant) == 3
    # the rotation: one graph per (scheme, model); every scheme meets every graph, every model every graph
    quantized = [c.axes for c in launched if c.axes["parallel"] == "tp1" and c.axes["quant"] != "none"]
    assert len({(a["quant"], a["model"]) for a in quantized}) == len(quantized) == 21
    for axis in ("quant", "model"):
        assert all({a["graph"] for a in quantized if a[axis] == v} == {"piecewise", "breakable", "full"}
                   for v in {a[axis] for a in quantized}), axis
    assert sum(c.axes["model"] in ("qwen2.5-vl-7b:tiny", "qwen3-vl-30b-a3b:tiny") for c in launched) == 12
    # the shards below split the matrix whole: every cell in exactly one
    shards = [{c.key for c in plan(SMOKE, RunOptions(shard=(i, SHARDS))).cells} for i in range(SHARDS)]
    assert sorted(k for s in shards for k in s) == sorted(c.key for c in cells) and all(shards)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(SHARDS))
def test_every_launched_smoke_cell_passes(index, tmp_path):
    """One shard of the smoke matrix, run as CI's nightly shards run: every launched cell passes, and each kind of
    cell records what shows it ran as that kind (ranks, the unsharded comparison, quantized layers, KV scales)."""
    db = str(tmp_path / "smoke.db")
    # shard 0 through a Ray started on this machine (harness/launcher/ray_executor.py): the same statuses as the
    # local executor gives the other shards' cells
    executor = ["--executor", "ray"] if index == RAY_SHARD and importlib.util.find_spec("ray") else []
    try:
        assert main(["run", str(SMOKE), "--db", db, "--shard", f"{index}/{SHARDS}", "--logs", str(tmp_path / "logs"),
                     "--no-report", *executor]) == 0
    finally:
        if executor:
            import ray

            ray.shutdown()
    with Store(db) as store:
        run = store.run("latest")
        rows = store.results(run.id)
    assert run.status == "finished" and run.torch_version
    assert {r.key for r in rows} == {c.key for c in plan(SMOKE, RunOptions(shard=(index, SHARDS))).cells}
    assert all(r.status in STATUSES for r in rows)
    launched = [r for r in rows if r.status != "unsupported"]
    assert launched and all(r.passed for r in launched), [(r.key, r.status, r.reason) for r in launched if not r.passed]
    for r in launched:
        if r.axes["parallel"] != "tp1":  # two gloo processes: both ranks passed, and eager matches the same weights
            assert r.metrics.process.rank_statuses == ["pass", "pass"] and r.metrics.judge.tp1_logprob_diff is not None \
                and r.metrics.judge.tp1_logprob_diff < 1e-4, (r.key, r.metrics.process.rank_statuses, r.metrics.judge.tp1_logprob_diff)
        if r.axes["quant"] != "none":
            assert r.metrics.quant.quant_layers == QUANT_LAYERS[r.axes["model"]] and r.metrics.quant.quant_logprob_diff > 0, r.key
        if r.axes["kv_cache"] == "fp8_e4m3":
            assert r.metrics.quant.kv_scales == "calibrated", r.key


def test_the_main_job_runs_reports_resumes_and_diffs(tmp_path, capsys):
    """`pcgh run` with jobs side by side, its report, `--resume` of a finished run, a second run and `pcgh diff`, on a
    slice of the smoke matrix (every cell costs CI seconds; the shards above run the rest)."""
    db, logs = str(tmp_path / "smoke.db"), str(tmp_path / "logs")
    one = ["--filter", "model=qwen3-0.6b:tiny", "--filter", "quant=none", "--filter", "parallel=tp1",
           "--filter", "kv_cache=auto"]
    assert main(["run", str(SMOKE), "--db", db, "--jobs", "2", "--logs", logs, *one]) == 0
    report = capsys.readouterr().out
    with Store(db) as store:
        first = store.run("latest")
        rows = store.results(first.id)
        attempts_before = store.results(first.id, all_attempts=True)
    assert len(rows) == 9 and sum(r.passed for r in rows) == 6  # 3 graphs × sdpa, flex pass; varlen: CUDA only
    assert first.status == "finished" and "smoke" in report and "pass" in report.lower()

    # --resume on the finished run redoes nothing
    assert main(["run", str(SMOKE), "--db", db, "--resume", "--no-report", "--logs", logs, *one]) == 0
    with Store(db) as store:
        assert store.run("latest").id == first.id
        assert store.results(first.id, all_attempts=True) == attempts_before  # nothing re-recorded

    # a second run of a smaller slice (the full-graph cells), then a diff of the two runs: the rest are gone
    assert main(["run", str(SMOKE), "--db", db, "--filter", "graph=full", *one, "--jobs", "2", "--no-report",
                 "--logs", logs]) == 0
    capsys.readouterr()
    with Store(db) as store:
        second = store.run("latest")
    assert second.id != first.id
    assert main(["diff", str(first.id), str(second.id), "--db", db, "--fail-on-regression"]) == 0
    out = capsys.readouterr().out
    assert "gone" in out.lower() or "removed" in out.lower()
    assert main(["report", str(second.id), "--db", db, "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "summary.md").is_file() and (tmp_path / "rep" / "support_model_x_graph.csv").is_file()
