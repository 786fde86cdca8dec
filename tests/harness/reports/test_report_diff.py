"""diff_runs: every category, has_regression, and the Markdown puts new failures first."""

import pytest

from harness.reports import diff_markdown, diff_runs


def _base_head(row):
    base = [row("new_fail", "pass", {"8": 2.0}), row("flaky_fail", "pass_flaky"),
            row("fixed", "fail_capture", reason="old"),
            row("to_unsupported", "pass"), row("to_eager_fail", "pass"), row("fail_to_fail", "fail_run"),
            row("pass_to_flaky", "pass", {"8": 2.0}),
            row("slower", "pass", {"8": 4.0}), row("faster", "pass", {"8": 2.0}), row("steady", "pass", {"8": 2.0}),
            row("gone", "pass")]
    head = [row("new_fail", "fail_accuracy", {"8": 2.0}, reason="output logprob diff 0.3 > 0.1"),
            row("flaky_fail", "timeout", reason="600 s"),
            row("fixed", "pass"),
            row("to_unsupported", "unsupported", reason="no"), row("to_eager_fail", "eager_fail", reason="oom in eager"),
            row("fail_to_fail", "fail_accuracy"),
            row("pass_to_flaky", "pass_flaky", {"8": 2.1}),
            row("slower", "pass", {"8": 3.0}), row("faster", "pass", {"8": 2.5}), row("steady", "pass", {"8": 2.1}),
            row("new", "fail_run")]
    return base, head


def test_diff_categories(row):
    d = diff_runs(*_base_head(row))
    assert [c.key for c in d.new_failures] == ["flaky_fail", "new_fail"]
    assert (d.new_failures[1].base_status, d.new_failures[1].head_status) == ("pass", "fail_accuracy")
    assert d.new_failures[1].reason.startswith("output logprob diff")
    assert [c.key for c in d.fixes] == ["fixed"]
    assert [c.key for c in d.flips] == ["fail_to_fail", "pass_to_flaky", "to_eager_fail", "to_unsupported"]
    # -25% and +25% are beyond 10%; steady (+5%) and pass_to_flaky (+5%) are not; slowest first
    assert [(c.key, c.base, c.head) for c in d.speedup_changes] == [("slower", 4.0, 3.0), ("faster", 2.0, 2.5)]
    assert d.speedup_changes[0].rel_change == pytest.approx(-0.25)
    assert [c.key for c in d.slowdowns] == ["slower"]
    assert d.added == ["new"] and d.removed == ["gone"]
    assert d.has_regression


def test_threshold_is_respected(row):
    base, head = [row("a", "pass", {"8": 2.0})], [row("a", "pass", {"8": 2.1})]
    assert diff_runs(base, head).speedup_changes == []
    assert [c.key for c in diff_runs(base, head, speedup_threshold=0.01).speedup_changes] == ["a"]
    with pytest.raises(ValueError):
        diff_runs(base, head, speedup_threshold=-0.1)


def test_graph_latency_changes_use_the_token_counts_both_runs_timed(row, run):
    def cell(key, graph_ms, status="pass"):
        lat = {n: {"eager": 30.0, "graph": ms} for n, ms in graph_ms.items()}
        return row(key, status, {n: 30.0 / ms for n, ms in graph_ms.items()}, metrics={"latency_ms": lat})

    base = [cell("slower", {"8": 2.0, "512": 4.0}), cell("faster", {"8": 4.0}), cell("steady", {"8": 2.0}),
            cell("only_base_counts", {"8": 2.0, "2048": 10.0}), cell("now_failing", {"8": 2.0}), row("untimed", "pass")]
    head = [cell("slower", {"8": 3.0, "512": 6.0}), cell("faster", {"8": 3.0}), cell("steady", {"8": 2.1}),
            cell("only_base_counts", {"8": 2.0}), cell("now_failing", {"8": 9.0}, status="fail_run"), row("untimed", "pass")]
    d = diff_runs(base, head)
    got = [(c.key, round(c.base, 3), round(c.head, 3)) for c in d.latency_changes]
    assert got == [("slower", round(8**0.5, 3), round(18**0.5, 3)), ("faster", 4.0, 3.0)]  # slower first
    assert d.latency_changes[0].rel_change == pytest.approx(0.5)
    md = diff_markdown(d, run.model_copy(update={"id": 1, "name": "base"}), run.model_copy(update={"id": 2, "name": "head"}))
    assert "## Graph latency changes" in md and "| slower | 2.83 ms | 4.24 ms | +50.0% |" in md
    assert "2 speedup and 2 graph latency change(s) beyond ±10%" in md


def test_a_failed_timing_on_one_side_does_not_move_the_speedup(row):
    base = [row("a", "pass", {"8": 2.0, "512": float("nan")}), row("b", "pass", {8: 2.0, 512: 1.0})]
    head = [row("a", "pass", {"8": 2.0, "512": 1.0}), row("b", "pass", {"8": 2.0, "512": 1.0})]
    assert diff_runs(base, head, speedup_threshold=0).speedup_changes == []


def test_no_regression_without_new_failures(row, run):
    base = [row("a", "pass"), row("b", "fail_run"), row("c", "pass")]
    head = [row("a", "unsupported"), row("b", "pass"), row("c", "eager_fail"), row("d", "oom")]
    d = diff_runs(base, head)
    assert not d.has_regression and d.new_failures == []
    assert [c.key for c in d.fixes] == ["b"] and d.added == ["d"]
    assert "No new failures." in diff_markdown(d, run.model_copy(update={"id": 1}), run)


def test_identical_runs_diff_is_empty(row):
    rows = [row("a", "pass", {"8": 2.0}), row("b", "fail_run")]
    d = diff_runs(rows, rows)
    assert (d.new_failures, d.fixes, d.flips, d.speedup_changes, d.added, d.removed) == ([], [], [], [], [], [])


def test_markdown_lists_new_failures_before_fixes(row, run):
    d = diff_runs(*_base_head(row))
    md = diff_markdown(d, run.model_copy(update={"id": 6, "name": "base"}), run.model_copy(update={"torch_version": "2.12.0"}))
    assert md.startswith("# Run diff: base (#6) → nightly-0101 (#7)")
    assert "Regression: 2 new failure(s)" in md
    assert "| new_fail | pass → fail_accuracy | output logprob diff 0.3 > 0.1 |" in md
    order = [md.index(s) for s in ("## New failures", "| new_fail |", "## Fixes", "| fixed |", "## Other status changes",
                                   "## Speedup changes", "| slower | 4.00× | 3.00× | -25.0% |", "## Added", "## Removed")]
    assert order == sorted(order)
    assert "| torch_version | 2.11.0 | 2.12.0 |" in md


def test_a_cell_renamed_by_a_scheme_alias_is_compared_not_added_and_removed(row):
    """A base run stored with quant=fp4 and a head run with nvfp4 (the registry's name): the same cells, compared;
    each side keeps the key it was stored under."""
    old, new = "model=m|quant=fp4|graph=full", "model=m|quant=nvfp4|graph=full"
    d = diff_runs([row(old, "pass", quant="fp4"), row("gone", "pass")], [row(new, "fail_accuracy", quant="nvfp4")])
    assert d.added == [] and d.removed == ["gone"]
    assert [(c.key, c.base_status, c.head_status) for c in d.new_failures] == [(new, "pass", "fail_accuracy")]
