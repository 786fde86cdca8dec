"""Where and with what a run ran: git sha, library versions, GPU, driver, host."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

import torch


REPO = Path(__file__).parents[2]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=30, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _cmd(args: list[str], cwd: Path = REPO) -> str | None:
    out = _run(args, cwd)
    return (out.stdout.strip() or None) if out is not None and out.returncode == 0 else None


def git_sha(repo: Path = REPO) -> str | None:
    """HEAD's sha, with `-dirty` when tracked files differ from it (or that cannot be checked): a run from an
    edited or copied tree must not pass for a run of the commit."""
    sha = _cmd(["git", "rev-parse", "HEAD"], repo)
    if sha is None:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], repo)
    clean = status is not None and status.returncode == 0 and not status.stdout.strip()
    return sha if clean else f"{sha}-dirty"


def provenance() -> dict[str, Any]:
    import transformers

    cuda = torch.cuda.is_available()
    return {
        "git_sha": git_sha(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "cuda_version": torch.version.cuda if cuda else None,
        "driver_version": _cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if cuda else None,
        "gpu_name": torch.cuda.get_device_name() if cuda else None,
        "host": socket.gethostname(),
    }
