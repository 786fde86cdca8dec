"""The repro command of a cell: every command it makes is one `pcgh cell` accepts, and it reruns the very cell the
matrix ran — every axis and every setting the matrix gives a cell."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from harness.cell.run import recorded_settings
from harness.cell.spec import CellSpec
from harness.cli import build_parser, spec_from_args
from harness.matrix import Cell, Matrix, expand
from harness.metrics import CellMetrics
from harness.outcome import AXES, CellRecord
from harness.repro import repro_command
from pcg_core.attention.sdpa import SdpaBackend
from pcg_core.registry import ATTENTION_BACKENDS

AXES_AT_DEFAULTS = {"quant": "none", "attention": "sdpa", "parallel": "tp1", "graph": "breakable", "compiler": "eager"}


class _SecondAttention(SdpaBackend):
    name = "pcg-test-attention"


@pytest.fixture
def second_attention(monkeypatch) -> str:
    """A second attention backend (the runtime ships one), so the attention axis can leave its default and still
    be a value `pcgh cell --attention` accepts."""
    monkeypatch.setitem(ATTENTION_BACKENDS._classes, _SecondAttention.name, _SecondAttention)
    return _SecondAttention.name


def _every_value_off_default(attention: str) -> Matrix:
    """Each axis takes a non-default value in some cell, and every setting a matrix gives a cell is off
    CellSpec's default (per model too, through an override); quant fp8 and tp2 the runtime lacks, which is the
    point: the command must still name them."""
    return Matrix.model_validate({
        "name": "repro",
        "defaults": {"device": "cuda", "dtype": "float16", "seed": 7, "top_k": 3, "max_tokens": 256, "max_new_tokens": 5,
                     "tolerances": {"logprob": 0.002}, "flat_weights": True, "memory_share": 0.25},
        "axes": {"model": ["qwen3-0.6b:tiny", "qwen3-8b:trim:2", "qwen3-8b:full"], "quant": ["none", "fp8"],
                 "attention": ["sdpa", attention], "parallel": ["tp1", "tp2"], "graph": ["piecewise", "breakable", "full"],
                 "compiler": ["eager", "inductor"], "kv_cache": ["auto", "fp8_e4m3"], "engine": ["pcg", "sglang"]},
        "overrides": {"qwen3-8b:*": {"tolerances": {"logprob": 0.25}, "max_tokens": 128, "max_new_tokens": 3,
                                     "dtype": "bfloat16"}},
    })


def _all_defaults() -> Matrix:
    """Nothing set: dtype from the device, no tolerance (the judge's per-dtype default)."""
    return Matrix.model_validate({"name": "plain", "axes": {"model": ["qwen3-0.6b:tiny"]}})


def _rerun_spec(cell: Cell) -> CellSpec:
    """The CellSpec `pcgh cell` builds from the cell's repro command, with the metrics as the store returns them."""
    stored = CellMetrics.model_validate_json(recorded_settings(cell.spec).model_dump_json())
    argv = shlex.split(repro_command(cell.axes, stored))
    assert argv[:2] == ["pcgh", "cell"]
    return spec_from_args(build_parser().parse_args(argv[1:]))


def test_the_matrix_moves_every_axis_and_setting_off_its_default(second_attention):
    """Guards the round trip below: a flag the command dropped would rebuild the default and still compare equal
    if no cell left that default."""
    cells = expand(_every_value_off_default(second_attention))
    default = CellSpec(model="-")
    for f in dataclasses.fields(CellSpec):
        if f.name != "latency_repeat":  # the one field no matrix sets
            assert any(getattr(c.spec, f.name) != getattr(default, f.name) for c in cells), f.name
    assert all(len({c.axes[a] for c in cells}) > 1 for a in AXES)
    assert {c.axes["model"].split(":", 1)[1] for c in cells} == {"tiny", "trim:2", "full"}


@pytest.mark.parametrize("matrix", ["every_value_off_default", "all_defaults"])
def test_repro_rebuilds_the_cellspec_the_matrix_ran(matrix, second_attention):
    m = _every_value_off_default(second_attention) if matrix == "every_value_off_default" else _all_defaults()
    for cell in expand(m):
        assert _rerun_spec(cell) == cell.spec, cell.key


@pytest.mark.parametrize("model,expect", [
    ("qwen3-0.6b:tiny", {"tiny": True, "layers": None, "weights": "synthetic"}),
    ("qwen3-30b-a3b:trim:4", {"tiny": False, "layers": 4, "weights": "synthetic"}),
    ("qwen3-8b:full", {"tiny": False, "layers": None, "weights": "real"}),
])
def test_repro_parses_with_pcgh_and_keeps_the_settings(model, expect):
    axes = {**AXES_AT_DEFAULTS, "model": model, "quant": "fp8", "parallel": "tp2"}
    metrics = CellMetrics(device="cuda", dtype="bfloat16", max_tokens=512, max_new_tokens=4, seed=3, top_k=2, logprob_tol=0.5)
    args = build_parser().parse_args(shlex.split(repro_command(axes, metrics))[1:])
    assert args.model == model.split(":")[0] and args.graph == "breakable" and args.attention == "sdpa"
    assert (args.quant, args.parallel, args.compiler) == ("fp8", "tp2", "eager")
    assert (args.device, args.dtype, args.max_tokens, args.max_new_tokens) == ("cuda", "bfloat16", 512, 4)
    assert (args.seed, args.top_k, args.logprob_tol) == (3, 2, 0.5)
    assert {k: getattr(args, k) for k in expect} == expect


def test_repro_of_a_dead_cell_takes_settings_from_its_other_runs():
    cmd = repro_command({**AXES_AT_DEFAULTS, "model": "qwen3-0.6b:tiny"}, CellMetrics(),
                        [CellMetrics(), CellMetrics(device="cuda", seed=0)])
    args = build_parser().parse_args(shlex.split(cmd)[1:])
    assert args.device == "cuda" and args.seed == 0  # a recorded 0 is a value, not "unrecorded"
    assert args.dtype is None and args.max_tokens is None and args.logprob_tol is None  # the rest: pcgh's defaults
    from harness.cli.cell import spec_from_args

    assert spec_from_args(args).max_tokens == 4096  # on cuda (a CPU cell's default ladder stops at 64)


def test_metrics_stored_before_the_newer_settings_still_read_and_repro():
    row = {"key": "k", "axes": {**AXES_AT_DEFAULTS, "model": "qwen3-0.6b:tiny"}, "status": "pass",
           "metrics": {"device": "cpu", "dtype": "float32", "max_tokens": 64, "max_new_tokens": 8, "pieces": 3}}
    record = CellRecord.read(row)
    m = record.metrics
    assert (m.settings.seed, m.settings.top_k, m.settings.logprob_tol, m.capture.pieces) == (None, None, None, 3)
    cmd = repro_command(record.axes, m)
    assert cmd.endswith("--device cpu --dtype float32 --max-tokens 64 --max-new-tokens 8")


def test_repro_is_exact_and_quotes_what_the_shell_would_split():
    axes = {**AXES_AT_DEFAULTS, "model": "my model:trim:2", "graph": "piecewise"}
    cmd = repro_command(axes, CellMetrics(device="cpu", dtype="float32", seed=0, logprob_tol=0.001),
                        [CellMetrics(max_tokens=64, top_k=5), CellMetrics(max_tokens=32, max_new_tokens=8)])
    assert cmd == ("pcgh cell --model 'my model' --layers 2 --weights synthetic --quant none --attention sdpa "
                   "--parallel tp1 --graph piecewise --compiler eager --kv-cache auto --engine pcg --device cpu --dtype float32 --max-tokens 64 "
                   "--max-new-tokens 8 --seed 0 --top-k 5 --logprob-tol 0.001")  # the first fallback that has it wins
