"""What the W4A16 kernel tests share for running Triton kernels on a CPU: whether Triton's interpreter is on, the
marker of the tests that need it, the relative error they compare by, and the child pytest that runs those tests
with TRITON_INTERPRET=1 (it must be set before the kernels are defined, so not in the parent process)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_TRITON = importlib.util.find_spec("triton") is not None
interpreted = pytest.mark.skipif(not (INTERPRET and HAS_TRITON), reason="needs Triton and TRITON_INTERPRET=1")


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative (Frobenius) error of got against want, in float32."""
    return float((got.float() - want.float()).norm() / want.float().norm())


def run_interpreted_tests(test_file: str) -> None:
    """The `interpreted` tests of test_file in a child pytest with TRITON_INTERPRET=1; skipped where it cannot run
    (no Triton, a GPU — test_quant_gpu.py runs the compiled kernels there — or inside the interpreter run)."""
    if INTERPRET or not HAS_TRITON or torch.cuda.is_available():
        pytest.skip("runs where Triton is installed and no GPU is (and not inside the interpreter run itself)")
    import numpy

    if tuple(int(p) for p in numpy.__version__.split(".")[:2]) >= (2, 4):
        pytest.skip("Triton 3.6's interpreter needs numpy < 2.4 (int() of a 1-element array)")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    root = Path(test_file).resolve().parents[2]
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(Path(test_file)),
                          "-k", "interpreted"], check=False, cwd=root, env=env, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "skipped" not in res.stdout.splitlines()[-1], res.stdout[-2000:]
