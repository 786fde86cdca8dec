"""Support matrices: one symbol per status class, ❓ for combinations never run, aggregation over other axes."""

import pytest

from harness.reports import PAIRS, aggregate_symbol, support_matrices

M1, M2 = "qwen3-0.6b:tiny", "deepseek-v3:trim:4"


def test_pairs_and_keys(row):
    mats = support_matrices([row("a")])
    assert list(mats) == ["model_x_quant", "model_x_attention", "model_x_parallel", "model_x_graph"]
    assert PAIRS[-1] == ("model", "graph")
    m = mats["model_x_graph"]
    assert m.index.name == "model" and m.columns.name == "graph"


@pytest.mark.parametrize("status,symbol", [
    ("pass", "✅"), ("pass_flaky", "⚠"), ("fail_accuracy", "❌"), ("fail_capture", "❌"), ("fail_run", "❌"),
    ("timeout", "❌"), ("oom", "❌"), ("eager_nondeterministic", "❌"), ("eager_fail", "❗"), ("unsupported", "➖"),
    ("skipped", "➖")])
def test_single_cell_symbol(row, status, symbol):
    mats = support_matrices([row("a", status)])
    for m in mats.values():
        assert m.shape == (1, 1) and m.iloc[0, 0] == symbol


def test_missing_combination_is_untested(row):
    rows = [row("a", "pass", model=M1, graph="piecewise"), row("b", "fail_run", model=M2, graph="full")]
    m = support_matrices(rows)["model_x_graph"]
    assert m.loc[M1, "piecewise"] == "✅" and m.loc[M2, "full"] == "❌"
    assert m.loc[M1, "full"] == "❓" and m.loc[M2, "piecewise"] == "❓"
    assert list(m.index) == sorted([M1, M2]) and list(m.columns) == ["full", "piecewise"]


def test_each_pair_pivots_on_its_axis(row):
    rows = [row("a", "pass", quant="none", attention="sdpa", parallel="tp1", graph="full"),
            row("b", "unsupported", quant="fp8", attention="flash", parallel="tp8", graph="breakable")]
    mats = support_matrices(rows)
    assert mats["model_x_quant"].loc[M1].to_dict() == {"fp8": "➖", "none": "✅"}
    assert mats["model_x_attention"].loc[M1].to_dict() == {"flash": "➖", "sdpa": "✅"}
    assert mats["model_x_parallel"].loc[M1].to_dict() == {"tp1": "✅", "tp8": "➖"}
    assert mats["model_x_graph"].loc[M1].to_dict() == {"breakable": "➖", "full": "✅"}


def test_natural_order_of_values(row):
    rows = [row(str(i), model=f"deepseek-v3:trim:{n}", parallel=f"tp{n}") for i, n in enumerate([16, 4, 8])]
    m = support_matrices(rows)["model_x_parallel"]
    assert list(m.index) == ["deepseek-v3:trim:4", "deepseek-v3:trim:8", "deepseek-v3:trim:16"]
    assert list(m.columns) == ["tp4", "tp8", "tp16"]


@pytest.mark.parametrize("statuses,symbol", [
    (["pass", "pass", "pass"], "✅"),
    (["pass", "pass_flaky", "fail_accuracy"], "❌"),  # any failing wins
    (["unsupported", "oom"], "❌"),
    (["pass", "pass_flaky"], "⚠"),  # else any flaky
    (["pass", "unsupported"], "✅"),  # a pass next to an unsupported sibling: the pair works
    (["pass", "eager_fail"], "✅"),
    (["eager_fail", "unsupported"], "❗"),
    (["unsupported", "skipped"], "➖"),
    ([], "❓"),
])
def test_aggregation_rules(statuses, symbol):
    assert aggregate_symbol(statuses) == symbol


def test_aggregation_across_other_axes(row):
    # One model × graph entry holds cells that differ in quant and attention.
    rows = [row("a", "pass", quant="none", graph="full"), row("b", "fail_accuracy", quant="fp8", graph="full"),
            row("c", "pass", quant="none", graph="piecewise"), row("d", "pass_flaky", attention="flash", graph="piecewise"),
            row("e", "unsupported", quant="fp8", graph="breakable"), row("f", "skipped", attention="flash", graph="breakable")]
    m = support_matrices(rows)["model_x_graph"]
    assert m.loc[M1].to_dict() == {"breakable": "➖", "full": "❌", "piecewise": "⚠"}



def test_another_engines_cells_are_rows_of_their_own(row):
    """SGLang's verdicts never mix with pcg's in an entry: a failing SGLang breakable cell leaves pcg's ✅."""
    rows = [row("a", "pass", graph="breakable"), row("b", "fail_capture", graph="breakable", engine="sglang")]
    m = support_matrices(rows)["model_x_graph"]
    assert m.loc[M1, "breakable"] == "✅" and m.loc[f"{M1} [sglang]", "breakable"] == "❌"
    from harness.reports.summary import summary_markdown

    graphs = summary_markdown(None, rows).split("### model × graph")[1]
    assert f"{M1} [sglang]" in graphs and "❌" in graphs and "✅" in graphs
