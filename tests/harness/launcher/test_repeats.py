"""--repeats: a cell run in N fresh processes is as good as its worst run, and says how each ended."""

from harness.launcher.process import cpu_threads, merge_repeats
from harness.metrics import CellMetrics
from harness.outcome import CellOutcome


def _o(status, reason="", d=1.0, **m):
    return CellOutcome(status=status, reason=reason, metrics=CellMetrics(**m), duration_s=d)


def test_all_passing_repeats_pass_and_count():
    merged = merge_repeats([_o("pass", token_match=1.0), _o("pass", token_match=0.9), _o("pass")])
    assert merged.status == "pass" and merged.metrics.judge.token_match == 1.0  # the first run's metrics
    assert merged.metrics.process.repeats == 3 and merged.metrics.process.repeat_statuses == ["pass"] * 3 and merged.duration_s == 3.0


def test_one_failing_process_of_three_fails_the_cell_with_its_metrics():
    merged = merge_repeats([_o("pass"), _o("fail_accuracy", "output logprob diff 1.1", token_match=0.4), _o("pass")])
    assert merged.status == "fail_accuracy" and merged.metrics.judge.token_match == 0.4
    assert merged.reason == "failed in 1 of 3 fresh processes: output logprob diff 1.1"
    assert merged.metrics.process.repeat_statuses == ["pass", "fail_accuracy", "pass"]


def test_every_process_failing_keeps_the_first_failure_as_it_is():
    merged = merge_repeats([_o("fail_run", "boom"), _o("timeout", "slow")])
    assert merged.status == "fail_run" and merged.reason == "boom"


def test_cpu_workers_share_the_cores():
    assert cpu_threads(1) >= 1 and cpu_threads(10**6) == 1
