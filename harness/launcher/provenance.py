"""Where and with what a run ran: git sha, library versions, GPU, driver, host."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import torch


def _cmd(args: list[str]) -> str | None:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=10, cwd=Path(__file__).parents[2])
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def provenance() -> dict[str, Any]:
    import transformers

    cuda = torch.cuda.is_available()
    return {
        "git_sha": _cmd(["git", "rev-parse", "HEAD"]),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "cuda_version": torch.version.cuda if cuda else None,
        "driver_version": _cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if cuda else None,
        "gpu_name": torch.cuda.get_device_name() if cuda else None,
        "host": socket.gethostname(),
    }
