"""The dashboard's pure parts: labels, flips, the repro command, the grid, the plots, the badges."""

from __future__ import annotations

import gc
import math
import shlex
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from web_seed import axes

from harness.reports import cell_speedup
from harness.store import Store
from web import cells
from web.deps import gc_paused
from web.matrix import build_grid, cell_href, parse_filters
from web.plots import line_plot
from web.queries import CellRow, Queries
from web.routers.badges import colour, text_width


@pytest.mark.parametrize(("model", "flags"), [
    ("qwen3-0.6b:tiny", ["--model", "qwen3-0.6b", "--tiny"]),
    ("qwen3-30b-a3b:trim:4", ["--model", "qwen3-30b-a3b", "--layers", "4"]),
    ("deepseek-v3:full", ["--model", "deepseek-v3", "--weights", "real"]),
    ("Qwen/Qwen3-0.6B", ["--model", "Qwen/Qwen3-0.6B"]),
])
def test_repro_command_maps_the_variant(model: str, flags: list[str]) -> None:
    axes = {"model": model, "quant": "none", "attention": "sdpa", "parallel": "tp1", "graph": "full", "compiler": "inductor"}
    cmd = cells.repro_command(axes, {"device": "cuda", "dtype": "bfloat16", "max_tokens": 512})
    assert shlex.split(cmd) == ["pcgh", "cell", *flags, "--graph", "full", "--attention", "sdpa", "--compiler", "inductor",
                                "--device", "cuda", "--dtype", "bfloat16", "--max-tokens", "512"]


def test_repro_command_falls_back_to_other_runs_and_quotes() -> None:
    axes = {"model": "my model:tiny", "graph": "piecewise", "attention": "sdpa", "compiler": "eager"}
    cmd = cells.repro_command(axes, {}, [{"device": "cpu"}, {"device": "cuda", "dtype": "float32"}])
    assert cmd == "pcgh cell --model 'my model' --tiny --graph piecewise --attention sdpa --compiler eager --device cpu --dtype float32"
    assert cells.repro_command(axes, {}) == "pcgh cell --model 'my model' --tiny --graph piecewise --attention sdpa --compiler eager"


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
    assert cells.flips(statuses) == flips
    assert cells.is_flaky(statuses) is flaky


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
    assert cells.short_label(status, speedup) == label
    assert cells.css_class(status) == css


@pytest.mark.parametrize("speedups", [{"8": 2.0, "32": 8.0}, {"8": 2.0, "32": None}, {"8": "NaN"}, 3.0, None, {},
                                      {"8": -1.0, "32": math.inf, "128": 4.0}])
def test_speedup_is_the_reports_speedup(speedups: object) -> None:
    assert cells.speedup_of(speedups) == cell_speedup({"speedup": speedups})


def test_tooltip() -> None:
    tip = cells.tooltip("fail_accuracy", "first line\nsecond line", None, 1.234, 3 * 2**20, 0.5)
    assert tip == "fail_accuracy: first line…\ncapture 1.23 s · pool 3.0 MiB · token match 0.500"
    assert cells.tooltip("pass", "", 2.0, None, None, None) == "pass\nspeedup 2.00×"


@pytest.mark.parametrize("key", ["model=a:tiny|quant=none|graph=full", "weird key & = ? # % |x", "ünïcode|模型"])
def test_cell_href_round_trips_the_key(key: str) -> None:
    query = parse_qs(urlsplit(cell_href(key, 7)).query)
    assert query == {"key": [key], "run": ["7"]}


def _row(model: str, graph: str, status: str = "pass", attention: str = "sdpa", speedup: float = 2.0) -> CellRow:
    axes = {"model": model, "quant": "none", "attention": attention, "parallel": "tp1", "graph": graph, "compiler": "eager"}
    return CellRow(f"{model}|{graph}|{attention}", axes, status, "", {"8": speedup}, None, None, None, None, 1.0, 1)


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


def test_odd_metrics_do_not_break_the_matrix(tmp_path: Path) -> None:
    """Uploaded metrics are free-form JSON: a string speedup or a "NaN" capture time must not break a page."""
    with Store(f"sqlite:///{tmp_path / 'pcg.db'}") as store:
        run = store.create_run("r", "m", {})
        odd = [{"speedup": "fast"}, {"speedup": 3.0}, {"speedup": {"8": None}}, {"speedup": float("nan")},
               {"capture_s": "NaN", "graph_pool_bytes": "big", "token_match": float("inf")}, {}]
        for i, m in enumerate(odd):
            store.record_result(run, {"key": f"k{i}", "axes": axes(f"m{i}:tiny", "full"), "status": "pass", "metrics": m})
        q = Queries(store)
        rows = {r.key: r for r in q.cells(run)}
        q.close()
    assert [cells.speedup_of(rows[f"k{i}"].speedups) for i in range(4)] == [None, 3.0, None, None]
    assert rows["k4"].capture_s is not None and math.isnan(rows["k4"].capture_s)
    assert rows["k4"].graph_pool_bytes is None and rows["k4"].token_match == math.inf
    labels = [c.label for _, line in build_grid(list(rows.values()), run).rows for c in line if c]
    assert labels == ["pass", "3.00×", "pass", "pass", "pass", "pass"]
