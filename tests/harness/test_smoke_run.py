"""The main job end to end: `pcgh run smoke.yaml` into SQLite, the report, `--resume`, `pcgh diff`."""

from __future__ import annotations

from pathlib import Path

from harness.cli import main
from harness.outcome import STATUSES
from harness.store import Store

SMOKE = Path(__file__).parents[2] / "harness" / "configs" / "smoke.yaml"


def test_smoke_matrix_runs_reports_resumes_and_diffs(tmp_path, capsys):
    db = str(tmp_path / "smoke.db")
    logs = str(tmp_path / "logs")
    assert main(["run", str(SMOKE), "--db", db, "--jobs", "2", "--logs", logs]) == 0
    report = capsys.readouterr().out
    with Store(db) as store:
        first = store.run("latest")
        rows = store.results(first["id"])
        attempts_before = store.results(first["id"], all_attempts=True)
    # unquantized: 14 models × 3 attention backends × 3 graph backends; 8-bit: 4 schemes × 3 models × sdpa × 3 graphs;
    # 4-bit weight-only (awq, gptq, nvfp4): 3 schemes × 3 models × sdpa × 3 graphs; the FP8 KV cache: 4 cells;
    # TP=2: 4 models × {piecewise, breakable}, and Llama quantized (int8_w8a8 piecewise, awq breakable); tp2-ep2: 1;
    # pp2: Llama piecewise and DeepSeek-V3 breakable; dp2: Qwen3-MoE piecewise and DeepSeek-V3 breakable; ep2: 1
    assert len(rows) == 126 + 36 + 27 + 4 + 8 + 2 + 1 + 2 + 2 + 1
    assert all(r.status in STATUSES for r in rows)
    launched = [r for r in rows if r.status != "unsupported"]
    # all 14 models (DeepSeek-V3 and Kimi-K2 with MLA, Qwen3-Next with linear attention, two VLMs) × {sdpa, flex} ×
    # 3 graphs, less Qwen3-Next under full (its linear-attention op cannot be captured: refused with the reason);
    # varlen is marked unsupported on the CPU, with the reason; each 8-bit scheme on Llama, Qwen3 and Qwen3-MoE ×
    # 3 graphs; each 4-bit weight-only scheme (awq, gptq, nvfp4) on Llama, Qwen3 and Qwen3-MoE × 3 graphs
    assert len(launched) == 82 + 36 + 27 + 4 + 8 + 2 + 1 + 2 + 2 + 1 and all(r.passed for r in launched), \
        [(r.key, r.status, r.reason) for r in launched if not r.passed]
    # TP=2, two gloo processes a cell: both ranks passed, and the sharded eager matches the same weights unsharded
    tp2 = [r for r in rows if r.axes["parallel"] == "tp2"]
    assert {(r.axes["model"], r.axes["graph"]) for r in tp2} == {
        (m, g) for m in ("llama-3.1-8b:tiny", "qwen3-30b-a3b:tiny", "mixtral-8x7b:tiny", "deepseek-v3:tiny")
        for g in ("piecewise", "breakable")}
    assert all(r.passed and r.metrics.rank_statuses == ["pass", "pass"] and r.metrics.tp1_logprob_diff is not None
               and r.metrics.tp1_logprob_diff < 1e-4 for r in tp2), [(r.key, r.status, r.reason) for r in tp2]
    assert sorted((r.axes["quant"], r.axes["graph"]) for r in tp2 if r.axes["quant"] != "none") == [
        ("awq", "breakable"), ("int8_w8a8", "piecewise")]
    for mode in ("tp2-ep2", "ep2"):
        (ep,) = [r for r in rows if r.axes["parallel"] == mode]
        assert ep.passed and ep.metrics.rank_statuses == ["pass", "pass"] and ep.metrics.tp1_logprob_diff < 1e-4, ep.reason
    for mode, model in (("pp2", "llama-3.1-8b:tiny"), ("dp2", "qwen3-30b-a3b:tiny")):
        cells = [r for r in rows if r.axes["parallel"] == mode]
        assert {(r.axes["model"], r.axes["graph"]) for r in cells} == {(model, "piecewise"), ("deepseek-v3:tiny", "breakable")}
        assert all(r.passed and r.metrics.rank_statuses == ["pass", "pass"] and r.metrics.tp1_logprob_diff < 1e-4
                   for r in cells), [(r.key, r.status, r.reason) for r in cells]
    mla_flex = [r for r in rows if r.axes["model"] in ("deepseek-v3:tiny", "kimi-k2:tiny") and r.axes["attention"] == "flex"]
    assert len(mla_flex) == 7 and all(r.passed for r in mla_flex)  # 6 + DeepSeek-V3's FP8 latent cache
    grok_flex = [r for r in rows if r.axes["model"] == "grok-2:tiny" and r.axes["attention"] == "flex"]
    assert len(grok_flex) == 3 and all(r.passed for r in grok_flex)
    fp8_kv = [r for r in rows if r.axes["kv_cache"] == "fp8_e4m3"]
    assert len(fp8_kv) == 4 and all(r.passed and r.metrics.kv_scales == "calibrated" for r in fp8_kv)
    quantized = [r for r in rows if r.axes["quant"] not in ("none", "awq", "gptq", "nvfp4")]
    assert len(quantized) == 36 + 1 and all(r.passed for r in quantized)
    # 7 linears per dense layer; 4 + the fused experts per MoE layer; 2 layers
    layers = {"llama-3.1-8b:tiny": 14, "qwen3-0.6b:tiny": 14, "qwen3-30b-a3b:tiny": 10}
    assert all(r.metrics.quant_layers == layers[r.axes["model"]] and r.metrics.quant_logprob_diff > 0 for r in quantized)
    int4 = [r for r in rows if r.axes["quant"] in ("awq", "gptq")]
    dense4 = [r for r in int4 if r.axes["model"] != "qwen3-30b-a3b:tiny"]
    assert len(dense4) == 12 + 1 and all(r.passed and r.metrics.quant_layers == 14 and r.metrics.quant_logprob_diff > 0
                                     for r in dense4)
    moe4 = [r for r in int4 if r.axes["model"] == "qwen3-30b-a3b:tiny"]  # 4 linears + the int4 experts per layer
    assert len(moe4) == 6 and all(r.passed and r.metrics.quant_layers == 10 and r.metrics.quant_logprob_diff > 0
                                  for r in moe4)
    fp4 = [r for r in rows if r.axes["quant"] == "nvfp4"]
    dense_fp4 = [r for r in fp4 if r.axes["model"] != "qwen3-30b-a3b:tiny"]
    assert len(dense_fp4) == 6 and all(r.passed and r.metrics.quant_layers == 14 and r.metrics.quant_logprob_diff > 0
                                       for r in dense_fp4)
    moe_fp4 = [r for r in fp4 if r.axes["model"] == "qwen3-30b-a3b:tiny"]  # 4 linears + the FP4 experts per layer
    assert len(moe_fp4) == 3 and all(r.passed and r.metrics.quant_layers == 10 and r.metrics.quant_logprob_diff > 0
                                     for r in moe_fp4)
    assert {r.axes["attention"] for r in launched} == {"sdpa", "flex"}
    runnable = {r.axes["model"] for r in launched}
    varlen = [r for r in rows if r.axes["attention"] == "varlen" and r.axes["model"] in runnable]
    assert len(varlen) == 42 and all(r.status == "unsupported" and "CUDA" in r.reason for r in varlen)
    next_full = [r for r in rows if r.axes["model"] == "qwen3-next-80b-a3b:tiny" and r.axes["graph"] == "full"
                 and r.axes["attention"] != "varlen"]
    assert len(next_full) == 2 and all(r.status == "unsupported" and "linear_attention" in r.reason for r in next_full), \
        [(r.key, r.reason) for r in next_full]
    vlm = [r for r in launched if r.axes["model"] in ("qwen2.5-vl-7b:tiny", "qwen3-vl-30b-a3b:tiny")]
    assert len(vlm) == 12 and all(r.passed for r in vlm)
    assert first["status"] == "finished" and first["torch_version"]
    assert "smoke" in report and "pass" in report.lower()

    # --resume on the finished run redoes nothing
    assert main(["run", str(SMOKE), "--db", db, "--resume", "--no-report", "--logs", logs]) == 0
    with Store(db) as store:
        assert store.run("latest")["id"] == first["id"]
        assert store.results(first["id"], all_attempts=True) == attempts_before  # nothing re-recorded

    # a second run of a slice (one model's full-graph cells: every cell costs CI ~20 s), then a diff of the two runs
    assert main(["run", str(SMOKE), "--db", db, "--filter", "graph=full", "--filter", "model=qwen3-0.6b:tiny",
                 "--jobs", "2", "--no-report", "--logs", logs]) == 0
    capsys.readouterr()
    with Store(db) as store:
        second = store.run("latest")
    assert second["id"] != first["id"]
    assert main(["diff", str(first["id"]), str(second["id"]), "--db", db, "--fail-on-regression"]) == 0
    out = capsys.readouterr().out
    assert "gone" in out.lower() or "removed" in out.lower()
    assert main(["report", str(second["id"]), "--db", db, "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "summary.md").is_file() and (tmp_path / "rep" / "support_model_x_graph.csv").is_file()
