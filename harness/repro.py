"""The `pcgh cell` command that reruns one cell of a matrix, from its axes and the settings it recorded.

Every axis is written out, defaults too (`--quant none --parallel tp1 …`), so the command says which cell it is;
each axis has the `pcgh cell` flag of the same name, and a scheme or mode the runtime lacks ends that cell as
`unsupported` instead of quietly running the default one. The run settings (device, dtype, token limits, seed,
top-k, logprob tolerance, memory share) come from the cell's CellMetrics, which run_cell fills before anything can fail.

It lives beside the outcome (not in the command line, which imports the runtime) so the dashboard can print it
without torch; tests/harness/test_repro.py parses the commands it makes with pcgh's own parser and checks that
they rebuild the matrix's CellSpec, so the two cannot drift apart.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from harness.metrics import CellMetrics
from harness.outcome import AXES, ModelRef, with_default_axes

# `pcgh cell` flag → the CellMetrics field that recorded its value.
SETTINGS = (("--device", "device"), ("--dtype", "dtype"), ("--max-tokens", "max_tokens"),
            ("--max-new-tokens", "max_new_tokens"), ("--seed", "seed"), ("--top-k", "top_k"),
            ("--logprob-tol", "logprob_tol"), ("--memory-share", "memory_share"))


def repro_command(axes: dict[str, str], metrics: CellMetrics, fallbacks: Iterable[CellMetrics] = ()) -> str:
    """The command for this cell. A cell that died before reporting has no settings: each then comes from the
    first of `fallbacks` (the same cell's other runs) that recorded it, else it is left to pcgh's default."""
    axes = with_default_axes(axes)  # a cell stored before an axis existed ran at its default
    model = ModelRef.parse(axes["model"])
    args = ["pcgh", "cell", "--model", model.card]
    if model.tiny:
        args.append("--tiny")
    elif model.layers is not None:
        args += ["--layers", str(model.layers)]
    args += ["--weights", model.weights]
    for axis in AXES:
        if axis != "model":
            args += [f"--{axis.replace('_', '-')}", axes[axis]]
    sources = [metrics, *fallbacks]
    if metrics.settings.peaked is False:
        args.append("--flat-weights")
    for flag, name in SETTINGS:
        value = next((m.value(name) for m in sources if m.value(name) not in (None, "")), None)
        if value is not None:
            args += [flag, str(value)]
    return shlex.join(args)
