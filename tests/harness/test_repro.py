"""The repro command of a cell: every command it makes is one `pcgh cell` accepts, with the cell's settings."""

from __future__ import annotations

import shlex

import pytest

from harness.cli import build_parser
from harness.outcome import CellMetrics
from harness.repro import repro_command

AXES = {"quant": "none", "attention": "sdpa", "parallel": "tp1", "graph": "breakable", "compiler": "eager"}


@pytest.mark.parametrize("model,expect", [
    ("qwen3-0.6b:tiny", {"tiny": True, "layers": None, "weights": "auto"}),
    ("qwen3-30b-a3b:trim:4", {"tiny": False, "layers": 4, "weights": "auto"}),
    ("qwen3-8b:full", {"tiny": False, "layers": None, "weights": "real"}),
])
def test_repro_parses_with_pcgh_and_keeps_the_settings(model, expect):
    cmd = repro_command({**AXES, "model": model}, CellMetrics(device="cuda", dtype="bfloat16", max_tokens=512))
    argv = shlex.split(cmd)
    assert argv[:2] == ["pcgh", "cell"]
    args = build_parser().parse_args(argv[1:])
    assert args.model == model.split(":")[0] and args.graph == "breakable" and args.attention == "sdpa"
    assert (args.device, args.dtype, args.max_tokens) == ("cuda", "bfloat16", 512)
    assert {k: getattr(args, k) for k in expect} == expect


def test_repro_of_a_dead_cell_takes_settings_from_its_other_runs():
    cmd = repro_command({**AXES, "model": "qwen3-0.6b:tiny"}, CellMetrics(), [CellMetrics(), CellMetrics(device="cuda")])
    args = build_parser().parse_args(shlex.split(cmd)[1:])
    assert args.device == "cuda" and args.dtype is None and args.max_tokens == 4096  # the rest: pcgh's defaults


def test_repro_is_exact_and_quotes_what_the_shell_would_split():
    axes = {**AXES, "model": "my model:trim:2", "graph": "piecewise"}
    cmd = repro_command(axes, CellMetrics(device="cpu", dtype="float32"), [CellMetrics(max_tokens=64), CellMetrics(max_tokens=32)])
    assert cmd == ("pcgh cell --model 'my model' --layers 2 --graph piecewise --attention sdpa --compiler eager "
                   "--device cpu --dtype float32 --max-tokens 64")  # the first fallback that has it wins
