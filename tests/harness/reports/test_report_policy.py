"""The nightly policy (harness/reports/policy.py) on hand-made nightlies: what fails the night, what is reported."""

from __future__ import annotations

import random

import pytest

from harness.reports.policy import Policy, judge_night, verdict_markdown
from tests.harness.reports.conftest import make_row


def _lat(ms: float, eager_ms: float = 10.0) -> dict:
    return {"latency_ms": {"8": {"eager": eager_ms, "graph": ms}, "512": {"eager": 4 * eager_ms, "graph": 2 * ms}}}


def _night(status: str = "pass", ms: float = 1.0, key: str = "a", **kw) -> list:
    return [make_row(key, status, metrics=_lat(ms, **kw)), make_row("b", "pass", metrics=_lat(1.0))]


def test_a_cell_that_passed_in_the_last_nightlies_and_fails_tonight_is_a_regression():
    v = judge_night(_night("fail_accuracy"), [_night(), _night(), _night()])
    assert v.failed and [r.key for r in v.regressions] == ["a"] and v.regressions[0].passed_in == 3
    assert "Regressions" in verdict_markdown(v) and "The night fails" in verdict_markdown(v)


@pytest.mark.parametrize("history", [
    [],  # a new cell failing: known, not a regression
    [_night("fail_accuracy")],  # failing before too
    [_night(), _night("timeout"), _night()],  # failed in one of the last three
])
def test_known_failures_do_not_fail_the_night(history):
    v = judge_night(_night("fail_accuracy"), history)
    assert not v.failed and v.known_failures == ["a"]


def test_only_the_last_keep_nightlies_count():
    history = [_night(), _night(), _night(), _night("fail_accuracy")]  # the failure is the 4th back
    assert judge_night(_night("oom"), history, Policy(keep=3)).regressions
    assert not judge_night(_night("oom"), history, Policy(keep=4)).regressions


@pytest.mark.parametrize("status", ["unsupported", "skipped", "eager_fail"])
def test_statuses_that_do_not_fail_a_run_are_no_regression(status):
    assert not judge_night(_night(status), [_night()] * 3).failed


def test_a_flaky_pass_is_recorded_and_does_not_fail():
    v = judge_night(_night("pass_flaky"), [_night()] * 3)
    assert v.flaky == ["a"] and not v.failed


def test_one_slow_night_does_not_fail_but_a_lasting_slowdown_does():
    steady = [_night(ms=1.0) for _ in range(5)]
    assert not judge_night(_night(ms=1.6), steady).slowdowns  # one noisy night: one value of a median of three
    v = judge_night(_night(ms=1.6), [_night(ms=1.6)] + steady)  # two nights of the newest three
    assert [s.key for s in v.slowdowns] == ["a"] and v.slowdowns[0].rel_change == pytest.approx(0.6)
    assert v.failed and "Slowdowns" in verdict_markdown(v)
    assert not judge_night(_night(ms=1.6), [_night(ms=1.6)] + steady, Policy(latency_threshold=1.0)).slowdowns


def test_eager_timing_noise_alone_never_fails_the_night():
    """The eager side swings 0.57–2.04× between runs on the H200; the graph side within ±10%."""
    rnd = random.Random(0)
    nights = [_night(ms=1.0 * rnd.uniform(0.9, 1.1), eager_ms=10.0 * rnd.uniform(0.57, 2.04)) for _ in range(8)]
    for i in range(3):
        assert not judge_night(nights[i], nights[i + 1:]).failed


def test_a_slowdown_needs_two_full_windows_of_passing_timed_nights():
    assert not judge_night(_night(ms=3.0), [_night(ms=3.0)] * 2 + [_night(ms=1.0)] * 2).slowdowns  # 5 < 6 nights
    history = [_night(ms=3.0), _night(ms=3.0), _night("fail_accuracy"), _night(), _night()]
    assert not judge_night(_night(ms=3.0), history).slowdowns


def test_the_policy_refuses_nonsense():
    with pytest.raises(ValueError):
        Policy(keep=0)
    with pytest.raises(ValueError):
        Policy(latency_threshold=-0.1)


def test_a_cell_stored_under_its_schemes_old_name_is_the_same_cell_tonight():
    """NVFP4 cells were keyed quant=fp4 before the scheme registry named it nvfp4: last nights' passes under the old
    key make tonight's failure under the new one a regression, and a slowdown is measured across the rename."""
    old, new = "model=m|quant=fp4|graph=full", "model=m|quant=nvfp4|graph=full"
    v = judge_night(_night("fail_accuracy", key=new), [_night(key=old)] * 3)
    assert [r.key for r in v.regressions] == [new]
    slow = judge_night(_night(ms=2.0, key=new), [_night(ms=2.0, key=new)] * 2 + [_night(ms=1.0, key=old)] * 3)
    assert [s.key for s in slow.slowdowns] == [new]
    other = judge_night(_night("fail_accuracy", key="model=m|quant=awq|graph=full"), [_night(key=old)] * 3)
    assert not other.regressions  # only an alias is the same cell
