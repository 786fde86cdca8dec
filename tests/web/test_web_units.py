"""The dashboard's pure parts: labels, flips, the repro command, the grid, the plots, the badges."""

from __future__ import annotations

import gc
import math
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from web_seed import axes

from harness.metrics import CellMetrics
from harness.outcome import CellRecord
from harness.reports import cell_speedup
from harness.store import Store
from web import present
from web.deps import _as_text, gc_paused
from web.grid import build_grid, cell_href, parse_filters
from web.plots import line_plot
from web.routers.badges import colour, text_width


@pytest.mark.parametrize(("statuses", "flips", "flaky"), [
    ([], 0, False),
    (["pass"], 0, False),
    (["pass", "pass", "pass"], 0, False),
    (["pass", "fail_run"], 1, False),
    (["pass", "fail_run", "pass"], 2, True),
    (["pass", "pass_flaky"], 1, True),
    (["unsupported", "eager_fail", "unsupported"], 2, False),  # never passed: changes, not flakiness
    (["fail_run", "timeout", "oom", "fail_run"], 3, False),
])
def test_flips_and_flaky(statuses: list[str], flips: int, flaky: bool) -> None:
    assert present.flips(statuses) == flips
    assert present.is_flaky(statuses) is flaky


@pytest.mark.parametrize(("status", "speedup", "label", "css"), [
    ("pass", 2.345, "2.35×", "s-pass"),
    ("pass", None, "pass", "s-pass"),
    ("pass_flaky", 1.5, "~1.50×", "s-flaky"),
    ("fail_accuracy", None, "acc", "s-fail"),
    ("eager_nondeterministic", None, "nondet", "s-fail"),
    ("eager_fail", None, "eager", "s-eager_fail"),
    ("unsupported", None, "n/s", "s-not_run"),
    ("skipped", None, "skip", "s-not_run"),
    ("brand_new_status", None, "brand_new_status", "s-fail"),
])
def test_short_labels_and_colours(status: str, speedup: float | None, label: str, css: str) -> None:
    assert present.short_label(status, speedup) == label
    assert present.css_class(status) == css


@pytest.mark.parametrize("speedups,expect", [({8: 2.0, 32: 8.0}, 4.0), ({8: 2.0, 32: None}, 2.0), ({8: math.nan}, None),
                                             ({}, None), ({8: -1.0, 32: math.inf, 128: 4.0}, 4.0)])
def test_a_cells_speedup_is_the_geomean_of_its_timed_counts(speedups: dict[int, float | None], expect: float | None) -> None:
    assert cell_speedup(CellMetrics(speedup=speedups)) == pytest.approx(expect)


def test_nested_metrics_show_as_the_apis_json() -> None:
    assert _as_text({8: {"eager": 1.5, "graph": math.nan}}) == '{"8": {"eager": 1.5, "graph": null}}'
    assert _as_text(["ü"]) == '["ü"]' and _as_text(0.5) == "0.5" and _as_text("cpu") == "cpu"


def test_tooltip() -> None:
    tip = present.tooltip("fail_accuracy", "first line\nsecond line", None, 1.234, 3 * 2**20, 0.5)
    assert tip == "fail_accuracy: first line…\ncapture 1.23 s · pool 3.0 MiB · token match 0.500"
    assert present.tooltip("pass", "", 2.0, None, None, None) == "pass\nspeedup 2.00×"


@pytest.mark.parametrize("key", ["model=a:tiny|quant=none|graph=full", "weird key & = ? # % |x", "ünïcode|模型"])
def test_cell_href_round_trips_the_key(key: str) -> None:
    query = parse_qs(urlsplit(cell_href(key, 7)).query)
    assert query == {"key": [key], "run": ["7"]}


def _row(model: str, graph: str, status: str = "pass", attention: str = "sdpa", speedup: float = 2.0) -> CellRecord:
    axes = {"model": model, "quant": "none", "attention": attention, "parallel": "tp1", "graph": graph, "compiler": "eager"}
    return CellRecord(key=f"{model}|{graph}|{attention}", axes=axes, status=status, metrics=CellMetrics(speedup={8: speedup}))


def test_grid_pivots_groups_and_labels_only_varying_axes() -> None:
    rows = [_row("m:tiny", "full"), _row("m:tiny", "piecewise", "fail_run"), _row("a:trim:16", "full", attention="flash"),
            _row("a:trim:4", "piecewise")]
    g = build_grid(rows, 1, "graph")
    assert [m for m, _ in g.rows] == ["a:trim:4", "a:trim:16", "m:tiny"]  # natural order
    assert [(c.group, c.label) for c in g.columns] == [("full", "flash"), ("full", "sdpa"), ("piecewise", "sdpa")]
    assert g.groups == [("full", 2), ("piecewise", 1)]
    line = dict(g.rows)["m:tiny"]
    assert line[0] is None and line[1].label == "2.00×" and line[2].css == "s-fail"
    assert g.counts == {"pass": 3, "fail_run": 1}
    one = build_grid(rows, 1, "attention", {"graph": ["full"]})
    assert [(c.group, c.label) for c in one.columns] == [("flash", ""), ("sdpa", "")]  # nothing else varies
    assert one.options["graph"] == ["full", "piecewise"]  # options stay those of the whole run
    with pytest.raises(ValueError, match="choose one of"):
        build_grid(rows, 1, "model")
    assert build_grid([], 1).rows == []


