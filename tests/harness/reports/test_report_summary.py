"""summary_markdown and the totals: pass rate over counted cells only, geomean over passing cells, sections."""

import pytest

from harness.reports import results_frame, summary_markdown, totals

MIXED = [("p1", "pass"), ("p2", "pass"), ("f1", "pass_flaky"), ("x1", "fail_run"), ("x2", "eager_nondeterministic"),
         ("n1", "eager_fail"), ("n2", "unsupported"), ("n3", "skipped")]


def test_pass_rate_excludes_not_counted(row):
    t = totals(results_frame([row(k, s) for k, s in MIXED]))
    # 3 passing (pass, pass, pass_flaky) of 5 counted; eager_fail/unsupported/skipped are left out (3/8 if not).
    assert (t.passing, t.counted, t.not_counted, t.cells) == (3, 5, 3, 8)
    assert t.pass_rate == pytest.approx(0.6)
    assert t.counts == {"pass": 2, "pass_flaky": 1, "fail_run": 1, "eager_nondeterministic": 1, "eager_fail": 1,
                        "unsupported": 1, "skipped": 1}


def test_summary_shows_exact_pass_rate_and_counts(row, run):
    md = summary_markdown(run, [row(k, s) for k, s in MIXED])
    assert "Pass rate: 60.0%" in md and "3 passing of 5 counted" in md
    assert "| eager_nondeterministic | 1 |" in md and "| pass | 2 |" in md
    assert "| fail_accuracy |" not in md  # only statuses that occur


def test_pass_rate_na_when_nothing_counted(row, run):
    rows = [row("a", "unsupported", reason="no MLA"), row("b", "skipped")]
    assert totals(results_frame(rows)).pass_rate is None
    assert "Pass rate: n/a" in summary_markdown(run, rows)


def test_geomean_speedup_over_passing_cells_only(row, run):
    rows = [row("a", "pass", {"8": 2.0, "128": 8.0}),  # cell geomean 4
            row("b", "pass_flaky", {"8": 1.0}),  # 1
            row("c", "fail_accuracy", {"8": 100.0}, reason="drift"),  # failing: left out
            row("d", "pass")]  # no timings: left out
    t = totals(results_frame(rows))
    assert t.geomean_speedup == pytest.approx(2.0) and t.speedup_cells == 2
    assert "Geomean speedup: 2.00×" in summary_markdown(run, rows)


def test_summary_sections(row, run):
    rows = [row("slow", "pass", {"8": 1.1}), row("fast", "pass", {"8": 5.0}),
            row("bad", "fail_capture", reason="RuntimeError: capture | broke\n  traceback line"),
            row("u1", "unsupported", reason="MLA not supported", model="deepseek-v3:trim:4"),
            row("u2", "unsupported", reason="MLA not supported", model="kimi-k2:trim:4"),
            row("u3", "unsupported", reason="fp8 needs sm90", quant="fp8")]
    md = summary_markdown(run, rows)
    assert md.startswith("# pcg compatibility run: nightly-0101 (#7)")
    for v in ("0123abcd", "2.11.0", "5.17.0", "12.8 / 570.86", "NVIDIA H200", "gpu-01", "1h 02m 03s"):
        assert v in md, v
    # failing cell with its reason (first line only, pipe escaped), before the slowest speedups
    assert "| bad | fail_capture | RuntimeError: capture \\| broke… |" in md
    assert md.index("| bad |") < md.index("| slow |") < md.index("| fast |")
    # unsupported reasons grouped, the larger group first
    assert "- 2 × MLA not supported — e.g. u1, u2" in md and "- 1 × fp8 needs sm90 — e.g. u3" in md
    assert md.index("2 × MLA") < md.index("1 × fp8")


def test_empty_run_summary(run):
    md = summary_markdown(run, [])
    assert "No cells in this run." in md and "Pass rate: n/a" in md and "Geomean speedup: n/a" in md
    assert summary_markdown(None, []).startswith("# pcg compatibility run: unnamed run")


def test_the_reference_layer_is_counted_where_cells_recorded_it(row, run):
    from harness.metrics import ReferenceCheck

    rows = [row("a", "pass"), row("b", "fail_accuracy", reason="reference layer: FAIL: …"), row("c", "pass"), row("d")]
    for r, status in zip(rows, ("pass", "fail", "not_measured")):
        r.metrics.judge.reference = ReferenceCheck(status=status)
    md = summary_markdown(run, rows)
    assert "**Reference layer** (eager against transformers and the kernels' reference math): 1 pass, 1 fail, " \
           "1 not measured" in md
    assert "Reference layer" not in summary_markdown(run, [row("e")])  # rows from before the layer: no line
