"""The `pcgh cell` command that reruns one cell of a matrix, from its axes and the settings it recorded.

It lives beside the outcome (not in the command line, which imports the runtime) so the dashboard can print it
without torch; tests/harness/test_repro.py parses every command it makes with pcgh's own parser, so the two
cannot drift apart.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from harness.outcome import CellMetrics, ModelRef


def repro_command(axes: dict[str, str], metrics: CellMetrics, fallbacks: Iterable[CellMetrics] = ()) -> str:
    """The command for this cell. A cell that died before reporting has no settings: device, dtype and max tokens
    then come from the first of `fallbacks` (the same cell's other runs) that has them, else pcgh's defaults."""
    model = ModelRef.parse(axes["model"])
    args = ["pcgh", "cell", "--model", model.card]
    if model.tiny:
        args.append("--tiny")
    elif model.layers is not None:
        args += ["--layers", str(model.layers)]
    elif model.weights == "real":
        args += ["--weights", "real"]
    for flag, axis in (("--graph", "graph"), ("--attention", "attention"), ("--compiler", "compiler")):
        if axes.get(axis):
            args += [flag, axes[axis]]
    sources = [metrics, *fallbacks]
    for flag, name in (("--device", "device"), ("--dtype", "dtype"), ("--max-tokens", "max_tokens")):
        value = next((getattr(m, name) for m in sources if getattr(m, name) not in (None, "")), None)
        if value is not None:
            args += [flag, str(value)]
    return shlex.join(args)