def test_parse_filters() -> None:
    assert parse_filters({"graph": ["full", "a,b"], "status": [""], "model": [" x "], "other": ["y"]}) == {
        "graph": ["full", "a", "b"], "model": ["x"]}


def test_plot_escapes_breaks_lines_at_gaps_and_says_when_empty() -> None:
    svg = str(line_plot("<T>", ["1", "2", "3", "4"], {"<b>x</b>": [1.0, None, 2.0, 3.0]}, unit=" s"))
    assert "<b>" not in svg and "&lt;b&gt;x&lt;/b&gt;: 3 s (run 4)" in svg and "&lt;T&gt;" in svg
    assert svg.count("<polyline") == 1 and svg.count("<circle") == 3
    assert "no data" in str(line_plot("t", ["1"], {"a": [None]}))
    assert str(line_plot("t", ["1"], {"a": [0.0]})).count("<circle") == 1  # all-zero: no division by zero


def test_badge_colours_and_width() -> None:
    assert [colour(r) for r in (1.0, 0.95, 0.8, 0.6, 0.1, None)] == ["#4c1", "#97ca00", "#a4a61d", "#fe7d37",
                                                                      "#e05d44", "#9f9f9f"]
    assert text_width("12/15 pass") > text_width("pcg")


def test_gc_paused_restores_the_collector() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # left as found
    finally:
        gc.enable()


def test_the_matrix_reads_partial_and_non_finite_metrics(tmp_path: Path) -> None:
    """A cell that timed nothing, a failed timing (None), NaN and infinite values: labels fall back, nothing breaks."""
    with Store(f"sqlite:///{tmp_path / 'pcg.db'}") as store:
        run = store.create_run("r", "m", {})
        odd = [CellMetrics(speedup={8: None}), CellMetrics(speedup={8: 3.0, 32: math.nan}),
               CellMetrics(capture_s=math.nan, graph_pool_bytes=2**20, token_match=math.inf), CellMetrics()]
        store.record_results(run, [CellRecord(key=f"k{i}", axes=axes(f"m{i}:tiny", "full"), status="pass", metrics=m)
                                   for i, m in enumerate(odd)])
        rows = {r.key: r for r in store.views.cells(run)}
    assert [cell_speedup(rows[f"k{i}"].metrics) for i in range(4)] == [None, 3.0, None, None]
    assert math.isnan(rows["k1"].metrics.latency.speedup[32])
    m = rows["k2"].metrics
    assert math.isnan(m.capture.capture_s) and m.capture.graph_pool_bytes == 2**20 and m.judge.token_match == math.inf
    labels = [c.label for _, line in build_grid(list(rows.values()), run).rows for c in line if c]
    assert labels == ["pass", "3.00×", "pass", "pass"]


def test_a_runs_fields_are_the_stores_columns() -> None:
    from harness.store.models import PROVENANCE, Run
    from web.schemas import RunOut

    assert set(RunOut.model_fields) == {c.name for c in Run.__table__.columns}
    assert [f for f in RunOut.model_fields if f in PROVENANCE] == list(PROVENANCE)


def test_odd_stored_metrics_do_not_break_the_pages(tmp_path: Path) -> None:
    """Uploads before the outcome type stored free-form metrics JSON: a string speedup, a number for the per-token
    dict, a "big" pool size. Written straight into the table (the Store now refuses them), they must read back
    with the odd values dropped, and the matrix, the run page and the report must still render."""
    from fastapi.testclient import TestClient
    from sqlalchemy import insert

    from harness.reports import summary_markdown
    from harness.store.models import CellResult
    from web.app import create_app

    db = f"sqlite:///{tmp_path / 'pcg.db'}"
    odd = [{"speedup": "fast"}, {"speedup": 3.0}, {"speedup": {"8": None}}, {"speedup": {"8": 2.0}},
           {"capture_s": "NaN", "graph_pool_bytes": "big", "token_match": 0.5}, {}]
    with Store(db) as store:
        run = store.create_run("r", "m", {})
        with store._engine.begin() as conn:  # noqa: SLF001 - planting rows no current writer can write
            conn.execute(insert(CellResult), [{"run_id": run, "key": f"k{i}", "axes": axes(f"m{i}:tiny", "full"),
                                               "status": "pass", "metrics": m, "attempt": 1} for i, m in enumerate(odd)])
        rows = {r.key: r for r in store.views.cells(run)}
        full = {r.key: r for r in store.results(run)}
        report = summary_markdown(store.run(run), list(full.values()))
    assert [cell_speedup(rows[f"k{i}"].metrics) for i in range(4)] == [None, None, None, 2.0]
    assert math.isnan(rows["k4"].metrics.capture.capture_s) and rows["k4"].metrics.capture.graph_pool_bytes is None
    assert rows["k4"].metrics.judge.token_match == 0.5 and full["k4"].metrics.judge.token_match == 0.5
    assert "Pass rate: 100.0%" in report
    labels = [c.label for _, line in build_grid(list(rows.values()), run).rows for c in line if c]
    assert labels == ["pass", "pass", "pass", "2.00×", "pass", "pass"]
    client = TestClient(create_app(db))
    assert client.get("/").status_code == 200 and client.get(f"/runs/{run}").status_code == 200
    assert client.get("/api/matrix").status_code == 200
