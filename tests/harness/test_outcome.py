"""The cell outcome type: the model grammar, JSON round trips, record validation, rows older versions wrote."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from harness.metrics import CellMetrics
from harness.outcome import AXES, AXIS_DEFAULTS, NOT_COUNTED, PASSING, STATUSES, CellOutcome, CellRecord, ModelRef, Status, cell_key

AXES_OK = {"model": "qwen3-0.6b:tiny", "quant": "none", "attention": "sdpa", "parallel": "tp1", "graph": "full",
           "compiler": "eager"}


@pytest.mark.parametrize("text,card,variant,layers,tiny,weights", [
    ("qwen3-0.6b:tiny", "qwen3-0.6b", "tiny", None, True, "synthetic"),
    ("deepseek-v3:trim:4", "deepseek-v3", "trim:4", 4, False, "synthetic"),
    ("llama-3.1-8b:full", "llama-3.1-8b", "full", None, False, "real"),
])
def test_model_ref_parses_the_variants(text, card, variant, layers, tiny, weights):
    m = ModelRef.parse(text)
    assert (m.card, m.variant, m.layers, m.tiny, m.weights) == (card, variant, layers, tiny, weights)
    assert str(m) == text


@pytest.mark.parametrize("text", ["qwen3-0.6b", "qwen3-0.6b:huge", ":tiny", "x:trim:0", "x:trim:", "x:trim:4b", "x:TINY"])
def test_model_ref_rejects_bad_grammar_naming_it(text):
    with pytest.raises(ValueError, match="CARD:VARIANT"):
        ModelRef.parse(text)


def test_status_vocabulary():
    assert STATUSES == ("pass", "pass_flaky", "fail_accuracy", "fail_capture", "fail_run", "timeout", "oom",
                        "eager_fail", "eager_nondeterministic", "unsupported", "skipped")
    assert PASSING == ("pass", "pass_flaky") and NOT_COUNTED == ("eager_fail", "unsupported", "skipped")
    assert Status("oom") == "oom" and json.dumps({"s": Status.OOM}) == '{"s": "oom"}'


def test_outcome_json_round_trip_keeps_nan_and_token_counts():
    o = CellOutcome(status="fail_accuracy", reason="r", duration_s=1.5,
                    metrics=CellMetrics(token_match=0.5, max_prompt_kl=math.nan, latency_ms={8: {"eager": 3.0, "graph": 1.0}},
                                        speedup={8: 3.0}, bucket_hits={16: 2}))
    back = CellOutcome.from_json(o.to_json())
    assert back.status is Status.FAIL_ACCURACY and back.metrics.latency.latency_ms[8].graph == 1.0
    assert back.metrics.latency.speedup == {8: 3.0} and back.metrics.capture.bucket_hits == {16: 2}
    assert math.isnan(back.metrics.judge.max_prompt_kl)
    assert back.metrics.judge.token_match == 0.5 and back.metrics.capture.capture_s is None  # not measured stays None


def test_unmeasured_is_none_not_zero():
    m = CellMetrics()
    assert m.judge.token_match is None and m.capture.pieces is None and m.latency.speedup == {} and m.latency.graph_latencies() == {}


def test_record_needs_every_axis_and_a_known_status():
    with pytest.raises(ValidationError, match="axes must have exactly"):
        CellRecord(key="k", axes={"model": "m:tiny"}, status="pass")
    with pytest.raises(ValidationError):
        CellRecord(key="k", axes=AXES_OK, status="passed")
    with pytest.raises(ValidationError):
        CellRecord(key="k", axes=AXES_OK, status="pass", attempt=0)
    with pytest.raises(ValidationError):
        CellRecord(key="", axes=AXES_OK, status="pass")
    with pytest.raises(ValidationError):  # a record has no free-form keys: a typo is an error, not a lost value
        CellRecord(key="k", axes=AXES_OK, status="pass", atempt=2)
    r = CellRecord.of(cell_key(AXES_OK), AXES_OK, CellOutcome(status="pass"), attempt=2, log="x")
    assert r.attempt == 2 and r.model.card == "qwen3-0.6b" and r.passed
    assert r.key == "|".join(f"{a}={AXES_OK[a]}" for a in AXES if a not in AXIS_DEFAULTS)  # the key from before those axes
    assert r.axes["kv_cache"] == "auto"  # a record without the axis (stored before it) reads as its default


def test_odd_stored_metrics_lose_the_odd_values_not_the_row():
    """An upload before the type existed could store any JSON as metrics: reading drops what does not fit."""
    row = {"key": "k", "axes": AXES_OK, "status": "pass", "attempt": 1,
           "metrics": {"speedup": 2.5, "graph_pool_bytes": "big", "latency_ms": {"8": 3.0}, "token_match": 1.0,
                       "capture_s": 0.5}}
    r = CellRecord.read(row)
    assert r.metrics.judge.token_match == 1.0 and r.metrics.capture.capture_s == 0.5
    assert r.metrics.latency.speedup == {} and r.metrics.capture.graph_pool_bytes is None and r.metrics.latency.latency_ms == {}
    assert CellRecord.read({**row, "metrics": ["not", "a", "dict"]}).metrics == CellMetrics()
    with pytest.raises(ValidationError):  # strict about everything else: a bad status is no record
        CellRecord.read({**row, "status": "passed"})


def test_metrics_written_by_the_old_untyped_cell_still_read():
    """A metrics dict as run_cell wrote it before the type existed: run settings mixed in, token counts as str keys."""
    old = {"model": "qwen3-0.6b", "graph": "piecewise", "attention": "sdpa", "compiler": "eager", "device": "cuda",
           "dtype": "bfloat16", "layers": 28, "tiny": False, "weights": "synthetic", "max_tokens": 4096, "max_new_tokens": 8,
           "pieces": 29, "graphs_captured": 2000, "trace_s": 7.3, "capture_s": 5.9, "compile_s": 0.0,
           "graph_pool_bytes": 218103808, "token_match": 1.0, "max_prompt_logprob_diff": 0.03,
           "max_output_logprob_diff": 0.02, "topk_containment_ok": True, "latency_ms": {"8": {"eager": 31.0, "graph": 5.0}},
           "speedup": {"8": 6.2}, "eager_fallbacks": 1, "bucket_hits": {"8": 3}, "divergences": [],
           "eager_bitwise_deterministic": True, "max_prompt_kl": 1e-4, "duration_s": 40.1}
    m = CellMetrics.model_validate(old)
    assert m.latency.speedup == {8: 6.2} and m.latency.latency_ms[8].eager == 31.0 and m.capture.graph_pool_bytes == 218103808
    assert m.settings.device == "cuda" and m.settings.layers == 28 and m.capture.bucket_hits == {8: 3}
    assert m.process.cell_s == 40.1  # the old metrics' duration_s: run_cell's own time


@pytest.mark.parametrize("axis,default,other", [("kv_cache", "auto", "fp8_e4m3"), ("engine", "pcg", "sglang")])
def test_an_axis_added_later_keeps_the_keys_and_records_stored_before_it(axis, default, other):
    """A cell at the axis's default keeps the key it had before the axis; other values add it; an old row reads as
    the default."""
    old = {a: AXES_OK[a] for a in AXES_OK if a not in AXIS_DEFAULTS}
    assert cell_key({**old, axis: default}) == cell_key(old) and f"{axis}=" not in cell_key(old)
    assert cell_key({**old, axis: other}).endswith(f"|{axis}={other}")
    row = {"key": cell_key(old), "axes": old, "status": "pass", "attempt": 1, "metrics": {}}
    assert CellRecord.read(row).axes[axis] == default


def test_a_record_of_an_old_row_has_every_axis_and_no_other():
    old = {a: AXES_OK[a] for a in AXES_OK if a not in AXIS_DEFAULTS}
    row = {"key": cell_key(old), "axes": old, "status": "pass", "attempt": 1, "metrics": {}}
    assert CellRecord.read(row).axes == {**old, **AXIS_DEFAULTS}
    with pytest.raises(ValidationError, match="axes must have exactly"):
        CellRecord(key="k", axes={**old, **AXIS_DEFAULTS, "kv": "x"}, status="pass")
