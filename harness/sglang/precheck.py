"""Whether an SGLang cell can run here, before launch (the matrix pre-check and `pcgh cell` ask the same).

sglang pins its own torch and transformers, so it usually lives in an environment of its own: PCG_SGLANG_PYTHON
names that environment's interpreter (default: this one), which starts the servers (server.py's launch command).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

from harness.cell.spec import CellSpec
from harness.sglang.flags import SGLANG_VERSION, unsupported_reason

_FIND = "import importlib.util as u, sys; s = u.find_spec('sglang'); sys.exit(0 if s and s.origin else 1)"


def sglang_python() -> str:
    return os.environ.get("PCG_SGLANG_PYTHON") or sys.executable


@functools.lru_cache(maxsize=8)
def sglang_installed(python: str) -> bool:
    """Whether `python` imports the sglang package (a bare folder named sglang on a path is not it)."""
    try:
        return subprocess.run([python, "-c", _FIND], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def sglang_reason(spec: CellSpec, ranks: int, cuda_devices: int) -> str | None:
    """Why this SGLang cell cannot run here (None: it can): axes SGLang has no flags for, no CUDA GPU, sglang not
    installed, too few GPUs."""
    if why := unsupported_reason(spec):
        return why
    if not spec.device.startswith("cuda"):
        return f"an SGLang cell serves on a CUDA GPU (device {spec.device!r})"
    if not sglang_installed(python := sglang_python()):
        return (f"sglang is not installed for {python} (PCG_SGLANG_PYTHON names the python of an environment with "
                f"sglang=={SGLANG_VERSION})")
    if cuda_devices < ranks:
        return f"needs {ranks} GPU{'s' if ranks != 1 else ''} ({spec.parallel}, SGLang's ranks), {cuda_devices} visible"
    return None
