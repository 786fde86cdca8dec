"""The judge on hand-made outputs: each layer can fail."""

import pytest

from harness.cell.judge.tokens import compare
from harness.cell.judge.tolerances import LOGPROB_TOL, logprob_bound, same_padding_rtol, tie_margin
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


def _seq_lp(ids, topk, topk_lps):
    """A sequence whose top-k lists carry their own logprobs (the chosen token's is its top-k entry)."""
    lps = [dict(zip(k, v))[i] for i, k, v in zip(ids, topk, topk_lps)]
    return SequenceOutput(prompt_ids=[1, 2], output_ids=list(ids), output_logprobs=lps, output_topk_ids=topk,
                          output_topk_logprobs=topk_lps, prompt_logprobs=[-1.0], prompt_topk_ids=[[1], [2]],
                          prompt_topk_logprobs=[[0.0], [0.0]])


def test_a_flip_within_the_noise_on_both_sides_passes_and_names_the_margins():
    ref = {"c": [_seq_lp([5, 6, 7], [[5, 9], [6, 8], [7, 1]], [[-0.1, -2], [-0.7000, -0.7004], [-0.3, -3]])]}
    cand = {"c": [_seq_lp([5, 8, 1], [[5, 9], [8, 6], [1, 2]], [[-0.1, -2], [-0.7001, -0.7003], [-0.1, -3]])]}
    v = compare(ref, cand, 1e-3)
    assert v.status == "pass" and v.topk_containment_ok
    assert abs(v.token_match - 1 / 3) < 1e-9  # positions after the divergence are not compared
    assert "near-tie" in v.reason and "eager's top-2 margin 0.0004" in v.reason and "noise 0.001" in v.reason


def test_a_contained_flip_beyond_the_noise_fails():
    """Planted (class: near-tie excuse): the graph's token is in eager's top-k and eager's in the graph's, but
    eager preferred its token by 0.5 nats. The old rule (top-k containment) passed this; it is a real bug."""
    ref = {"c": [_seq_lp([5, 6], [[5, 9], [6, 8]], [[-0.1, -2], [-0.4, -0.9]])]}
    cand = {"c": [_seq_lp([5, 8], [[5, 9], [8, 6]], [[-0.1, -2], [-0.4, -0.9]])]}
    v = compare(ref, cand, 1e-3)
    assert v.status == "fail_accuracy" and v.topk_containment_ok  # contained, and still a failure
    assert "beyond the noise: eager's top-2 margin 0.5" in v.reason


def test_a_flip_eager_calls_a_tie_but_the_graph_does_not_fails():
    ref = {"c": [_seq_lp([6], [[6, 8]], [[-0.6930, -0.6932]])]}
    cand = {"c": [_seq_lp([8], [[8, 6]], [[-0.2, -2.0]])]}  # the graph is sure of the other token
    v = compare(ref, cand, 1e-3)
    assert v.status == "fail_accuracy" and "the graph's 1.8" in v.reason


def test_the_noise_bound_widens_with_eager_self_noise_only():
    assert tie_margin(1e-3) == 1e-3 and tie_margin(1e-3, 1e-2) == 1e-2 and tie_margin(1e-3, 1e-5) == 1e-3
    assert tie_margin(1e-3, float("nan")) == 1e-3
    ref = {"c": [_seq_lp([6], [[6, 8]], [[-0.69, -0.70]])]}
    cand = {"c": [_seq_lp([8], [[8, 6]], [[-0.69, -0.70]])]}
    assert compare(ref, cand, 1e-3).status == "fail_accuracy"
    assert compare(ref, cand, 1e-3, tie_margin(1e-3, 0.011)).status == "pass"  # eager itself moves by 0.011


def test_fewer_output_tokens_fail():
    ref = {"c": [_seq([5, 6, 7], [-0.1, -0.2, -0.3])]}
    v = compare(ref, {"c": [_seq([5, 6], [-0.1, -0.2])]}, 1e-3)
    assert v.status == "fail_accuracy" and "2 output tokens for eager's 3" in v.reason


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


def test_the_same_padding_bound_is_tight_for_the_eager_compiler_and_widens_only_with_measured_noise():
    assert same_padding_rtol("bfloat16", "eager") == 1e-3 and same_padding_rtol("float32", "eager") == 1e-4
    assert same_padding_rtol("bfloat16", "inductor") == 2e-2  # compiled pieces fuse: compiler-level noise
    assert same_padding_rtol("bfloat16", "eager", 4e-3) == 8e-3  # eager itself moved by 4e-3 at one padding
    assert same_padding_rtol("bfloat16", "eager", float("nan")) == 1e-3


def test_the_logprob_bound_widens_to_measured_padding_noise_only():
    assert logprob_bound(0.1) == 0.1 and logprob_bound(0.1, 0.05) == 0.1
    assert logprob_bound(0.1, 0.24) == 0.24  # eager padded vs unpadded moved a logprob by 0.24: not the graph's
    assert logprob_bound(0.1, float("nan")) == 0.1


def test_the_failing_cases_are_named():
    good, drift = _seq([5, 6], [-0.1, -0.2]), _seq([5, 6], [-0.1, -0.5])
    v = compare({"a": [good], "b": [good], "c": [good]}, {"a": [good], "b": [drift], "c": [good]}, 1e-3)
    assert v.status == "fail_accuracy" and v.failed_cases == ["b"]
