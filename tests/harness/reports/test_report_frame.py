"""results_frame: axes as columns, nested metrics flattened, per-cell geomean speedup, stable schema."""

import math

import pytest

from harness.outcome import AXES
from harness.reports import geomean, results_frame


def test_geomean_arithmetic():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([1.0, 10.0, 100.0]) == pytest.approx(10.0)
    # None, NaN, inf and non-positive values are left out, not averaged in.
    assert geomean([4.0, None, math.nan, math.inf, 0.0, -3.0]) == pytest.approx(4.0)
    assert geomean([]) is None and geomean([None]) is None


def test_frame_flattens_metrics(row):
    metrics = {"latency_ms": {"8": {"eager": 30.0, "graph": 5.0}, "128": {"eager": 22.0, "graph": 11.0}},
               "capture_s": 1.5, "graph_pool_bytes": 2048, "pieces": 3, "token_match": 1.0,
               "topk_containment_ok": True, "bucket_hits": {"8": 2}}
    df = results_frame([row("a", speedup={"8": 6.0, "128": 2.0, "2048": None}, metrics=metrics, graph="full")])
    assert list(df.columns[:len(AXES) + 1]) == ["key", *AXES]
    r = df.iloc[0]
    assert r["graph"] == "full" and r["status"] == "pass" and r["attempt"] == 1 and r["duration_s"] == 10.0
    assert r["speedup"] == pytest.approx(math.sqrt(12.0))  # geomean of 6 and 2; the None count is left out
    assert (r["speedup_8"], r["speedup_128"]) == (6.0, 2.0) and math.isnan(r["speedup_2048"])
    assert (r["eager_ms_8"], r["graph_ms_8"], r["graph_ms_128"]) == (30.0, 5.0, 11.0)
    assert (r["capture_s"], r["graph_pool_bytes"], r["pieces"], r["token_match"]) == (1.5, 2048.0, 3.0, 1.0)
    # token-count columns are in numeric order, not string order
    sp_cols = [c for c in df.columns if c.startswith("speedup_")]
    assert sp_cols == ["speedup_8", "speedup_128", "speedup_2048"]
    assert "topk_containment_ok" not in df.columns and "bucket_hits" not in df.columns


def test_frame_cells_without_metrics_are_nan(row):
    df = results_frame([row("a", speedup={"8": 2.0}), row("b", status="fail_capture", reason="boom")])
    b = df.set_index("key").loc["b"]
    assert math.isnan(b["speedup"]) and math.isnan(b["speedup_8"]) and math.isnan(b["capture_s"])
    assert b["reason"] == "boom"


def test_empty_frame_has_the_schema():
    df = results_frame([])
    assert len(df) == 0
    for c in ("key", *AXES, "status", "reason", "duration_s", "attempt", "speedup", "capture_s", "graph_pool_bytes"):
        assert c in df.columns
