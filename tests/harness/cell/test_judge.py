"""The judge on hand-made outputs: each layer can fail."""

import pytest

from harness.cell.judge import LOGPROB_TOL, compare
from pcg_core.engine import SequenceOutput


def _seq(ids, lps, topk=None, prompt_lps=None):
    topk = topk or [[i, i + 1000] for i in ids]
    return SequenceOutput(prompt_ids=[1, 2], output_ids=list(ids), output_logprobs=list(lps), output_topk_ids=topk,
                          output_topk_logprobs=[[0.0, -1.0]] * len(ids), prompt_logprobs=prompt_lps or [-1.0],
                          prompt_topk_ids=[[1], [2]], prompt_topk_logprobs=[[0.0], [0.0]])


def test_identical_outputs_pass():
    ref = {"c": [_seq([5, 6, 7], [-0.1, -0.2, -0.3])]}
    v = compare(ref, {"c": [_seq([5, 6, 7], [-0.1, -0.2, -0.3])]}, LOGPROB_TOL["float32"])
    assert v.status == "pass" and v.token_match == 1.0 and v.max_output_logprob_diff == 0.0


def test_logprob_drift_fails_with_numbers():
    ref = {"c": [_seq([5, 6], [-0.1, -0.2])]}
    v = compare(ref, {"c": [_seq([5, 6], [-0.1, -0.25])]}, 1e-3)
    assert v.status == "fail_accuracy"
    assert "output logprob diff 0.05" in v.reason


def test_prompt_logprob_drift_fails():
    ref = {"c": [_seq([5], [-0.1], prompt_lps=[-1.0])]}
    v = compare(ref, {"c": [_seq([5], [-0.1], prompt_lps=[-1.5])]}, 1e-3)
    assert v.status == "fail_accuracy" and v.max_prompt_logprob_diff == 0.5


def test_near_tie_divergence_with_containment_passes():
    ref = {"c": [_seq([5, 6, 7], [-0.1, -0.2, -0.3], topk=[[5, 9], [6, 8], [7, 1]])]}
    cand = {"c": [_seq([5, 8, 1], [-0.1, -0.2, -9.0], topk=[[5, 9], [8, 6], [1, 2]])]}
    v = compare(ref, cand, 1e-3)
    assert v.status == "pass" and v.topk_containment_ok
    assert abs(v.token_match - 1 / 3) < 1e-9  # positions after the divergence are not compared
    assert "near-tie" in v.reason


def test_divergence_outside_topk_fails():
    ref = {"c": [_seq([5, 6], [-0.1, -0.2], topk=[[5, 9], [6, 8]])]}
    cand = {"c": [_seq([5, 77], [-0.1, -0.2], topk=[[5, 9], [77, 78]])]}
    v = compare(ref, cand, 1e-3)
    assert v.status == "fail_accuracy" and not v.topk_containment_ok


def test_eager_twice_is_bitwise():
    """run_cell's eager-twice check is equality of the outputs: one ulp of one logprob makes them differ."""
    a = [[_seq([5], [-0.1])]]
    assert a == [[_seq([5], [-0.1])]]
    assert a != [[_seq([5], [-0.1 + 1e-12])]]


@pytest.mark.parametrize("where", ["prompt", "output"])
def test_a_nan_logprob_fails_on_either_side(where):
    """max() drops a NaN; the judge must not: a NaN logprob in the graph run (or the eager one) fails."""
    nan = float("nan")
    good = _seq([5, 6], [-0.1, -0.2], prompt_lps=[-1.0])
    bad = _seq([5, 6], [-0.1, nan] if where == "output" else [-0.1, -0.2], prompt_lps=[nan] if where == "prompt" else [-1.0])
    for ref, cand in ((good, bad), (bad, good)):
        v = compare({"c": [ref]}, {"c": [cand]}, LOGPROB_TOL["bfloat16"])
        assert v.status == "fail_accuracy" and f"{where} logprob diff inf" in v.reason and "NaN" in v.reason, v
