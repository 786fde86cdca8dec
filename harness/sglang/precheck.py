"""Whether an SGLang cell can run here, before launch (the matrix pre-check and `pcgh cell` ask the same)."""

from __future__ import annotations

import importlib.util

from harness.cell.spec import CellSpec
from harness.sglang.flags import SGLANG_VERSION, unsupported_reason

# Until the server side lands (two servers per cell, the /generate client, the replay proof, the judge's tolerance
# path: issue 44), a cell that passes every other check ends here, saying so.
NOT_RUN_YET = ("pcg maps this cell to sglang.launch_server flags (harness/sglang/flags.py) but does not start the "
               "two servers yet")


def sglang_reason(spec: CellSpec, ranks: int, cuda_devices: int) -> str | None:
    """Why this SGLang cell cannot run here (None: it can): axes SGLang has no flags for, no CUDA GPU, sglang not
    installed, too few GPUs."""
    if why := unsupported_reason(spec):
        return why
    if not spec.device.startswith("cuda"):
        return f"an SGLang cell serves on a CUDA GPU (device {spec.device!r})"
    found = importlib.util.find_spec("sglang")
    if found is None or found.origin is None:  # None: a bare folder named sglang on the path, not the package
        return f"sglang is not installed where the cells run (pip install 'sglang=={SGLANG_VERSION}')"
    if cuda_devices < ranks:
        return f"needs {ranks} GPU{'s' if ranks != 1 else ''} ({spec.parallel}, SGLang's ranks), {cuda_devices} visible"
    return NOT_RUN_YET
