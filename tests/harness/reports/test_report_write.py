"""write_report: the files land, the CSVs read back as the matrices, report.json round-trips."""

import json
import math

import pandas as pd
import pytest

from harness.reports import report_dict, support_matrices, write_report

CSV_NAMES = ["support_model_x_quant.csv", "support_model_x_attention.csv", "support_model_x_parallel.csv",
             "support_model_x_graph.csv"]


def _rows(row):
    return [row("a", "pass", {"8": 2.0, "128": 8.0}, metrics={"capture_s": 0.5, "max_output_logprob_diff": math.nan}),
            row("b", "fail_run", reason="RuntimeError: boom", graph="full"),
            row("c", "unsupported", reason="MLA", model="deepseek-v3:trim:4", quant="fp8")]


def test_files_written_and_csvs_read_back(row, run, tmp_path):
    out = tmp_path / "deep" / "report"
    paths = write_report(run, _rows(row), out)
    assert [p.name for p in paths] == ["summary.md", "report.json", *CSV_NAMES]
    assert all(p.is_file() and p.parent == out for p in paths)
    mats = support_matrices(_rows(row))
    for name in CSV_NAMES:
        back = pd.read_csv(out / name, index_col=0, encoding="utf-8", dtype=str)
        want = mats[name[len("support_"):-len(".csv")]]
        assert back.index.name == "model"
        assert back.to_dict() == want.to_dict(), name
    graph = pd.read_csv(out / "support_model_x_graph.csv", index_col=0, dtype=str)
    assert graph.loc["qwen3-0.6b:tiny", "full"] == "❌" and graph.loc["deepseek-v3:trim:4", "full"] == "❓"
    assert "Pass rate: 50.0%" in (out / "summary.md").read_text(encoding="utf-8")


def test_json_round_trip(row, run, tmp_path):
    d = report_dict(run, _rows(row))
    assert json.loads(json.dumps(d, allow_nan=False)) == d
    write_report(run, _rows(row), tmp_path)
    assert json.loads((tmp_path / "report.json").read_text(encoding="utf-8")) == d
    assert d["run"]["id"] == 7 and d["run"]["git_sha"] == "0123abcd"
    assert d["run"]["started_at"] == "2025-01-01T02:00:00+00:00" and d["run"]["wall_s"] == 3723.0
    assert d["counts"] == {"pass": 1, "fail_run": 1, "unsupported": 1}
    assert (d["passing"], d["counted"], d["not_counted"]) == (1, 2, 1) and d["pass_rate"] == 0.5
    assert d["geomean_speedup"] == pytest.approx(4.0)
    a = d["cells"][0]
    assert a["key"] == "a" and a["speedup"] == pytest.approx(4.0) and a["metrics"]["latency"]["speedup"] == {"8": 2.0, "128": 8.0}
    assert a["metrics"]["judge"]["max_output_logprob_diff"] is None  # NaN becomes null: valid JSON
    assert "log" not in a


def test_empty_run_report(run, tmp_path):
    paths = write_report(run, [], tmp_path / "empty")
    assert len(paths) == 6 and all(p.is_file() for p in paths)
    d = json.loads((tmp_path / "empty" / "report.json").read_text(encoding="utf-8"))
    assert d["cells"] == [] and d["pass_rate"] is None and d["geomean_speedup"] is None and d["counts"] == {}
    back = pd.read_csv(tmp_path / "empty" / "support_model_x_graph.csv", index_col=0)
    assert back.empty
    assert "No cells in this run." in (tmp_path / "empty" / "summary.md").read_text(encoding="utf-8")
    assert report_dict(None, [])["run"]["id"] is None
